"""The simulated campaign (bench/simulate.py): 10,080 jobs of bench/simulate_shapes.py, every
healthy and leaking class x the three ways in, through the guard's pure decision
(cgwatch/decision.py) with the kernel modelled, over two processes. The jobs are seeded and
the decision takes its clock as an argument, so every figure is the same at every run: the
counts below are exact, worked out by the run docs/bench.md shows ("The simulated
campaign"), and a change of the rule that makes any of them worse fails here.

Of issue 33's goal, the leaks' half holds (>= 99 % of the leaks within reach saved: 1,277 of
1,281); the healthy half (0 stops) does not yet: `test_no_healthy_job_is_stopped` says by
how much, and fails loudly (strict xfail) the day it holds, so that the bounds are tightened
then."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench import simulate
from bench.simulate import Outcome

# The run of docs/bench.md's table (python -m bench.simulate): the bounds a change may not
# cross. Healthy jobs stopped (of 6,720), per way:
HEALTHY_STOPS = {"guard": 29, "adapter": 65, "run": 61}
# Leaks within reach saved (of 1,281 within reach, of 3,360):
REACH_SAVED = 1277


@pytest.fixture(scope="module")
def outcomes() -> Iterator[list[Outcome]]:
    outs = simulate.run_all(processes=2)
    print("\n" + simulate.table(outs))  # pytest -s (or -rP) shows the table
    yield outs


def test_every_job_ran(outcomes: list[Outcome]) -> None:
    assert len(outcomes) >= 10_000
    assert [o.index for o in outcomes] == list(range(len(outcomes)))
    leaks = [o for o in outcomes if o.leaks]
    # Every leak is either saved, stopped with its save cut, or killed unstopped; every
    # class and way is there.
    assert all(o.saved or o.killed for o in leaks)
    assert {(o.cls, o.way) for o in outcomes} == {
        (c, w) for c in {o.cls for o in outcomes} for w in ("guard", "adapter", "run")}


def test_no_way_stops_more_healthy_jobs_than_before(outcomes: list[Outcome]) -> None:
    for way, bound in HEALTHY_STOPS.items():
        stops = [o for o in outcomes if not o.leaks and o.way == way and o.stopped]
        assert len(stops) <= bound, (way, [(o.cls, o.message) for o in stops[:5]])


def test_at_least_99_percent_of_the_leaks_within_reach_are_saved(
        outcomes: list[Outcome]) -> None:
    reach = [o for o in outcomes if o.leaks and o.reach]
    saved = sum(o.saved for o in reach)
    assert saved >= REACH_SAVED
    assert saved >= 0.99 * len(reach), [o for o in reach if not o.saved][:5]


@pytest.mark.xfail(strict=True, reason="not yet: 155 of 6,720 healthy jobs stopped, all near "
                   "their limit, most at a first ramp a leak of the same speed would need "
                   "stopped: docs/bench.md, 'The simulated campaign'")
def test_no_healthy_job_is_stopped(outcomes: list[Outcome]) -> None:
    assert sum(o.stopped for o in outcomes if not o.leaks) == 0
