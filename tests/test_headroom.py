"""The headroom rules (cgwatch/headroom.py) as tables: rows from shapes seen on real machines,
every expected value worked out by hand in the row's comment."""

from __future__ import annotations

from typing import NamedTuple, Optional

import pytest

from cgwatch.headroom import binding_levels, headroom, throttle_headroom

MiB = 1 << 20
GiB = 1 << 30


class Room(NamedTuple):
    limit: int
    usage: int
    inactive_file: int
    want: int


ROOMS = [
    # 512 MiB limit, 300 MiB charged of which 100 MiB inactive page cache: 512 - 200 = 312.
    pytest.param(Room(512 * MiB, 300 * MiB, 100 * MiB, 312 * MiB), id="page-cache-left-out"),
    # Nothing reclaimable: 512 - 300 = 212.
    pytest.param(Room(512 * MiB, 300 * MiB, 0, 212 * MiB), id="no-inactive-file"),
    # A fresh cgroup: nothing charged, the whole limit.
    pytest.param(Room(64 * MiB, 0, 0, 64 * MiB), id="empty-cgroup"),
    # inactive_file above usage (two reads of two files, and usage moves between them): the
    # working set is 0, not negative, so the headroom is the limit, never more.
    pytest.param(Room(64 * MiB, 10 * MiB, 12 * MiB, 64 * MiB), id="inactive-above-usage"),
    # usage == inactive_file: working set 0.
    pytest.param(Room(64 * MiB, 8 * MiB, 8 * MiB, 64 * MiB), id="all-reclaimable"),
    # v1 lets usage overshoot the limit briefly: 100 MiB limit, 101 MiB working set: -1 MiB
    # (levels() shows it; available_memory() floors the answer at 0).
    pytest.param(Room(100 * MiB, 101 * MiB, 0, -MiB), id="v1-overshoot-negative"),
    # Above v2 memory.high (throttled, not killed): high 1 GiB, working set 1.5 GiB: -512 MiB.
    pytest.param(Room(GiB, 2 * GiB, 512 * MiB, -512 * MiB), id="above-memory-high"),
    # A limit near the v1 "unlimited" value stays exact (Python ints): 2**62 - (8192 - 4096).
    pytest.param(Room(1 << 62, 8192, 4096, (1 << 62) - 4096), id="huge-limit-exact"),
]


@pytest.mark.parametrize("row", ROOMS)
def test_headroom(row: Room) -> None:
    assert headroom(row.limit, row.usage, row.inactive_file) == row.want


class Throttle(NamedTuple):
    high_headrooms: list[Optional[int]]
    want: Optional[int]


THROTTLE = [
    # No level has memory.high (v1, or v2 with high "max"): None.
    pytest.param(Throttle([None, None], None), id="no-high"),
    pytest.param(Throttle([], None), id="no-levels"),
    # One level with high: its headroom.
    pytest.param(Throttle([None, 300 * MiB, None], 300 * MiB), id="one-level"),
    # The least of several: 200 MiB.
    pytest.param(Throttle([500 * MiB, 200 * MiB], 200 * MiB), id="least-wins"),
    # A level already above its high: floored at 0, not -10 MiB.
    pytest.param(Throttle([300 * MiB, -10 * MiB], 0), id="above-high-floored"),
    # Exactly at high: 0.
    pytest.param(Throttle([0], 0), id="at-high"),
]


@pytest.mark.parametrize("row", THROTTLE)
def test_throttle_headroom(row: Throttle) -> None:
    assert throttle_headroom(row.high_headrooms) == row.want


class Binding(NamedTuple):
    limits: list[Optional[int]]  # leaf first
    headrooms: list[Optional[int]]
    host_total: int
    host_available: Optional[int]
    want: tuple[Optional[int], Optional[int]]  # (binds total, binds available) level index


BINDING = [
    # A pod (leaf, 2 GiB, 1.5 GiB left) under an unlimited node: the leaf binds both.
    pytest.param(Binding([2 * GiB, None], [int(1.5 * GiB), None], 16 * GiB, 10 * GiB, (0, 0)),
                 id="leaf-binds-both"),
    # Kubernetes: container 4 GiB (3 GiB left) in a pod of 3 GiB (1 GiB left): the pod
    # (index 1) binds both.
    pytest.param(Binding([4 * GiB, 3 * GiB, None], [3 * GiB, GiB, None], 64 * GiB, 50 * GiB,
                         (1, 1)), id="parent-binds-both"),
    # The limit and the headroom bind at different levels: leaf 1 GiB with 900 MiB left,
    # parent 8 GiB with 500 MiB left (siblings use it): total at 0, available at 1.
    pytest.param(Binding([GiB, 8 * GiB], [900 * MiB, 500 * MiB], 64 * GiB, 32 * GiB, (0, 1)),
                 id="split-binding"),
    # A limit above MemTotal (a 32 GiB limit on a 16 GiB host): the host binds total; the
    # headroom (31 GiB) is above MemAvailable (12 GiB): the host binds available too.
    pytest.param(Binding([32 * GiB], [31 * GiB], 16 * GiB, 12 * GiB, (None, None)),
                 id="host-binds-both"),
    # A tie with MemTotal marks the level (it binds as much).
    pytest.param(Binding([16 * GiB], [15 * GiB], 16 * GiB, 15 * GiB, (0, 0)),
                 id="tie-with-host-marks-the-level"),
    # MemAvailable 1 byte below the headroom: the host binds available, the level total.
    pytest.param(Binding([GiB], [512 * MiB], 16 * GiB, 512 * MiB - 1, (0, None)),
                 id="host-available-just-below"),
    # MemAvailable unreadable (None): the level's mark stands.
    pytest.param(Binding([GiB], [512 * MiB], 16 * GiB, None, (0, 0)),
                 id="host-available-unknown"),
    # Two levels with equal limits and equal headroom: only the first (deepest) is marked.
    pytest.param(Binding([GiB, GiB], [100 * MiB, 100 * MiB], 16 * GiB, 8 * GiB, (0, 0)),
                 id="equal-levels-deepest-marked"),
    # A limited level whose usage could not be read (headroom None) above a leaf with room:
    # its limit (512 MiB) still binds total; the leaf's headroom binds available.
    pytest.param(Binding([GiB, 512 * MiB], [800 * MiB, None], 16 * GiB, 8 * GiB, (1, 0)),
                 id="unreadable-usage-keeps-limit"),
    # No limit anywhere (the root of a v1 host): nothing binds.
    pytest.param(Binding([None, None], [None, None], 16 * GiB, 8 * GiB, (None, None)),
                 id="no-limits"),
    # A level over its limit (negative headroom, v1 overshoot) binds available.
    pytest.param(Binding([100 * MiB, GiB], [-MiB, 500 * MiB], 16 * GiB, 8 * GiB, (0, 0)),
                 id="overshoot-binds"),
]


@pytest.mark.parametrize("row", BINDING)
def test_binding_levels(row: Binding) -> None:
    assert binding_levels(row.limits, row.headrooms, row.host_total,
                          row.host_available) == row.want
