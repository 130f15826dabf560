"""cgwatch.slurmctl: asking Slurm's controller once, bounded, every failure said. A stand-in
`scontrol` (a shell script first on PATH) prints what the real one printed in the Slurm tier
(22.05.8), or fails as it did; the real controller is asked in tests/slurm/cases_sampled.py.
Each test uses a job id of its own: answers are kept for the life of the process."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cgwatch.slurm import Declared
from cgwatch.slurmctl import ask, asked

MIB = 1 << 20
LINE = ("JobId={job} JobName=sh UserId=root(0) NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
        "TRES=cpu=1,mem=300M,node=1,billing=1 MinCPUsNode=1 MinMemoryNode=300M "
        "MinTmpDiskNode=0 Command=sh WorkDir=/work Power= ")


def fake_scontrol(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose PATH finds `scontrol` = this shell script body (it appends its
    arguments to tmp_path/calls)."""
    path = tmp_path / "scontrol"
    path.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/calls\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
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
