"""The monitor's contract as one table: a fake tree (levels with limit, usage and inactive_file,
the host's MemTotal/MemAvailable, the process's cgroup) and what the public API must answer.

    headroom  = limit - (usage - inactive_file), the working set never below 0
    available = min(headroom of every limited level, host MemAvailable), never below 0
    total     = min(host MemTotal, every limit on the path)

The level marked `binds_total` / `binds_available` is the one that sets that value (the deepest
of equal ones); none is marked when the host sets it. Every expected number is worked out by
hand in its row. Each row runs on cgroup v1 and v2 (the `version` fixture, tests/conftest.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import pytest

from cgwatch import Monitor
from tests.fake_tree import FakeHost, GiB, MiB

# A level below the root: (limit or None, usage, inactive_file).
Level = tuple[Optional[int], int, int]


class Row(NamedTuple):
    where: str  # the process's cgroup
    levels: dict[str, Level]  # every level of the tree but the root (FakeHost makes that)
    total: int
    available: int
    binds_total: Optional[str]  # None: the host's MemTotal sets total (no level marked)
    binds_available: Optional[str]  # None: the host's MemAvailable sets available
    mem_total: int = 64 * GiB
    mem_available: int = 60 * GiB


ROWS = [
    # The seed scenario, (a) to (c).
    pytest.param(Row(
        where="/container",
        levels={"/container": (1 * GiB, 300 * MiB, 100 * MiB)},
        total=1 * GiB,
        available=824 * MiB,  # 1024 - (300 - 100)
        binds_total="/container", binds_available="/container",
    ), id="a-process-in-a-1GiB-container"),
    pytest.param(Row(
        where="/container/child",
        levels={"/container": (1 * GiB, 300 * MiB, 100 * MiB),  # headroom 1024 - 200 = 824
                "/container/child": (256 * MiB, 200 * MiB, 50 * MiB)},  # 256 - 150 = 106
        total=256 * MiB,
        available=106 * MiB,
        binds_total="/container/child", binds_available="/container/child",
    ), id="b-process-in-a-256MiB-child-of-it"),
    pytest.param(Row(
        where="/parent/ours",
        levels={"/parent": (800 * MiB, 700 * MiB, 20 * MiB),  # ours 200 + other 500 in use
                "/parent/ours": (600 * MiB, 200 * MiB, 20 * MiB),  # headroom 600 - 180 = 420
                # Off our path: its limit and headroom (512 - 500 = 12) must not count.
                "/parent/other": (512 * MiB, 500 * MiB, 0)},
        total=600 * MiB,
        available=120 * MiB,  # the parent: 800 - (700 - 20)
        binds_total="/parent/ours", binds_available="/parent",
    ), id="c-600MiB-child-under-800MiB-parent-with-500MiB-sibling"),
    pytest.param(Row(
        where="/a/b/c",
        levels={"/a": (None, 300 * MiB, 30 * MiB), "/a/b": (None, 200 * MiB, 20 * MiB),
                "/a/b/c": (None, 100 * MiB, 10 * MiB)},
        total=64 * GiB, available=60 * GiB,  # the host's MemTotal and MemAvailable
        binds_total=None, binds_available=None,
    ), id="no-limit-anywhere"),
    pytest.param(Row(
        where="/", levels={},  # v1: the root's limit is the "none" value; v2: no files at all
        total=64 * GiB, available=60 * GiB,
        binds_total=None, binds_available=None,
    ), id="process-in-the-root-cgroup"),
    pytest.param(Row(
        where="/big/job",
        levels={"/big": (100 * GiB, 2 * GiB, 0),  # headroom 100 - 2 = 98 GiB
                "/big/job": (None, 2 * GiB, 0)},
        mem_total=16 * GiB, mem_available=12 * GiB,
        total=16 * GiB,  # 100 GiB capped at MemTotal
        available=12 * GiB,  # MemAvailable 12 GiB < 98 GiB
        binds_total=None, binds_available=None,
    ), id="limit-above-host-ram-is-capped"),
    pytest.param(Row(
        where="/a/b/c",
        levels={"/a": (2 * GiB, 1 * GiB, 0),  # headroom 2 - 1 = 1 GiB
                "/a/b": (None, 1 * GiB, 0),
                "/a/b/c": (4 * GiB, 1 * GiB, 0)},  # headroom 4 - 1 = 3 GiB
        total=2 * GiB, available=1 * GiB,
        binds_total="/a", binds_available="/a",
    ), id="tighter-limit-higher-up-with-an-unlimited-level-between"),
    pytest.param(Row(
        where="/job",
        levels={"/job": (1 * GiB, 900 * MiB, 600 * MiB)},
        total=1 * GiB,
        available=724 * MiB,  # 1024 - (900 - 600); with the page cache counted it would be 124
        binds_total="/job", binds_available="/job",
    ), id="inactive-file-excluded-from-working-set"),
    pytest.param(Row(
        where="/job",
        levels={"/job": (1 * GiB, 10 * MiB, 20 * MiB)},  # a racy read: inactive > usage
        total=1 * GiB,
        available=1 * GiB,  # working set 10 - 20 < 0 counts as 0: 1024 - 0
        binds_total="/job", binds_available="/job",
    ), id="working-set-never-negative"),
    pytest.param(Row(
        where="/job",
        levels={"/job": (100 * MiB, 150 * MiB, 10 * MiB)},  # v1 lets usage overshoot briefly
        total=100 * MiB,
        available=0,  # 100 - (150 - 10) = -40, floored
        binds_total="/job", binds_available="/job",
    ), id="usage-over-the-limit"),
    pytest.param(Row(
        where="/job/step",
        levels={"/job": (8 * GiB, 2 * GiB, 0),  # headroom 8 - 2 = 6 GiB
                "/job/step": (4 * GiB, 1 * GiB, 0)},  # headroom 4 - 1 = 3 GiB
        mem_available=1 * GiB,
        total=4 * GiB,
        available=1 * GiB,  # MemAvailable 1 GiB < 3 GiB
        binds_total="/job/step", binds_available=None,
    ), id="host-memavailable-tighter-than-every-level"),
    pytest.param(Row(
        where="/a/b",
        levels={"/a": (512 * MiB, 200 * MiB, 50 * MiB),  # b is its only child: same usage,
                "/a/b": (512 * MiB, 200 * MiB, 50 * MiB)},  # both headrooms 512 - 150 = 362
        total=512 * MiB, available=362 * MiB,
        binds_total="/a/b", binds_available="/a/b",
    ), id="equal-limits-the-deepest-is-marked"),
]


@pytest.mark.parametrize("row", ROWS)
def test_monitor_contract(row: Row, version: int, tmp_path: Any, opened: list[Any]) -> None:
    host = FakeHost(str(tmp_path), version, cgroup_path=row.where, mem_total=row.mem_total,
                    mem_available=row.mem_available)
    for path, (limit, usage, inactive) in row.levels.items():
        host.make_level(path, limit, usage, inactive)
    monitor = Monitor(host.root)
    opened.append(monitor)
    infos = monitor.levels()
    assert infos and infos[0].cgroup_path == row.where  # the walk starts at the process
    got = {
        "total": monitor.total_memory(),
        "available": monitor.available_memory(),
        "binds_total": [i.cgroup_path for i in infos if i.binds_total],
        "binds_available": [i.cgroup_path for i in infos if i.binds_available],
    }
    assert got == {
        "total": row.total,
        "available": row.available,
        "binds_total": [row.binds_total] if row.binds_total else [],
        "binds_available": [row.binds_available] if row.binds_available else [],
    }
