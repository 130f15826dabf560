"""`cgwatch run --guard` on a fake tree (the real-kernel leak is tests/test_cli_guard_real.py):
the signal sent once the guard decides, the one line said, the exit status; and the status
rule as a table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any, NamedTuple, Optional

import pytest

from cgwatch.cli.runguard import guarded_status
from cgwatch.policy import RESERVE, Verdict
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
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("cgwatch guard: save and stop: cgroup /job: headroom 1.0 MiB of "
                               f"64.0 MiB, below the reserve of 3.2 MiB; sending {sig} to sh "
                               "(pid ")


def test_a_job_that_fails_its_save_keeps_its_status(host: FakeHost) -> None:
    proc = cgwatch_run(host, "--guard", "--", "sh", "-c",
                       "trap 'exit 3' TERM; echo up; while :; do sleep 0.05; done")
    assert proc.returncode == 3, proc.stderr
    assert "cgwatch guard: save and stop" in proc.stderr


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
    pytest.param(Row(-signal.SIGTERM, FIRED, signal.SIGTERM, 75), id="died-of-our-signal"),
    pytest.param(Row(3, FIRED, signal.SIGTERM, 3), id="save-failed"),
    pytest.param(Row(-signal.SIGKILL, FIRED, signal.SIGTERM, 137), id="killed-anyway"),
    pytest.param(Row(0, None, signal.SIGTERM, 0), id="guard-never-fired"),
    pytest.param(Row(-signal.SIGTERM, None, signal.SIGTERM, 143), id="someone-else-s-term"),
    pytest.param(Row(0, None, None, 0), id="no-guard"),
]


@pytest.mark.parametrize("row", STATUS)
def test_guarded_status(row: Row) -> None:
    assert guarded_status(row.returncode, row.fired, row.signum) == row.want
