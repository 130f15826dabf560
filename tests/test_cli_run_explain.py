"""`cgwatch run`'s pure parts: exit status mapping, which cgroup ran out of memory, and the
text it prints. The real OOM kill is in tests/test_events_real.py."""

from __future__ import annotations

import signal
from typing import Any, Optional

import pytest

from cgwatch.cli.explain import Culprit, Report, explain, find_culprit
from cgwatch.cli.run import exit_status
from cgwatch.event import Event

MiB = 1 << 20


@pytest.mark.parametrize("returncode, expected", [
    (0, 0), (3, 3), (255, 255), (-9, 137), (-15, 143), (-2, 130), (-6, 134),
])
def test_exit_status(returncode: int, expected: int) -> None:
    assert exit_status(returncode) == expected


def ev(counter: str, level: int, path: str, old: int = 0, new: int = 1,
       limit: Optional[int] = None, version: int = 1, **kw: Any) -> Event:
    return Event(path, "/sys/fs/cgroup" + path, level, counter, old, new, limit, 10 * MiB,
                 0.0, "memory.events" if version == 2 else "memory.oom_control", version, **kw)


LIMITED = [("/job", "/sys/fs/cgroup/job", 64 * MiB), ("/", "/sys/fs/cgroup", 8192 * MiB)]


@pytest.mark.parametrize("events, limited, expected", [
    # v1: the OOM notification names the level
    ([ev("oom_kill", 0, "/job/leaf"), ev("oom", 1, "/job", limit=64 * MiB)], LIMITED,
     Culprit("/job", "/sys/fs/cgroup/job", 64 * MiB, True)),
    # v1 without eventfd: failcnt at the limited level
    ([ev("oom_kill", 0, "/job/leaf"), ev("failcnt", 1, "/job", 0, 300, limit=64 * MiB)],
     LIMITED, Culprit("/job", "/sys/fs/cgroup/job", 64 * MiB, True)),
    # v2: the level whose own (local) oom rose, not the ancestors it propagated to
    ([ev("oom", 1, "/job", limit=64 * MiB, version=2, local_old=0, local_new=1),
      ev("oom", 2, "/", limit=8192 * MiB, version=2, local_old=0, local_new=0,
         propagated=True)],
     LIMITED, Culprit("/job", "/sys/fs/cgroup/job", 64 * MiB, True)),
    # nothing says where: the smallest limit on the path, marked uncertain
    ([ev("oom_kill", 0, "/job/leaf")], LIMITED,
     Culprit("/job", "/sys/fs/cgroup/job", 64 * MiB, False)),
    # no limit anywhere: the host ran out
    ([ev("oom_kill", 0, "/job/leaf")], [], None),
])
def test_find_culprit(events: list[Event], limited: list[tuple[str, str, int]],
                      expected: Optional[Culprit]) -> None:
    assert find_culprit(events, limited) == expected


KILL = ev("oom_kill", 0, "/job")


def flat(text: str) -> str:
    """The message without its prefixes and line wrapping."""
    return " ".join(line[len("cgwatch: "):].strip() for line in text.splitlines())
CULPRIT = Culprit("/job", "/sys/fs/cgroup/job", 64 * MiB, True)


def test_explain_killed_command() -> None:
    text = explain(Report("python", 137, signal.SIGKILL, (KILL,), CULPRIT, 64 * MiB,
                          "memory.max_usage_in_bytes"))
    lines = text.splitlines()
    assert all(line.startswith("cgwatch: ") for line in lines)
    assert "python was killed by the kernel's OOM killer (SIGKILL, exit status 137)" in text
    assert "cgroup      /job\n" in text
    assert "limit       64.0 MiB (67108864 bytes)" in text
    assert "peak usage  64.0 MiB (memory.max_usage_in_bytes)" in text
    assert "OOM kills   1 in /job while python ran" in text
    assert "what to do" in text and "cgwatch.available_memory()" in flat(text)
    assert max(len(line) for line in lines) <= 100


def test_explain_survivor_and_unknown_peak() -> None:
    text = flat(explain(Report("make", 2, None, (KILL,), CULPRIT, None, "")))
    assert "while make ran, the kernel's OOM killer killed a process in /job" in text
    assert "make exited with status 2" in text
    assert "peak usage  not reported by this kernel" in text


def test_explain_uncertain_culprit_and_host_oom() -> None:
    text = explain(Report("x", 137, 9, (KILL,), Culprit("/job", "/d", 64 * MiB, False), None,
                          ""))
    assert "/job (the smallest limit on the path)" in text
    text = flat(explain(Report("x", 137, 9, (KILL,), None, None, "")))
    assert "the host itself ran out of memory" in text
