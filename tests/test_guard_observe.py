"""Guard(observe=True) on a fake /proc + /sys tree (tests/fake_tree.py): the same decision as
an acting guard, but check() never says stop; each would-be stop is logged once as such and
judged by what followed (wouldstop.py's table is tests/test_wouldstop.py). The real kernel
side is tests/test_observe_real.py."""

from __future__ import annotations

import logging
import time

import pytest

from cgwatch import Guard, Monitor, Verdict
from cgwatch.wouldstop import FALSE, OPEN
from tests.fake_tree import FakeHost, GiB, MiB


def run_through_a_peak(job_host: FakeHost, guard: Guard) -> list[Verdict]:
    """100 checks with room, 100 at 102 MiB of headroom (under 5 % of 4 GiB = 204.8 MiB),
    100 with room again (as tests/test_guard_fake.py's reserve test)."""
    out = [guard.check(step) for step in range(100)]
    job_host.set_usage("/job", 4 * GiB - 102 * MiB, 0)
    out += [guard.check(step) for step in range(100, 200)]
    job_host.set_usage("/job", 1 * GiB, 0)
    out += [guard.check(step) for step in range(200, 300)]
    return out


def test_observe_decides_the_same_and_says_go_on(
        job_host: FakeHost, job_monitor: Monitor, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Verdict] = []
    with caplog.at_level(logging.INFO, logger="cgwatch"), \
            Guard(job_monitor, reserve="5%", rise_margin=0, interval=0.0, events=False,
                  observe=True) as guard:
        guard.subscribe(seen.append)
        answered = run_through_a_peak(job_host, guard)
        assert guard.observe
        stops = guard.would_stops()
        assert not any(v.stop for v in answered)
        # the go-on answered during the stop carries the lead and step of that check's
        # sample (interval=0: every check samples)
        assert (answered[150].trigger, answered[150].step) == ("", 150)
        assert [(s.stop.trigger, s.stop.level, s.stop.step) for s in stops] == [
            ("reserve", "/job", 100)]
        assert stops[0].stop.cleared is not None and stops[0].stop.cleared > stops[0].stop.at
        # judged while the job runs: cleared less than a lead ago -> open; after it -> false
        assert stops[0].judged == OPEN
        later = guard.would_stops(ended=time.monotonic() + 60)
        assert [j.judged for j in later] == [FALSE]
    # the callbacks see the decision itself: stop, then go on again
    assert [(v.stop, v.trigger) for v in seen] == [(True, "reserve"), (False, "")]
    lines = [r.getMessage() for r in caplog.records if r.name == "cgwatch"]
    assert lines[0].startswith("cgwatch guard (observe): would save and stop at step 100: "
                               "cgroup /job: headroom 102.0 MiB of 4.0 GiB"), lines
    assert [r.levelno for r in caplog.records][:2] == [logging.WARNING, logging.INFO]
    assert lines[-1] == ("cgwatch guard (observe): 1 would-be stop(s): 1 false, 0 needed, "
                         "0 open"), lines


def test_an_acting_guard_has_no_would_be_stops(job_host: FakeHost, job_monitor: Monitor) -> None:
    with Guard(job_monitor, reserve="5%", rise_margin=0, interval=0.0, events=False) as guard:
        answered = run_through_a_peak(job_host, guard)
        assert not guard.observe and guard.would_stops() == []
    assert sum(v.stop for v in answered) == 100


def test_the_counts_on_prometheus(job_host: FakeHost, job_monitor: Monitor) -> None:
    """GuardCollector in the guard's process: right after the peak its stop is open (it
    cleared less than its lead ago: with no save size known, a 1 s save x 1.5 plus the time
    between checks, which here take milliseconds)."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from cgwatch.prometheus import GuardCollector

    with Guard(job_monitor, reserve="5%", rise_margin=0, interval=0.0, events=False,
               observe=True) as guard:
        run_through_a_peak(job_host, guard)
        registry = prometheus_client.CollectorRegistry()
        registry.register(GuardCollector(guard))
        text = prometheus_client.generate_latest(registry).decode()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == ['cgwatch_guard_would_stop_total{judged="false"} 0.0',
                     'cgwatch_guard_would_stop_total{judged="needed"} 0.0',
                     "cgwatch_guard_would_stops_open 1.0"]
