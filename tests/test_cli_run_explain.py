"""`cgwatch run`'s pure parts: exit status mapping, which cgroup ran out of memory, and the
text it prints. The real OOM kill is in tests/test_events_real.py."""

from __future__ import annotations

import signal
from typing import Any, Optional

import pytest

from cgwatch.cli.child import exit_status
from cgwatch.cli.explain import (
    Above,
    Culprit,
    Report,
    SlurmJob,
    explain,
    explain_rlimit,
    explain_sampled,
    find_culprit,
)
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


HIDDEN = ("(above /ctr)", "/sys/fs/cgroup/ctr", 300 * MiB)  # v1 hierarchical_memory_limit
UNSEEN = ("(above /ctr)", "/sys/fs/cgroup/ctr", None)  # v2: limits above cannot be seen


@pytest.mark.parametrize("events, above, top, expected", [
    # v1: the OOM notification names the level (the highest notified one: notifications
    # reach the memcg that ran out and every cgroup below it)
    ([ev("oom_kill", 0, "/job/leaf"), ev("oom", 1, "/job", limit=64 * MiB)], None, 2,
     Culprit("/job", "/sys/fs/cgroup/job", 64 * MiB, True)),
    ([ev("oom_kill", 0, "/job/leaf"), ev("oom", 0, "/job/leaf", limit=256 * MiB),
      ev("oom", 1, "/job", limit=64 * MiB), ev("failcnt", 1, "/job", 0, 9, limit=64 * MiB)],
     None, 2, Culprit("/job", "/sys/fs/cgroup/job", 64 * MiB, True)),
    # v1 without eventfd: failcnt at the limited level
    ([ev("oom_kill", 0, "/job/leaf"), ev("failcnt", 1, "/job", 0, 300, limit=64 * MiB)],
     None, 2, Culprit("/job", "/sys/fs/cgroup/job", 64 * MiB, True)),
    # two levels' limits were hit: the deepest, marked uncertain
    ([ev("oom_kill", 0, "/job/leaf"), ev("failcnt", 0, "/job/leaf", 0, 3, limit=32 * MiB),
      ev("failcnt", 1, "/job", 0, 300, limit=64 * MiB)],
     None, 2, Culprit("/job/leaf", "/sys/fs/cgroup/job/leaf", 32 * MiB, False)),
    # v2: the level whose own (local) oom rose, not the ancestors it propagated to
    ([ev("oom", 1, "/job", limit=64 * MiB, version=2, local_old=0, local_new=1),
      ev("oom", 2, "/", limit=8192 * MiB, version=2, local_old=0, local_new=0,
         propagated=True)],
     None, 2, Culprit("/job", "/sys/fs/cgroup/job", 64 * MiB, True)),
    # nothing says a visible limit was hit: the host ran out (the smallest limit on the
    # path, which nobody reached, is not named)
    ([ev("oom_kill", 0, "/job/leaf")], None, 2, None),
    ([ev("oom_kill", 0, "/job/leaf", version=2)], None, 2, None),
    # v1, a hidden parent (seen on 6.1 with a subtree bind mount): its OOM notification
    # reaches the container, whose own failcnt stays 0
    ([ev("oom", 0, "/ctr", limit=1024 * MiB), ev("oom_kill", 0, "/ctr")], HIDDEN, 0,
     Culprit(*HIDDEN, True, "above")),
    # ... but the container's own limit when its failcnt rose
    ([ev("oom", 0, "/ctr", limit=1024 * MiB), ev("failcnt", 0, "/ctr", limit=1024 * MiB),
      ev("oom_kill", 0, "/ctr")], HIDDEN, 0,
     Culprit("/ctr", "/sys/fs/cgroup/ctr", 1024 * MiB, True)),
    # v1 hidden parent without notifications (a read-only cgroup mount: no eventfd):
    # likely the limit above, or the host
    ([ev("oom_kill", 0, "/ctr")], HIDDEN, 0, Culprit(*HIDDEN, False, "above")),
    # v2 in a namespace: limits above cannot be seen
    ([ev("oom_kill", 0, "/ctr", version=2)], UNSEEN, 0, Culprit(*UNSEEN, False, "above")),
    # v2 in a namespace, the container's own limit: its own oom says so
    ([ev("oom_kill", 0, "/ctr", version=2),
      ev("oom", 0, "/ctr", limit=64 * MiB, version=2, local_old=0, local_new=1)], UNSEEN, 0,
     Culprit("/ctr", "/sys/fs/cgroup/ctr", 64 * MiB, True)),
])
def test_find_culprit(events: list[Event], above: Optional[Above], top: int,
                      expected: Optional[Culprit]) -> None:
    assert find_culprit(events, above, top) == expected


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
    assert "/job (the deepest of several that hit a limit)" in text
    text = flat(explain(Report("x", 137, 9, (KILL,), None, None, "")))
    assert "the host itself ran out of memory" in text
    assert "raise that cgroup's memory limit" not in text
    assert "A memory limit on this job below the host's RAM" in text


def test_explain_a_hidden_v1_limit() -> None:
    report = Report("python", 137, 9, (ev("oom_kill", 0, "/ctr"),),
                    Culprit(*HIDDEN, True, "above"), 290 * MiB, "memory.max_usage_in_bytes",
                    "/ctr")
    assert report.cause == "above"
    text = " ".join(flat(explain(report)).split())
    assert "the kernel's OOM notification reached /ctr without its own limit being hit" in text
    assert "cgroup (above /ctr)" in text
    assert "limit 300.0 MiB (314572800 bytes, v1 hierarchical_memory_limit)" in text
    assert "peak usage 290.0 MiB at /ctr (memory.max_usage_in_bytes)" in text
    assert "raising this container's own limit would not help" in text
    assert "Kubernetes: the pod's memory limit" in text
    assert "raise that cgroup's memory limit" not in text


def test_explain_a_limit_that_cannot_be_seen() -> None:
    report = Report("python", 137, 9, (ev("oom_kill", 0, "/ctr", version=2),),
                    Culprit(*UNSEEN, False, "above"), None, "", "/ctr")
    text = " ".join(flat(explain(report)).split())
    assert "the kill came from a limit above /ctr, which this process cannot see, or from " \
        "the host running out of memory" in text
    assert "limit cannot be seen from here" in text
    assert "raising this container's own limit would not help" in text
    assert Report("x", 1, None, (), None, None, "").cause == "host"
    assert Report("x", 1, None, (), CULPRIT, None, "").cause == "limit"


# ---- Slurm (layouts of Debian's slurm-wlm 22.05.8, docs/deploy.md "Slurm") -------------------

V1_JOB = "/slurm_vm/uid_0/job_4"
V1_STEP = V1_JOB + "/step_0"
V2_JOB = "/system.slice/vm_slurmstepd.scope/job_4"
V2_STEP_USER = V2_JOB + "/step_0/user"
SLURM_V1 = SlurmJob(4, "0", "--mem=256M", 256 * MiB, True, V1_JOB, V1_STEP)
SLURM_V2 = SlurmJob(4, "0", "--mem=256M", 256 * MiB, True, V2_JOB, V2_STEP_USER)
SAMPLED = SlurmJob(5, "0", "--mem=300M", 300 * MiB, False, None, None)


@pytest.mark.parametrize("events, expected", [
    # v1 task/cgroup: --mem on job_J and step_S (same value); the kill is counted in task_T;
    # the OOM notification reaches the job (where the charge failed first) and everything below
    ([ev("oom_kill", 0, V1_STEP + "/task_0"), ev("oom", 0, V1_STEP + "/task_0"),
      ev("oom", 1, V1_STEP, limit=256 * MiB), ev("oom", 2, V1_JOB, limit=256 * MiB),
      ev("failcnt", 2, V1_JOB, 0, 40, limit=256 * MiB)],
     Culprit(V1_JOB, "/sys/fs/cgroup" + V1_JOB, 256 * MiB, True)),
    # v1 without eventfd: both job and step counted failcnt: the deepest, uncertain
    ([ev("oom_kill", 0, V1_STEP + "/task_0"), ev("failcnt", 1, V1_STEP, 0, 3, limit=256 * MiB),
      ev("failcnt", 2, V1_JOB, 0, 40, limit=256 * MiB)],
     Culprit(V1_STEP, "/sys/fs/cgroup" + V1_STEP, 256 * MiB, False)),
    # v2: memory.max on job_J and step_S/user; the local oom rose at step_S/user
    ([ev("oom_kill", 0, V2_STEP_USER + "/task_0", version=2),
      ev("oom", 1, V2_STEP_USER, limit=256 * MiB, version=2, local_old=0, local_new=1),
      ev("oom", 3, V2_JOB, limit=256 * MiB, version=2, local_old=0, local_new=0,
         propagated=True)],
     Culprit(V2_STEP_USER, "/sys/fs/cgroup" + V2_STEP_USER, 256 * MiB, True)),
])
def test_find_culprit_in_slurm_jobs(events: list[Event], expected: Culprit) -> None:
    assert find_culprit(events, None, 4) == expected


def test_explain_in_a_slurm_job_names_job_step_and_mem() -> None:
    for slurm, culprit, role in (
            (SLURM_V1, Culprit(V1_JOB, "/sys/fs/cgroup" + V1_JOB, 256 * MiB, True), "[job 4]"),
            (SLURM_V2, Culprit(V2_STEP_USER, "/d", 256 * MiB, True), "[step 4.0]")):
        report = Report("python", 137, signal.SIGKILL,
                        (ev("oom_kill", 0, "/t", limit=None),), culprit, 250 * MiB,
                        "memory.max_usage_in_bytes", slurm=slurm)
        text = flat(explain(report))
        assert role in text
        assert "job 4, step 4.0, --mem=256M" in text
        assert "sacct -j 4 -o JobID,MaxRSS,ReqMem,State" in text
        assert "--mem=" in text and "docker" not in text


@pytest.mark.parametrize("sig, status, kills, slurm, says", [
    (signal.SIGKILL, 137, 0, SAMPLED, True),  # the sampled kill, seen on 22.05
    (None, 137, 0, SAMPLED, True),  # `cgwatch run -- srun ...`: srun exits 137 (22.05)
    (signal.SIGKILL, 137, 1, SAMPLED, False),  # an OOM kill was counted: the kernel did it
    (signal.SIGKILL, 137, 0, SLURM_V1, False),  # a cgroup enforces --mem: not sampling
    (signal.SIGTERM, 143, 0, SAMPLED, False),  # time limit / scancel: SIGTERM first
    (None, 1, 0, SAMPLED, False),
    (signal.SIGKILL, 137, 0, None, False),  # not in a job
    (signal.SIGKILL, 137, 0, SlurmJob(6, "0", None, None, False), False),  # nothing declared
])
def test_explain_sampled(sig: Optional[int], status: int, kills: int,
                         slurm: Optional[SlurmJob], says: bool) -> None:
    text = explain_sampled("python", status, sig, kills, slurm)
    assert (text is not None) == says
    if text is not None:
        assert "slurmstepd's memory sampling" in flat(text)
        assert "sacct -j 5" in flat(text) and "--mem=300M" in flat(text)


@pytest.mark.parametrize("status, sig, rlimits, says", [
    (1, None, [("RLIMIT_AS", 1 << 30)], True),  # Python: uncaught MemoryError exits 1
    (134, signal.SIGABRT, [("RLIMIT_AS", 1 << 30)], True),  # C++: uncaught std::bad_alloc
    (1, None, [("RLIMIT_DATA", 1 << 30)], True),
    (1, None, [], False),  # no limit: exit 1 says nothing
    (0, None, [("RLIMIT_AS", 1 << 30)], False),
    (2, None, [("RLIMIT_AS", 1 << 30)], False),
    (137, signal.SIGKILL, [("RLIMIT_AS", 1 << 30)], False),  # not how an rlimit ends a process
])
def test_explain_rlimit(status: int, sig: Optional[int], rlimits: list[tuple[str, int]],
                        says: bool) -> None:
    text = explain_rlimit("python", status, sig, rlimits)
    assert (text is not None) == says
    if text is not None:
        assert "MemoryError or std::bad_alloc" in flat(text)
        assert ("ulimit -v" if rlimits[0][0] == "RLIMIT_AS" else "ulimit -d") in flat(text)
