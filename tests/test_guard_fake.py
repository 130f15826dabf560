"""The public Guard on fake /proc + /sys trees (tests/fake_tree.py): what it samples, when it
says stop, that each change is one callback and one log record however many steps check it,
the checkpoint time it learns from the job's saves, throttling from memory.pressure and an
OOM kill through Events. The kernel side (a real leak under a real limit) is
tests/test_guard_real.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import cgwatch
from cgwatch import Guard, Monitor, Verdict
from cgwatch.events import Events
from tests.cgroup_helpers import PROJECT, wait_for
from tests.fake_tree import FakeHost, GiB, MiB

# policy.LargestRise ends a climb at a check that does not fall this long after the last
# that fell (its _HOLD, 0.3 s), and a little more
HOLD = 0.32

PSI_LINE = "some avg10=0.00 avg60=0.00 avg300=0.00 total={some}\n" \
           "full avg10=0.00 avg60=0.00 avg300=0.00 total={full}\n"


@pytest.fixture
def host(tmp_path: object) -> FakeHost:
    host = FakeHost(str(tmp_path), 2, cgroup_path="/job")
    host.make_path({"/job": 4 * GiB})  # usage 100 MiB, inactive 10 MiB
    return host


@pytest.fixture
def monitor(host: FakeHost) -> Iterator[Monitor]:
    with Monitor(host.root, thread=False) as m:
        yield m


def test_exported_lazily() -> None:
    assert cgwatch.Guard is Guard
    assert cgwatch.GUARD_EXIT_STATUS == 75
    assert cgwatch.Verdict is Verdict


def test_far_from_everything(monitor: Monitor) -> None:
    with Guard(monitor, events=False) as guard:
        verdicts = [guard.check(step) for step in range(100)]
    assert not any(v.stop for v in verdicts)
    assert verdicts[-1].trigger == ""


def test_reserve_one_callback_and_one_record_per_change(
        host: FakeHost, monitor: Monitor, caplog: pytest.LogCaptureFixture) -> None:
    """5% of 4 GiB = 204.8 MiB: 3.9 GiB used (inactive 0) leaves 102.4 MiB -> stop; freed
    again -> go on. 300 checks, two changes: two callbacks, two records. (rise_margin=0: the
    jump to 3.9 GiB would otherwise be learned as the job's piece, and kept free after;
    test_a_big_piece_is_kept_free.)"""
    seen: list[Verdict] = []
    with caplog.at_level(logging.INFO, logger="cgwatch"), \
            Guard(monitor, reserve="5%", rise_margin=0, interval=0.0, events=False) as guard:
        guard.subscribe(seen.append)
        for step in range(100):
            guard.check(step)
        host.set_usage("/job", 4 * GiB - 102 * MiB, 0)
        stops = [guard.check(step) for step in range(100, 200)]
        host.set_usage("/job", 1 * GiB, 0)
        after = [guard.check(step) for step in range(200, 300)]
    assert all(v.stop and v.trigger == "reserve" and v.level == "/job" for v in stops)
    assert stops[0].step == 100 and stops[0].headroom == 102 * MiB
    assert stops[0].reserve == int(4 * GiB * 0.05)
    assert not any(v.stop for v in after)
    assert [(v.stop, v.trigger) for v in seen] == [(True, "reserve"), (False, "")]
    records = [r for r in caplog.records if r.getMessage().startswith("cgwatch guard")]
    assert [r.levelno for r in records] == [logging.WARNING, logging.INFO]
    assert "below the reserve" in records[0].getMessage()


def test_between_samples_only_available_memory_is_read(host: FakeHost,
                                                       monitor: Monitor) -> None:
    """interval 60 s: the first check samples; the rest answer from available_memory(). A
    drop below the reserve is still seen at once, because it brings available_memory() under
    the near line, and near the line every check samples."""
    with Guard(monitor, reserve="256M", interval=60.0, events=False) as guard:
        assert not guard.check(0).stop
        host.set_usage("/job", 4 * GiB - 100 * MiB, 0)
        verdict = guard.check(1)
    assert verdict.trigger == "reserve" and verdict.step == 1


def test_forecast_of_a_leak(host: FakeHost, monitor: Monitor) -> None:
    """A working set growing 64 MiB per 20 ms bucket (3.2 GiB/s on this fake clock) with 2 GiB
    left: well under a 1000 s checkpoint. Stops by forecast once enough buckets closed,
    before the reserve is reached."""
    usage = 1 * GiB
    host.set_usage("/job", usage, 0)  # from the first check on: no 0.9 GiB first "rise"
    with Guard(monitor, reserve="1M", checkpoint_seconds=1000.0, interval=0.0,
               bucket=0.02, events=False) as guard:
        verdict = guard.check(0)
        step = 0
        while not verdict.stop and usage < 4 * GiB:
            step += 1
            time.sleep(0.005)
            usage += 16 * MiB
            host.set_usage("/job", usage, 0)
            verdict = guard.check(step)
    assert verdict.trigger == "forecast", verdict
    assert verdict.growth > 0 and verdict.seconds_left is not None
    # The save's 1000 s x 1.5, and the time between two checks (a loop without a step).
    assert verdict.seconds_left < verdict.lead
    assert 1500.0 <= verdict.lead < 1501.0


def test_a_step_change_does_not_stop_it(host: FakeHost, monitor: Monitor) -> None:
    """1 GiB -> 3 GiB at once, then flat, 1.9 GiB above the 5% reserve line: no stop by the
    forecast over 30 buckets, even with a 1000 s checkpoint (rise_margin=0: that 2 GiB piece
    would not fit again, test_a_big_piece_is_kept_free)."""
    with Guard(monitor, checkpoint_seconds=1000.0, rise_margin=0, interval=0.0, bucket=0.02,
               events=False) as guard:
        host.set_usage("/job", 1 * GiB, 0)
        for step in range(20):
            assert not guard.check(step).stop
            time.sleep(0.005)
        host.set_usage("/job", 3 * GiB, 0)
        deadline = time.monotonic() + 0.6
        step = 20
        while time.monotonic() < deadline:
            step += 1
            assert not guard.check(step).stop
            time.sleep(0.005)


def test_a_big_piece_is_kept_free(host: FakeHost, monitor: Monitor) -> None:
    """The reserve follows the job (policy.LargestRise): one 1 GiB piece (a dataset loaded,
    then flat) is no pattern: 2 GiB left, no stop; a piece of 600 MiB is another piece, taken
    once: still none; the same 600 MiB again (the job's second piece of that size) makes it
    the piece taken twice: 848 MiB left is under 5% (204.8 MiB) + 600 x 1.25 = 954.8 MiB,
    stop, naming the rise (750 MiB), at the first check after that piece ended (a piece is
    known once a check does not fall, 0.3 s after the last that fell: HOLD). All with a
    1000 s checkpoint: the forecast sees no growth in steps."""
    host.set_usage("/job", 1 * GiB, 0)
    with Guard(monitor, checkpoint_seconds=1000.0, interval=0.0, events=False) as guard:
        assert not guard.check(0).stop
        host.set_usage("/job", 2 * GiB, 0)
        calm = [guard.check(1)]
        time.sleep(HOLD)
        calm += [guard.check(step) for step in range(2, 50)]
        assert guard.rise == 0
        host.set_usage("/job", 2 * GiB + 600 * MiB, 0)
        calm.append(guard.check(50))
        time.sleep(HOLD)
        calm += [guard.check(step) for step in range(51, 100)]
        assert guard.rise == 0
        host.set_usage("/job", 3 * GiB + 176 * MiB, 0)
        calm.append(guard.check(100))  # the piece is still being taken
        time.sleep(HOLD)
        verdict = guard.check(101)
    assert not any(v.stop for v in calm)
    assert guard.rise == 600 * MiB
    assert verdict.trigger == "reserve" and verdict.headroom == 848 * MiB
    assert verdict.rise == 750 * MiB
    assert verdict.reserve == int(4 * GiB * 0.05) + 750 * MiB
    assert "(204.8 MiB, plus room for the job's largest rise, 750.0 MiB)" in verdict.message()


def test_a_climb_over_samples_is_one_piece(host: FakeHost, monitor: Monitor) -> None:
    """A start-up allocation read over four checks, each of them a sample (interval 0), is
    one piece taken once: no rise learned, no stop at a later spike's top. A sample must not
    feed its check's figure to LargestRise a second time: a check that did not fall ends a
    piece, which cut the climb into four pieces of 150 MiB, "taken twice" (the campaign's
    false stop under `run --guard`, its 0.1 s checks on a start-up at ~1 GB/s)."""
    host.set_usage("/job", 100 * MiB, 0)
    with Guard(monitor, checkpoint_seconds=1000.0, interval=0.0, events=False) as guard:
        calm = [guard.check(0)]
        for usage in (250, 400, 550, 700):
            host.set_usage("/job", usage * MiB, 0)
            calm.append(guard.check(1))
        calm += [guard.check(step) for step in range(2, 10)]
        assert guard.rise == 0
        host.set_usage("/job", 3 * GiB + 600 * MiB, 0)  # an evaluation's spike, 424 MiB left
        calm += [guard.check(step) for step in range(10, 20)]
    assert not any(v.stop for v in calm), [v.message() for v in calm if v.stop]


def test_the_save_time_before_any_save(host: FakeHost, monitor: Monitor) -> None:
    """No save timed, none configured, no size: 1 s, whatever the working set (90 MiB,
    then 1 GiB: it was the working set over write_rate, 10.24 s at 1 GiB, before issue 32:
    no checkpoint holds a job's batches and caches); `checkpoint_bytes` 2 GiB at 10^8 B/s ->
    21.5 s; the user's `checkpoint_seconds` before any of those; a timed save before
    everything."""
    with Guard(monitor, interval=0.0, events=False) as guard:
        guard.check(0)
        assert guard.checkpoint_seconds == 1.0
        host.set_usage("/job", 1 * GiB, 0)
        guard.check(1)
        assert guard.checkpoint_seconds == 1.0
        assert guard.lead == pytest.approx(1.5 + guard.check_gap)  # x 1.5, and the gap
        assert guard.check_gap < 1.0
        guard.saved(2.5)
        assert guard.checkpoint_seconds == 2.5
    with Guard(monitor, checkpoint_bytes="2G", write_rate=100_000_000, interval=0.0,
               events=False) as guard:
        guard.check(0)
        assert guard.checkpoint_seconds == pytest.approx(2 * GiB / 100e6)
    with Guard(monitor, checkpoint_seconds=7.0, checkpoint_bytes="2G", events=False) as guard:
        guard.check(0)
        assert guard.checkpoint_seconds == 7.0


@pytest.mark.parametrize("kwargs", [{"write_rate": 0}, {"write_rate": "5%"},
                                    {"checkpoint_bytes": -1}, {"rise_margin": -1},
                                    {"jitter": 1.0}, {"checkpoint_seconds": -1}])
def test_options_refused(monitor: Monitor, kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Guard(monitor, events=False, **kwargs)  # type: ignore[arg-type]


def test_saves_set_the_checkpoint_time(monitor: Monitor) -> None:
    with Guard(monitor, checkpoint_seconds=30.0, margin=2.0, events=False) as guard:
        assert (guard.checkpoint_seconds, guard.lead) == (30.0, 60.0)
        guard.saved(5.0)
        guard.saved(12.0)
        guard.saved(7.0)
        assert (guard.checkpoint_seconds, guard.lead) == (12.0, 24.0)
        with guard.saving():
            pass
        assert guard.checkpoint_seconds == 12.0  # the longest of the last five
        for _ in range(5):
            guard.saved(1.0)
        assert guard.checkpoint_seconds == 1.0


@pytest.mark.parametrize("kwargs", [{"pressure": "all"}, {"margin": 0.5},
                                    {"reserve": "150%"}, {"window": 2}])
def test_bad_arguments(monitor: Monitor, kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Guard(monitor, events=False, **kwargs)  # type: ignore[arg-type]


def test_throttling_from_memory_pressure(host: FakeHost, monitor: Monitor) -> None:
    """v2: a level with memory.high whose PSI `full` total grows by 50% of wall time is
    throttled; stopped once that lasted throttle_seconds (0.1 s here)."""
    d = host.level_dir("/job")
    host.write(d + "/memory.high", f"{3 * GiB}\n")
    total = 0
    host.write(d + "/memory.pressure", PSI_LINE.format(some=total, full=total))
    with Guard(monitor, interval=0.0, throttle_seconds=0.1, events=False) as guard:
        last = time.monotonic()
        verdict = guard.check(0)
        step = 0
        deadline = time.monotonic() + 10
        while not verdict.stop and time.monotonic() < deadline:
            time.sleep(0.01)
            now = time.monotonic()
            total += int((now - last) * 0.5e6) + 1
            last = now
            host.write(d + "/memory.pressure", PSI_LINE.format(some=total, full=total))
            step += 1
            verdict = guard.check(step)
    assert verdict.trigger == "throttle" and verdict.level == "/job", verdict
    assert verdict.throttled_for >= 0.1 and verdict.pressure is not None


def test_no_throttle_without_pressure(host: FakeHost, monitor: Monitor) -> None:
    d = host.level_dir("/job")
    host.write(d + "/memory.high", f"{3 * GiB}\n")
    host.write(d + "/memory.pressure", PSI_LINE.format(some=0, full=0))
    with Guard(monitor, interval=0.0, throttle_seconds=0.05, events=False) as guard:
        for step in range(30):
            time.sleep(0.005)
            assert not guard.check(step).stop


def test_oom_kill_of_another_process(host: FakeHost) -> None:
    """An `oom_kill` rise in the job's memory.events (a worker killed) stops the job, through
    an Events of the same monitor."""
    d = host.level_dir("/job")
    events_text = "low 0\nhigh 0\nmax 0\noom 0\noom_kill {n}\noom_group_kill 0\n"
    host.write(d + "/memory.events", events_text.format(n=0))
    host.write(d + "/memory.events.local", events_text.format(n=0))
    with Monitor(host.root) as monitor, \
            Events(monitor, log=False, poll_interval=0.02, check_interval=0.02) as events:
        with Guard(monitor, events=events) as guard:
            assert not guard.check(0).stop
            host.write(d + "/memory.events.local", events_text.format(n=1))
            host.write(d + "/memory.events", events_text.format(n=1))
            assert wait_for(lambda: guard.check(1).stop, timeout=10)
            verdict = guard.verdict
        assert not events.closed  # the caller's Events is the caller's to close
    assert (verdict.trigger, verdict.killed, verdict.level) == ("oom_kill", 1, "/job")


def test_a_failing_callback_does_not_break_check(host: FakeHost, monitor: Monitor) -> None:
    def boom(verdict: Verdict) -> None:
        raise RuntimeError("callback")

    with Guard(monitor, interval=0.0, events=False) as guard:
        guard.subscribe(boom)
        host.set_usage("/job", 4 * GiB - 10 * MiB, 0)
        assert guard.check(0).stop
        guard.unsubscribe(boom)


# A job under the guard, in a process of its own: pytest's logging plugin puts handlers on the
# root logger, so only a fresh interpreter has logging as a user's script leaves it. The stop:
# 3.9 GiB used of 4 GiB, 102 MiB left under the 5% reserve (204.8 MiB).
STOPPING_JOB = """
import logging, sys
sys.path.insert(0, {project!r})
from cgwatch import Guard, Monitor
from tests.fake_tree import FakeHost, GiB, MiB
if {log_file!r}:
    logging.basicConfig(filename={log_file!r})
host = FakeHost({root!r}, 2, cgroup_path="/job")
host.make_path({{"/job": 4 * GiB}})
host.set_usage("/job", 4 * GiB - 102 * MiB, 0)
with Monitor(host.root, thread=False) as monitor:
    guard = Guard(monitor, interval=0.0, events=False)
    for step in range(5):
        verdict = guard.check(step)
        if verdict.stop:
            guard.exit(verdict)
"""
STOP_LINE = ("cgwatch guard: save and stop at step 0: cgroup /job: headroom 102.0 MiB of "
             "4.0 GiB, below the reserve of 204.8 MiB")


@pytest.mark.parametrize("configured", [False, True], ids=["logging-unconfigured",
                                                             "logging-to-a-file"])
def test_the_stop_line_reaches_stderr_once(tmp_path: object, configured: bool) -> None:
    """Unconfigured, the stop's WARNING record goes to stderr through logging's last-resort
    handler (the message alone), and exit() printed the same line after it: two lines.
    Now one. With logging sent to a file, exit()'s line is the one on stderr, and the record
    is in the file."""
    log_file = os.path.join(str(tmp_path), "log") if configured else ""
    code = STOPPING_JOB.format(project=PROJECT, log_file=log_file,
                               root=os.path.join(str(tmp_path), "tree"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 75, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [STOP_LINE]
    if configured:
        with open(log_file) as f:
            assert f.read().splitlines() == [f"WARNING:cgwatch:{STOP_LINE}"]


def test_the_lead_holds_the_time_between_checks(monitor: Monitor) -> None:
    """A stop comes only at a check: with checks 0.3 s apart (a job of slow steps), the
    forecast must leave those 0.3 s besides the save's 1 s x 1.5 (the working set, 90 MiB
    at 100 MiB/s, is under the 1 s floor). Fast checks again: after 5 samples it is gone."""
    with Guard(monitor, events=False, interval=0.0) as guard:
        guard.check(1)
        assert guard.check_gap == 0.0 and guard.lead == 1.5
        time.sleep(0.3)
        guard.check(2)
        assert 0.3 <= guard.check_gap < 10  # a loaded machine may deschedule us for long
        assert guard.lead == 1.5 + guard.check_gap
        assert guard.verdict.lead == guard.lead  # what the sample decided with
        for step in range(3, 8):  # interval 0: every check samples
            guard.check(step)
        assert guard.check_gap < 0.3 and guard.lead < 1.8
