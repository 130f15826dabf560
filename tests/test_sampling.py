"""When the guard samples (cgwatch/sampling.py) as tables: the plan a sample leaves and,
from it, whether a check samples; the phases that keep a fixed clock from beating against a
job's cycle. Sizes in MiB, the levels a 4 GiB job with a 5% reserve (204.8 MiB)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from cgwatch.sampling import FIRST, Plan, after_failure, due, phase, plan

MiB = 1 << 20


def test_plan_after_a_sample() -> None:
    """Floors 200 and 800 MiB, growing 10 MiB/s, lead 3 s, interval 0.5 s: near = the
    largest floor + 2 x 10 MiB/s x max(0.5, 3) s = 860 MiB; floor = 200 MiB; the 4th
    sample's phase frac(4 x 0.618) = 0.472 -> due = 10 + 0.5 x (1 + 0.5 x (0.944 - 1))."""
    p = plan(10.0, interval=0.5, jitter=0.5, k=4, floors=[200 * MiB, 800 * MiB],
             growth=10.0 * MiB, lead=3.0, available=900 * MiB, stopped=False, killed=2)
    assert p.near == 860 * MiB and p.floor == 200 * MiB and p.sampled == 10.0
    assert p.due == pytest.approx(10.0 + 0.5 * (1 + 0.5 * (2 * 0.4721359549995796 - 1)))
    assert not p.host_low and p.killed == 2


@pytest.mark.parametrize(("available", "stopped", "host_low"), [
    (100 * MiB, False, True),   # under the floor, the verdict says go on: the host's
    (100 * MiB, True, False),   # under it and stopped: a level's, as the verdict says
    (300 * MiB, False, False),  # over it
    (None, False, False),       # not read
])
def test_host_low(available: int, stopped: bool, host_low: bool) -> None:
    p = plan(0.0, interval=0.5, jitter=0.0, k=0, floors=[200 * MiB], growth=0.0, lead=1.0,
             available=available, stopped=stopped, killed=0)
    assert p.host_low is host_low


LAST = Plan(due=10.5, near=500 * MiB, floor=200 * MiB, sampled=10.0)


class Row(NamedTuple):
    last: Plan
    now: float
    available: int  # MiB
    stopped: bool
    killed: int
    want: bool


DUE = [
    pytest.param(Row(FIRST, 0.0, 4000, False, 0, True), id="first-check"),
    pytest.param(Row(LAST, 10.1, 3000, False, 0, False), id="far-between-samples"),
    pytest.param(Row(LAST, 10.5, 3000, False, 0, True), id="far-due"),
    pytest.param(Row(LAST, 10.1, 3000, False, 1, True), id="a-new-kill"),
    # Near (<= 500 MiB): within near_interval (0.05 s) of the last sample only when over the
    # floor, or stopped, or the host's MemAvailable was found under it.
    pytest.param(Row(LAST, 10.02, 400, False, 0, False), id="near-within-near-interval"),
    pytest.param(Row(LAST, 10.06, 400, False, 0, True), id="near-after-near-interval"),
    pytest.param(Row(LAST, 10.02, 150, False, 0, True), id="under-the-floor-at-once"),
    pytest.param(Row(LAST, 10.02, 150, True, 0, False), id="under-the-floor-stopped"),
    pytest.param(Row(Plan(10.5, 500 * MiB, 200 * MiB, 10.0, host_low=True), 10.02, 150,
                     False, 0, False), id="under-the-floor-the-host's"),
]


@pytest.mark.parametrize("row", DUE)
def test_due(row: Row) -> None:
    assert due(row.last, row.now, row.available * MiB, near_interval=0.05,
               stopped=row.stopped, killed=row.killed) is row.want


def test_phases_spread_evenly() -> None:
    """Any 50 consecutive phases put 4-6 in each tenth of [0, 1) (Weyl; a fixed clock puts
    all 50 in one): the samples of a window meet every part of a job's cycle."""
    for start in (0, 7, 1000):
        counts = [0] * 10
        for k in range(start, start + 50):
            counts[int(phase(k) * 10)] += 1
        assert min(counts) >= 4 and max(counts) <= 6, counts


def test_the_mean_interval_is_kept() -> None:
    """1000 samples at interval 0.5 s, jitter 0.5: each between 0.25 and 0.75 s, 0.5 s on
    average (to 1%)."""
    gaps = [plan(0.0, interval=0.5, jitter=0.5, k=k, floors=[], growth=0.0, lead=1.0,
                 available=None, stopped=False, killed=0).due for k in range(1000)]
    assert all(0.25 <= g <= 0.75 for g in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(0.5, rel=0.01)


def test_plan_after_a_failed_sample() -> None:
    """A sample at 12 s failed: the next comes max(0.5, 1) = 1 s later, never sooner for
    being near (near -1: no figure is at or under it) nor for the kill it failed to count
    (killed 3 is now counted); the floor and the last sample's time are kept."""
    last = Plan(due=12.0, near=500 * MiB, floor=200 * MiB, sampled=11.6, host_low=True,
                killed=2)
    p = after_failure(last, 12.0, interval=0.5, killed=3)
    assert p == Plan(due=13.0, near=-1, floor=200 * MiB, sampled=11.6, host_low=True,
                     killed=3)
    assert not due(p, 12.5, 100 * MiB, near_interval=0.05, stopped=False, killed=3)
    assert due(p, 12.5, 100 * MiB, near_interval=0.05, stopped=False, killed=4)
    assert due(p, 13.0, 3000 * MiB, near_interval=0.05, stopped=False, killed=3)
    assert after_failure(last, 12.0, interval=5.0, killed=2).due == 17.0
