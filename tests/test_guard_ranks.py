"""The same decision on every rank (ranks.py and Guard's agreement), with a made-up process
group in place of torch.distributed: which checks all-reduce, what the MAX of the ranks'
codes means, and that a failed collective leaves the rank deciding alone without raising.
The real all-reduce (torch, gloo, two processes) is tests/integration/test_guard_training.py."""

from __future__ import annotations

import logging
import sys
from typing import Optional

import pytest

from cgwatch import GUARD_EXIT_STATUS, Guard, Monitor, Verdict, ranks
from tests.fake_tree import FakeHost, GiB, MiB


class Group:
    """Rank `rank` of a made-up group whose other ranks send `others` (their encoded
    verdicts) to every all-reduce; records what this rank sent."""

    def __init__(self, rank: int = 0, others: int = 0, fail: bool = False) -> None:
        self.rank = rank
        self.others = others
        self.fail = fail
        self.sent: list[int] = []

    def max(self, value: int) -> int:
        self.sent.append(value)
        if self.fail:
            raise RuntimeError("Connection closed by peer [127.0.0.1]:29500")
        return max(value, self.others)


@pytest.fixture
def host(job_host: FakeHost) -> FakeHost:
    return job_host  # conftest.py's: /job limited to 4 GiB


@pytest.fixture
def monitor(job_monitor: Monitor) -> Monitor:
    return job_monitor


@pytest.mark.parametrize("sent, agreed", [
    ([(False, "", 0), (False, "", 1)], None),
    ([(True, "reserve", 0), (False, "", 1)], ("reserve", 0)),
    ([(False, "", 0), (True, "forecast", 7)], ("forecast", 7)),
    # the most urgent trigger wins (policy's order), whatever the rank
    ([(True, "throttle", 5), (True, "reserve", 1), (True, "forecast", 3)], ("reserve", 1)),
    ([(True, "oom_kill", 2), (True, "forecast", 9)], ("oom_kill", 2)),
    # the same trigger on several ranks: the highest of them
    ([(True, "forecast", 3), (True, "forecast", 1000)], ("forecast", 1000)),
])
def test_max_of_the_codes(sent: list[tuple[bool, str, int]],
                          agreed: Optional[tuple[str, int]]) -> None:
    assert ranks.decode(max(ranks.encode(*s) for s in sent)) == agreed


def test_agrees_every_k_checks_and_holds_a_stop_until_then(host: FakeHost,
                                                           monitor: Monitor) -> None:
    """sync_every 3: checks 1, 4, 7, ... all-reduce. This rank falls under its reserve at
    check 5: checks 5 and 6 still say go on (no rank stops alone), check 7 says stop. (No
    sample but the first and the one the fall under the reserve makes at once.)"""
    group = Group()
    with Guard(monitor, reserve="5%", interval=60.0, near_interval=60.0, events=False,
               sync_every=3, ranks=group) as guard:
        before = [guard.check(step) for step in range(1, 5)]
        host.set_usage("/job", 4 * GiB - 100 * MiB, 0)
        after = [guard.check(step) for step in range(5, 11)]
        decided = guard.verdict
    assert not any(v.stop for v in before)
    assert [v.stop for v in after] == [False, False, True, True, True, True]
    assert after[2].trigger == "reserve" and after[2].level == "/job"
    assert after[2].rank is None  # its own verdict, with its figures
    # at the step all ranks act on it (this rank's own sample decided at an earlier check)
    assert after[2].step == 7 and decided.step == 5 and decided.headroom == after[2].headroom
    assert len(group.sent) == 4  # checks 1, 4, 7, 10
    assert group.sent[:2] == [0, 0] and ranks.decode(group.sent[2]) == ("reserve", 0)


def test_another_ranks_stop_is_adopted_once(monitor: Monitor,
                                            caplog: pytest.LogCaptureFixture) -> None:
    group = Group(rank=0, others=ranks.encode(True, "forecast", 1))
    seen: list[Verdict] = []
    with caplog.at_level(logging.INFO, logger="cgwatch"), \
            Guard(monitor, events=False, sync_every=2, ranks=group) as guard:
        guard.subscribe(seen.append)
        verdicts = [guard.check(step) for step in range(6)]
    assert all(v.stop and v.trigger == "forecast" and v.rank == 1 for v in verdicts)
    assert guard.verdict.stop is False  # this rank's own decision is unchanged
    assert [(v.stop, v.trigger, v.rank) for v in seen] == [(True, "forecast", 1)]
    assert "rank 1's guard decided (forecast" in verdicts[0].message()
    assert "at step 0" in verdicts[0].message()
    records = [r for r in caplog.records if r.getMessage().startswith("cgwatch guard")]
    assert [r.levelno for r in records] == [logging.WARNING]


def test_a_failed_all_reduce_leaves_the_rank_alone(host: FakeHost, monitor: Monitor,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    group = Group(fail=True)
    with caplog.at_level(logging.WARNING, logger="cgwatch"), \
            Guard(monitor, reserve="5%", interval=0.0, events=False, sync_every=1,
                  ranks=group) as guard:
        first = guard.check(0)
        host.set_usage("/job", 4 * GiB - 100 * MiB, 0)
        second = guard.check(1)
    assert not first.stop and second.stop and second.trigger == "reserve"
    assert len(group.sent) == 1
    assert any("decides alone" in r.getMessage() for r in caplog.records)


def test_sync_every_zero_never_reduces(host: FakeHost, monitor: Monitor) -> None:
    group = Group(others=ranks.encode(True, "reserve", 1))
    with Guard(monitor, events=False, sync_every=0, ranks=group) as guard:
        verdicts = [guard.check(step) for step in range(20)]
    assert not any(v.stop for v in verdicts) and group.sent == []


def test_no_torch_no_group(monitor: Monitor) -> None:
    """Without torch.distributed imported, no group is looked for beyond sys.modules (and
    torch is not imported by the guard)."""
    had_torch = "torch" in sys.modules
    assert ranks.torch_ranks() is None or had_torch
    with Guard(monitor, events=False, sync_every=1) as guard:
        assert not guard.check(0).stop
    assert ("torch" in sys.modules) == had_torch


def test_exit_prints_the_verdict_and_uses_the_guard_status(
        host: FakeHost, monitor: Monitor, capsys: pytest.CaptureFixture[str]) -> None:
    host.set_usage("/job", 4 * GiB - 100 * MiB, 0)
    with Guard(monitor, reserve="5%", events=False) as guard:
        verdict = guard.check(42)
        with pytest.raises(SystemExit) as stopped:
            guard.exit(verdict)
    assert stopped.value.code == GUARD_EXIT_STATUS == 75
    err = capsys.readouterr().err
    assert err.startswith("cgwatch guard: save and stop at step 42: cgroup /job: headroom")
    assert "below the reserve" in err
