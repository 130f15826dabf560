"""`cgwatch run --guard --save-delay`: the lead that holds a CMD's wait after the signal (HF's
enable_jit_checkpoint waits 3 s), the save an attempt made without it, and the line said when
a CMD was killed after the signal (a stop during an evaluation the job cannot save in). The
real HF jobs are tests/integration/test_run_guard_jit.py."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Iterator
from typing import Any, NamedTuple, Optional

import pytest

from cgwatch import Guard
from cgwatch.cli.run import check_arguments
from cgwatch.cli.runguard import outcome_line
from cgwatch.cli.savedelay import killed_line, timed_save
from cgwatch.monitor import Monitor
from tests.fake_tree import FakeHost, GiB


@pytest.fixture
def monitor(tmp_path: Any) -> Iterator[Monitor]:
    host = FakeHost(str(tmp_path), 1)
    host.make_path({"/job": 4 * GiB})
    host.set_usage("/job", 1 * GiB, 0)
    host.move_to("/job")
    with Monitor(host.root, thread=False) as m:
        yield m


class Lead(NamedTuple):
    delay: float
    checkpoint_seconds: Optional[float]
    saves: tuple[float, ...]
    want_seconds: float  # what a save takes, from the signal
    want_lead: float  # x 1.5, before any check (no gap between checks yet)


LEADS = [
    pytest.param(Lead(3.0, 1.0, (), 4.0, 6.0), id="hf-jit-3-s-and-a-1-s-save"),
    pytest.param(Lead(3.0, 1.0, (0.5,), 3.5, 5.25), id="a-timed-save-replaces-the-1-s"),
    pytest.param(Lead(0.0, 2.0, (), 2.0, 3.0), id="no-delay-is-the-plain-guard"),
    # No size known: 1 s (not the working set, 1 GiB at 100 MiB/s = 10.24 s, since issue 32),
    # + 3 = 4 s, x 1.5 = 6 s
    pytest.param(Lead(3.0, None, (), 4.0, 6.0), id="the-estimate-and-the-delay"),
]


@pytest.mark.parametrize("row", LEADS)
def test_the_lead_holds_the_delay(monitor: Monitor, row: Lead) -> None:
    with Guard(monitor, save_delay=row.delay, checkpoint_seconds=row.checkpoint_seconds,
               events=False) as guard:
        guard.check(0)  # one sample: the working set the estimate uses
        for seconds in row.saves:
            guard.saved(seconds)
        assert guard.checkpoint_seconds == pytest.approx(row.want_seconds, abs=0.01)
        assert guard.lead - guard.check_gap == pytest.approx(row.want_lead, abs=0.02)
    # The decision itself stops by that lead: a first sample's verdict carries it (its gap 0)
    with Guard(monitor, save_delay=row.delay, checkpoint_seconds=row.checkpoint_seconds,
               events=False) as guard:
        for seconds in row.saves:
            guard.saved(seconds)
        assert guard.check(0).lead == pytest.approx(row.want_lead, abs=0.02)


def test_a_negative_delay_is_refused(monitor: Monitor) -> None:
    with pytest.raises(ValueError, match="save_delay >= 0"):
        Guard(monitor, save_delay=-1.0, events=False)


@pytest.mark.parametrize("seconds, delay, want", [
    (4.2, 3.0, 1.2),  # signal -> exit 4.2 s, of which the job waited 3
    (2.0, 3.0, 0.0),  # ended before its wait was over: no negative save
    (0.7, 0.0, 0.7),
])
def test_timed_save(seconds: float, delay: float, want: float) -> None:
    assert timed_save(seconds, delay) == pytest.approx(want)


class Killed(NamedTuple):
    seconds: float
    delay: float
    directory: Optional[str]
    changed: Optional[str]
    want: str


# what a kill with no save begun says after the figures (no step boundary came)
NO_STEP = ("stopped during an evaluation or prediction loop, which has no step boundary until "
           "it ends (HF's enable_jit_checkpoint saves only at one), or in a step longer than "
           "that; exit 137")

KILLED = [
    pytest.param(Killed(9.3, 3.0, "/ckpt", None,
                        "cgwatch guard: nothing was saved: train was killed by SIGKILL 9.3 s "
                        "after SIGTERM, and nothing in /ckpt changed since the signal: its save "
                        "waits 3.0 s (--save-delay), then for a step boundary, and none came in "
                        "the 6.3 s after: " + NO_STEP),
                 id="stopped-in-an-evaluation"),
    pytest.param(Killed(1.5, 0.0, "/ckpt", None,
                        "cgwatch guard: nothing was saved: train was killed by SIGKILL 1.5 s "
                        "after SIGTERM, and nothing in /ckpt changed since the signal: its save "
                        "had not begun in those 1.5 s: " + NO_STEP),
                 id="no-delay-nothing-begun"),
    pytest.param(Killed(2.1, 3.0, "/ckpt", None,
                        "cgwatch guard: nothing was saved: train was killed by SIGKILL 2.1 s "
                        "after SIGTERM, before its save could begin (3.0 s after the signal, "
                        "--save-delay); nothing in /ckpt changed since the signal; exit 137"),
                 id="killed-within-the-wait"),
    pytest.param(Killed(4.0, 3.0, "/ckpt", "/ckpt/checkpoint-41",
                        "cgwatch guard: train was killed by SIGKILL 4.0 s after SIGTERM, during "
                        "its save (/ckpt/checkpoint-41 changed since the signal and may be "
                        "incomplete); exit 137"),
                 id="killed-in-the-save"),
    pytest.param(Killed(12.0, 3.0, None, None,
                        "cgwatch guard: train was killed by SIGKILL 12 s after SIGTERM, before "
                        "it could finish a save; exit 137"),
                 id="where-it-saves-unknown"),
]


@pytest.mark.parametrize("row", KILLED)
def test_killed_line(row: Killed) -> None:
    assert killed_line("train", signal.SIGKILL, signal.SIGTERM, row.seconds, row.delay,
                       row.directory, row.changed, 137) == row.want
    # what run prints: outcome_line hands a kill to killed_line
    assert outcome_line("train", -signal.SIGKILL, signal.SIGTERM, row.seconds, row.directory,
                        row.changed, 0, row.delay) == row.want


def test_save_delay_needs_guard() -> None:
    args = argparse.Namespace(command=["true"], guard=False, signal=None, reserve=None,
                              checkpoint_seconds=None, save_delay=3.0)
    assert check_arguments(args) == (["true"], "--save-delay needs --guard")
