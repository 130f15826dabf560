"""cgwatch.slurmctl: asking Slurm's controller once, bounded, every failure said. A stand-in
`scontrol` (a shell script first on PATH) prints what the real one printed in the Slurm tier
(22.05.8), or fails as it did; the real controller is asked in tests/slurm/cases_sampled.py.
Each test uses a job id of its own: answers are kept for the life of the process."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cgwatch.slurm import Declared
from cgwatch.slurmctl import ask, ask_shared, asked, shared_name, step_started_at

MIB = 1 << 20
LINE = ("JobId={job} JobName=sh UserId=root(0) NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
        "TRES=cpu=1,mem=300M,node=1,billing=1 MinCPUsNode=1 MinMemoryNode=300M "
        "MinTmpDiskNode=0 Command=sh WorkDir=/work Power= ")


def fake_scontrol(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose PATH finds `scontrol` = this shell script body (it appends its
    arguments to tmp_path/calls)."""
    # Written beside and renamed into place: a script rewritten in place can be executed
    # while a thread's fork still holds the writer's descriptor (exec fails with ETXTBSY;
    # test_a_shared_failure_is_asked_again_after_the_back_off failed 2 runs in ~15 so).
    path, new = tmp_path / "scontrol", tmp_path / "scontrol.new"
    new.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/calls\n{body}\n")
    new.chmod(new.stat().st_mode | stat.S_IXUSR)
    os.replace(new, path)
    return {"PATH": f"{tmp_path}:{os.environ.get('PATH', '')}", "SLURM_CPUS_ON_NODE": "1"}


def calls(tmp_path: Path) -> list[str]:
    p = tmp_path / "calls"
    return p.read_text().splitlines() if p.exists() else []


def test_asks_once_and_keeps_the_answer(tmp_path: Path) -> None:
    env = fake_scontrol(tmp_path, f"echo '{LINE.format(job=900001)}'")
    assert asked(900001) is None
    first = ask(Declared(900001, "0", None, None), env)
    assert (first.limit, first.option, first.problem) == (300 * MIB, "--mem=300M", None)
    again = ask(Declared(900001, "1", None, None), env)
    assert (again.limit, again.step) == (300 * MIB, "1")
    assert calls(tmp_path) == ["show job -o 900001"]
    assert asked(900001) == first


def test_controller_unreachable_is_said_and_not_asked_again(tmp_path: Path) -> None:
    env = fake_scontrol(tmp_path, "echo 'slurm_load_jobs error: Unable to contact slurm "
                                  "controller (connect failure)' >&2; exit 1")
    got = ask(Declared(900002, "0", None, None), env)
    assert got.limit is None
    assert got.problem == (
        "the controller could not say what Slurm job 900002 declared (scontrol exited 1: "
        "slurm_load_jobs error: Unable to contact slurm controller (connect failure)): "
        "total_memory() is what the cgroups say")
    ask(Declared(900002, "0", None, None), env)
    assert len(calls(tmp_path)) == 1


def test_a_failed_ask_is_tried_again_after_the_back_off(tmp_path: Path) -> None:
    # the controller was down at the first snapshot and is back: the limit is learnt
    down = fake_scontrol(tmp_path, "echo 'Unable to contact slurm controller' >&2; exit 1")
    got = ask(Declared(900006, "0", None, None), down, retry_after=0.0)
    assert got.limit is None and got.problem is not None
    up = fake_scontrol(tmp_path, f"echo '{LINE.format(job=900006)}'")
    got = ask(Declared(900006, "0", None, None), up, retry_after=0.0)
    assert (got.limit, got.problem) == (300 * MIB, None)
    ask(Declared(900006, "0", None, None), up, retry_after=0.0)  # a real answer is final
    assert len(calls(tmp_path)) == 2


def test_a_hanging_scontrol_is_cut_after_the_timeout(tmp_path: Path) -> None:
    # the real one retries for ~18 s with slurmctld down
    env = fake_scontrol(tmp_path, "exec sleep 30")
    got = ask(Declared(900003, "0", None, None), env, timeout=0.3)
    assert got.limit is None and got.problem is not None
    assert "(scontrol gave no answer in 0.3 s)" in got.problem


def test_scontrol_not_on_path(tmp_path: Path) -> None:
    got = ask(Declared(900004, "0", None, None), {"PATH": str(tmp_path)})
    assert got.limit is None and got.problem is not None
    assert "(scontrol is not on PATH)" in got.problem


def test_an_answer_not_understood_is_said(tmp_path: Path) -> None:
    env = fake_scontrol(tmp_path, "echo 'JobId=900005 JobName=sh'")
    got = ask(Declared(900005, "0", None, None), env)
    assert got.limit is None and got.problem is not None
    assert "scontrol's answer not understood: no MinMemoryNode or MinMemoryCPU" in got.problem


# ---- one ask per step and node: the answer shared through a file of the job ----------------


def test_the_tasks_of_a_step_share_one_ask(tmp_path: Path) -> None:
    """8 processes of one step (under a stand-in `slurmstepd`: a shell of that name, as
    slurmstepd is the tasks' ancestor), started together, with a stand-in scontrol that is
    slow to answer: one call, and every process has the limit (the others waited for the
    asker's lock and read its answer). A generous timeout: the machine may be loaded."""
    env = fake_scontrol(tmp_path, f"sleep 0.3; echo '{LINE.format(job=900010)}'")
    shared = tmp_path / "tmp"
    shared.mkdir()
    stepd = tmp_path / "slurmstepd"
    stepd.write_bytes(Path("/bin/sh").read_bytes())
    stepd.chmod(0o755)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import os; "
            "from cgwatch.slurm import Declared; from cgwatch.slurmctl import ask; "
            "got = ask(Declared(900010, '0', None, None), os.environ, timeout=30); "
            "print(got.limit, got.problem)")
    repo = str(Path(__file__).resolve().parent.parent)
    tasks = " ".join(f"{sys.executable} -c \"{code}\" {repo} > {tmp_path}/out{i} &"
                     for i in range(8))
    run = subprocess.run([str(stepd), "-c", f"{tasks} wait"], timeout=60,
                         env={**os.environ, **env, "TMPDIR": str(shared)})
    assert run.returncode == 0
    assert [(tmp_path / f"out{i}").read_text() for i in range(8)] == [f"{300 * MIB} None\n"] * 8
    assert calls(tmp_path) == ["show job -o 900010"]
    (answer,) = shared.iterdir()
    assert answer.name == f"cgwatch-slurm-900010-{os.geteuid()}"
    assert answer.stat().st_mode & 0o777 == 0o600


def _shared(tmp_path: Path, declared: Declared, env: dict[str, str], *, since: float,
            retry_after: float = 60.0) -> Declared:
    # A generous timeout: a stand-in shell script took over 3 s at load 50 here.
    return ask_shared(declared, env, 30.0, retry_after, since=since, dirs=[str(tmp_path)])


def test_a_shared_failure_is_asked_again_after_the_back_off(tmp_path: Path) -> None:
    down = fake_scontrol(tmp_path, "echo 'Unable to contact slurm controller' >&2; exit 1")
    job = Declared(900011, "0", None, None)
    first = _shared(tmp_path, job, down, since=0.0)
    assert first.limit is None and first.problem is not None
    assert "(scontrol exited 1: Unable to contact slurm controller)" in first.problem
    assert _shared(tmp_path, job, down, since=0.0) == first  # another task: no call
    assert len(calls(tmp_path)) == 1
    up = fake_scontrol(tmp_path, f"echo '{LINE.format(job=900011)}'")
    got = _shared(tmp_path, job, up, since=0.0, retry_after=0.0)
    assert (got.limit, got.problem) == (300 * MIB, None)
    assert _shared(tmp_path, job, up, since=0.0, retry_after=0.0).limit == 300 * MIB  # final
    assert len(calls(tmp_path)) == 2


def test_an_answer_from_before_the_step_started_is_asked_again(tmp_path: Path) -> None:
    """An earlier job of the same id (the ids wrapped, a test cluster restarted) left its
    answer: it was asked before our step started, and is not trusted."""
    env = fake_scontrol(tmp_path, f"echo '{LINE.format(job=900012)}'")
    path = tmp_path / shared_name(900012, os.geteuid())
    path.write_text(f"cgwatch-slurm-answer 1 job=900012 asked={time.time() - 60:.3f} ok=1\n"
                    f"{LINE.format(job=900012).replace('300M', '9G')}\n")
    path.chmod(0o600)
    got = _shared(tmp_path, Declared(900012, "0", None, None), env, since=time.time() - 5)
    assert got.limit == 300 * MIB
    assert len(calls(tmp_path)) == 1


@pytest.mark.parametrize("trap", ["open-to-others", "owned-by-another-uid", "symlink"])
def test_an_answer_file_not_ours_alone_is_never_read(tmp_path: Path, trap: str) -> None:
    """Another user can make the name first, with a wrong limit: a file open to others,
    owned by another uid, or a symlink is passed over, and we ask ourselves."""
    env = fake_scontrol(tmp_path, f"echo '{LINE.format(job=900013)}'")
    path = tmp_path / shared_name(900013, os.geteuid())
    lie = (f"cgwatch-slurm-answer 1 job=900013 asked={time.time():.3f} ok=1\n"
           f"{LINE.format(job=900013).replace('300M', '9G')}\n")
    if trap == "symlink":
        (tmp_path / "elsewhere").write_text(lie)
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.write_text(lie)
        path.chmod(0o644 if trap == "open-to-others" else 0o600)
        if trap == "owned-by-another-uid":
            if os.geteuid() != 0:
                pytest.skip("chown needs root")
            os.chown(path, 43118, 43118)
    got = _shared(tmp_path, Declared(900013, "0", None, None), env, since=0.0)
    assert got.limit == 300 * MIB
    assert len(calls(tmp_path)) == 1


def test_an_old_answer_file_of_another_job_is_pruned(tmp_path: Path) -> None:
    env = fake_scontrol(tmp_path, f"echo '{LINE.format(job=900014)}'")
    old = tmp_path / shared_name(900001, os.geteuid())
    recent = tmp_path / shared_name(900002, os.geteuid())
    for path in (old, recent):
        path.write_text("")
    day_ago = time.time() - 86400 - 60
    os.utime(old, (day_ago, day_ago))
    _shared(tmp_path, Declared(900014, "0", None, None), env, since=0.0)
    assert sorted(p.name for p in tmp_path.glob("cgwatch-slurm-*")) == [
        shared_name(900002, os.geteuid()), shared_name(900014, os.geteuid())]


def test_no_slurmstepd_above_us() -> None:
    assert step_started_at() is None  # pytest is not a Slurm task
