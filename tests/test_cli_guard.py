"""`cgwatch run --guard` on a fake tree (the real-kernel leak is tests/test_cli_guard_real.py):
the signal sent once the guard decides, the line said then and the line after CMD ended, the
exit status; and the status rule and both lines as tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any, NamedTuple, Optional

import pytest

from cgwatch.cli.runguard import (
    find_saved,
    fire_line,
    guarded_status,
    is_torchrun,
    outcome_line,
    parse_children,
)
from cgwatch.policy import FORECAST, RESERVE, Verdict
from tests.fake_tree import FakeHost, MiB

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A job that saves and exits 0 on SIGTERM / SIGUSR1 (what a training script's handler does).
SAVES_ON = "trap 'echo saved; exit 0' {sig}; echo up; while :; do sleep 0.05; done"


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def host(request: pytest.FixtureRequest, tmp_path: Any) -> FakeHost:
    """/job limited to 64 MiB, using 63 MiB with no inactive file cache: 1 MiB of headroom,
    under the default 5% reserve (3.2 MiB)."""
    host = FakeHost(str(tmp_path), request.param)
    host.make_path({"/job": 64 * MiB})
    host.set_usage("/job", 63 * MiB, 0)
    d = host.level_dir("/job")
    if host.version == 2:
        for name in ("memory.events", "memory.events.local"):
            host.write(f"{d}/{name}", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    else:
        host.write(f"{d}/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
        host.write(f"{d}/memory.failcnt", "0\n")
    host.move_to("/job")
    return host


def cgwatch_run(host: FakeHost, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgwatch.cli", "run", "--root", host.root,
                           *args], capture_output=True, text=True, cwd=PROJECT, timeout=60)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_the_guard_signals_once_and_run_exits_75(host: FakeHost, sig: str) -> None:
    options = ["--guard"] + (["--signal", sig] if sig != "SIGTERM" else [])
    proc = cgwatch_run(host, *options, "--", "sh", "-c", SAVES_ON.format(sig=sig[3:]))
    assert proc.returncode == 75, proc.stderr
    assert proc.stdout == "up\nsaved\n"
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith(f"cgwatch guard: stopping to save: sending {sig} to sh (pid ")
    assert lines[0].endswith("); why: cgroup /job: headroom 1.0 MiB of 64.0 MiB, below the "
                             "reserve of 3.2 MiB")
    assert lines[1].startswith("cgwatch guard: sh saved and exited 0 ")
    assert lines[1].endswith(f" s after {sig}; exit 75 (saved, may be resumed)")


def test_a_job_without_a_handler_saved_nothing_and_run_says_so(host: FakeHost) -> None:
    """sh's default action for SIGTERM: it dies of it, nothing saved: 143, not 75."""
    proc = cgwatch_run(host, "--guard", "--", "sh", "-c",
                       "echo up; while :; do sleep 0.05; done")
    assert proc.returncode == 128 + signal.SIGTERM == 143, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("cgwatch guard: stopping to save: sending SIGTERM to sh (pid ")
    assert lines[1].startswith("cgwatch guard: nothing was saved: sh has no handler for "
                               "SIGTERM and died of it ")
    assert lines[1].endswith(" s after it was sent; exit 143")


def test_the_checkpoint_directory_is_given_and_its_new_entry_named(host: FakeHost,
                                                                   tmp_path: Any) -> None:
    ckpt = os.path.join(str(tmp_path), "ckpt")
    os.mkdir(ckpt)
    with open(os.path.join(ckpt, "old.pt"), "w") as f:
        f.write("before the signal")
    os.utime(os.path.join(ckpt, "old.pt"), (1, 1))
    saves = ("trap 'echo x > \"$CGWATCH_CHECKPOINT_DIR/step-41.pt\"; exit 0' TERM; "
             "echo up; while :; do sleep 0.05; done")
    proc = cgwatch_run(host, "--guard", "--checkpoint-dir", ckpt, "--", "sh", "-c", saves)
    assert proc.returncode == 75, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert f"; checkpoint: {ckpt}/step-41.pt; exit 75 (saved, may be resumed)" in last, last


def test_a_job_that_fails_its_save_keeps_its_status(host: FakeHost) -> None:
    proc = cgwatch_run(host, "--guard", "--", "sh", "-c",
                       "trap 'exit 3' TERM; echo up; while :; do sleep 0.05; done")
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("cgwatch guard: stopping to save: sending SIGTERM to sh")
    assert lines[1].startswith("cgwatch guard: sh exited 3 ")
    assert lines[1].endswith(" s after SIGTERM, not 0 or 75: its save may have failed; exit 3")


def test_json_report_carries_the_verdict(host: FakeHost, tmp_path: Any) -> None:
    report = os.path.join(str(tmp_path), "report.json")
    proc = cgwatch_run(host, "--guard", "--reserve", "2M", "--report", report, "--", "sh",
                       "-c", SAVES_ON.format(sig="TERM"))
    with open(report) as f:
        data = json.load(f)
    assert proc.returncode == data["exit_status"] == 75
    guard = data["guard"]
    assert (guard["trigger"], guard["level"], guard["signal"]) == ("reserve", "/job", "SIGTERM")
    assert (guard["headroom"], guard["reserve"], guard["limit"]) == (1 * MiB, 2 * MiB,
                                                                     64 * MiB)
    assert (guard["saved"], guard["checkpoint"]) == (True, None)
    assert 0 <= guard["seconds_to_exit"] < 30
    assert guard["outcome"].startswith("cgwatch guard: sh saved and exited 0 ")


def test_without_a_reason_nothing_is_sent(host: FakeHost) -> None:
    host.set_usage("/job", 8 * MiB, 0)
    proc = cgwatch_run(host, "--guard", "--", "sh", "-c", "sleep 0.5; exit 4")
    assert (proc.returncode, proc.stdout, proc.stderr) == (4, "", "")


FIRED = Verdict(True, RESERVE, "/job", 64 * MiB, MiB, 3 * MiB)


class Row(NamedTuple):
    returncode: int  # Popen's: -N for death by signal N
    fired: Optional[Verdict]
    signum: Optional[int]
    want: int


STATUS = [
    pytest.param(Row(0, FIRED, signal.SIGUSR1, 75), id="saved-and-exited-0"),
    pytest.param(Row(75, FIRED, signal.SIGTERM, 75), id="saved-and-exited-its-own-75"),
    pytest.param(Row(-signal.SIGTERM, FIRED, signal.SIGTERM, 143),
                 id="died-of-our-signal-nothing-saved"),
    pytest.param(Row(-signal.SIGUSR1, FIRED, signal.SIGUSR1, 138),
                 id="died-of-our-sigusr1-nothing-saved"),
    pytest.param(Row(3, FIRED, signal.SIGTERM, 3), id="save-failed"),
    pytest.param(Row(1, FIRED, signal.SIGTERM, 1), id="torchrun-s-1"),
    pytest.param(Row(-signal.SIGKILL, FIRED, signal.SIGTERM, 137), id="killed-anyway"),
    pytest.param(Row(0, None, signal.SIGTERM, 0), id="guard-never-fired"),
    pytest.param(Row(75, None, signal.SIGTERM, 75), id="own-75-without-a-fire"),
    pytest.param(Row(-signal.SIGTERM, None, signal.SIGTERM, 143), id="someone-else-s-term"),
    pytest.param(Row(0, None, None, 0), id="no-guard"),
    pytest.param(Row(2, None, None, 2), id="no-guard-failed"),
]


@pytest.mark.parametrize("row", STATUS)
def test_guarded_status(row: Row) -> None:
    assert guarded_status(row.returncode, row.fired, row.signum) == row.want


class Said(NamedTuple):
    returncode: int
    signum: int
    seconds: float
    directory: Optional[str]
    saved_to: Optional[str]
    want: str
    workers: int = 0  # torchrun's workers signalled instead of CMD


OUTCOMES = [
    pytest.param(Said(0, signal.SIGTERM, 3.14, None, None,
                      "cgwatch guard: train saved and exited 0 3.1 s after SIGTERM; exit 75 "
                      "(saved, may be resumed)"), id="saved-where-unknown"),
    pytest.param(Said(75, signal.SIGUSR1, 42.4, "/ckpt", "/ckpt/step-41",
                      "cgwatch guard: train saved and exited 75 42 s after SIGUSR1; checkpoint: "
                      "/ckpt/step-41; exit 75 (saved, may be resumed)"), id="saved-named"),
    pytest.param(Said(0, signal.SIGTERM, 0.5, "/ckpt", None,
                      "cgwatch guard: train saved and exited 0 0.5 s after SIGTERM; nothing in "
                      "/ckpt changed since the signal; exit 75 (saved, may be resumed)"),
                 id="saved-but-nothing-new-in-the-directory"),
    pytest.param(Said(-signal.SIGTERM, signal.SIGTERM, 0.01, "/ckpt", None,
                      "cgwatch guard: nothing was saved: train has no handler for SIGTERM and "
                      "died of it 0.0 s after it was sent; exit 143"), id="no-handler"),
    pytest.param(Said(-signal.SIGKILL, signal.SIGTERM, 1.5, None, None,
                      "cgwatch guard: train was killed by SIGKILL 1.5 s after SIGTERM, before "
                      "it could finish a save; exit 137"), id="killed-during-the-save"),
    pytest.param(Said(1, signal.SIGTERM, 2.0, None, None,
                      "cgwatch guard: train exited 1 2.0 s after SIGTERM, not 0 or 75: its "
                      "save may have failed; exit 1"), id="failed"),
    pytest.param(Said(0, signal.SIGTERM, 6.2, "/ckpt", "/ckpt/rank-1.json",
                      "cgwatch guard: train's 2 worker(s) saved and exited 0 6.2 s after "
                      "SIGTERM; checkpoint: /ckpt/rank-1.json; exit 75 (saved, may be resumed)",
                      2), id="torchrun-every-worker-saved"),
    pytest.param(Said(1, signal.SIGTERM, 0.3, None, None,
                      "cgwatch guard: train exited 1 0.3 s after SIGTERM to its 2 worker(s): at "
                      "least one did not save and exit 0 (its summary above names it); exit 1",
                      2), id="torchrun-a-worker-did-not-save"),
    pytest.param(Said(-signal.SIGKILL, signal.SIGTERM, 1.5, None, None,
                      "cgwatch guard: train was killed by SIGKILL 1.5 s after SIGTERM, before "
                      "it could finish a save; exit 137", 2), id="torchrun-killed"),
]


@pytest.mark.parametrize("said", OUTCOMES)
def test_outcome_line(said: Said) -> None:
    assert outcome_line("train", said.returncode, said.signum, said.seconds, said.directory,
                        said.saved_to, said.workers) == said.want


class Fire(NamedTuple):
    verdict: Verdict
    want: str


FIRES = [
    pytest.param(Fire(FIRED, "cgwatch guard: stopping to save: sending SIGTERM to train (pid 7); "
                             "why: cgroup /job: headroom 1.0 MiB of 64.0 MiB, below the "
                             "reserve of 3.0 MiB"), id="reserve"),
    pytest.param(Fire(Verdict(True, FORECAST, "/job", 64 * MiB, 16 * MiB, None, float(MiB),
                              16.0, 3.0),
                      "cgwatch guard: stopping to save: sending SIGTERM to train (pid 7); "
                      "why: cgroup /job: predicted to reach its limit in ~16 s (working set "
                      "growing 1.0 MiB/s, headroom 16.0 MiB of 64.0 MiB), within the guard's "
                      "lead of ~3.0 s"),
                 id="forecast"),
]


@pytest.mark.parametrize("fire", FIRES)
def test_fire_line(fire: Fire) -> None:
    assert fire_line(fire.verdict, signal.SIGTERM, "train", [7]) == fire.want


def test_fire_line_to_torchrun_s_workers() -> None:
    assert fire_line(FIRED, signal.SIGTERM, "torchrun", [41, 42], workers=True) == (
        "cgwatch guard: stopping to save: sending SIGTERM to torchrun's 2 worker(s) (pid 41, "
        "42); why: cgroup /job: headroom 1.0 MiB of 64.0 MiB, below the reserve of 3.0 MiB")


@pytest.mark.parametrize("command, expected", [
    (["torchrun", "--nproc_per_node", "2", "job.py"], True),
    (["/venv/bin/torchrun", "job.py"], True),
    (["python3", "-m", "torch.distributed.run", "--nproc_per_node", "2", "job.py"], True),
    (["/usr/bin/python3.11", "-m", "torch.distributed.run", "job.py"], True),
    (["python", "job.py", "torchrun"], False),
    (["python", "-m", "torch.distributed.launch", "job.py"], False),  # the old launcher
    (["deepspeed", "job.py"], False),
    ([], False),
])
def test_is_torchrun(command: list[str], expected: bool) -> None:
    assert is_torchrun(command) == expected


@pytest.mark.parametrize("texts, expected", [
    (["4242 4243 "], [4242, 4243]),  # /proc/PID/task/PID/children: a space after each
    (["", "4243 ", "4242 4243 "], [4242, 4243]),  # threads' files, a pid listed twice
    ([""], []),
    ([], []),
])
def test_parse_children(texts: list[str], expected: list[int]) -> None:
    assert parse_children(texts) == expected


def test_find_saved_names_the_newest_entry_changed_since(tmp_path: Any) -> None:
    d = str(tmp_path)
    for name, mtime in (("old.pt", 100.0), ("step-40", 200.0), ("step-41", 300.0)):
        if "step" in name:
            os.mkdir(os.path.join(d, name))
        else:
            open(os.path.join(d, name), "w").close()
        os.utime(os.path.join(d, name), (mtime, mtime))
    assert find_saved(d, 150.0) == os.path.join(d, "step-41")
    assert find_saved(d, 301.0) is None
    assert find_saved(os.path.join(d, "missing"), 0.0) is None


def test_find_saved_prefers_a_checkpoint_named_by_its_step_to_a_newer_log(
        tmp_path: Any) -> None:
    # An HF job under --save-delay appends its losses in the checkpoint directory after
    # checkpoint-1128/ was written: the checkpoint is what was saved, not the log.
    d = str(tmp_path)
    for name, mtime in (("checkpoint-1000", 100.0), ("checkpoint-1128", 200.0),
                        ("losses.log", 210.0)):
        if name.startswith("checkpoint"):
            os.mkdir(os.path.join(d, name))
        else:
            open(os.path.join(d, name), "w").close()
        os.utime(os.path.join(d, name), (mtime, mtime))
    assert find_saved(d, 150.0) == os.path.join(d, "checkpoint-1128")
    assert find_saved(d, 205.0) == os.path.join(d, "losses.log")  # no checkpoint since
