"""The command's conventions as a user meets them: `python -m cgwatch`, `--version`, the
subcommands in the usage line, a closed output pipe, impossible values as usage errors (exit 2,
one line, no traceback), and the help that documents sizes and exit statuses."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

import cgwatch
from tests.fake_tree import FakeHost, MiB

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgwatch", *args], capture_output=True,
                          text=True, cwd=PROJECT, timeout=30, **kw)


@pytest.fixture
def host(tmp_path: Any) -> FakeHost:
    host = FakeHost(str(tmp_path), 1)
    host.make_path({"/job": 64 * MiB})
    host.write(f"{host.level_dir('/job')}/memory.failcnt", "0\n")
    host.move_to("/job")
    return host


@pytest.mark.parametrize("option", ["--version", "-V"])
def test_version(option: str) -> None:
    proc = run(option)
    assert proc.returncode == 0 and proc.stdout == f"cgwatch {cgwatch.__version__}\n"


def test_help_lists_subcommands_sizes_and_exit_statuses() -> None:
    proc = run("--help")
    assert proc.returncode == 0
    usage = " ".join(proc.stdout.split("\n\n")[0].split())  # argparse wraps a long one
    assert usage.startswith("usage: cgwatch ") and "{watch,run" in usage
    flat = " ".join(proc.stdout.split())
    for text in ("watch ", "run ", "512M = 512Mi = 512MiB = 512MB", "141",
                 "2 usage error", "128+N", "75 (EX_TEMPFAIL"):
        assert text in flat, text


def test_python_dash_m_cgwatch_runs_the_table(host: FakeHost) -> None:
    proc = run("--root", host.root)
    assert proc.returncode == 0 and "total_memory:     64.0 MiB" in proc.stdout


@pytest.mark.parametrize("argv, message", [
    (["watch", "--interval", "0"], "must be a positive number of seconds"),
    (["watch", "--interval", "-1"], "must be a positive number of seconds"),
    (["watch", "--interval", "nan"], "must be a positive number of seconds"),
    (["watch", "--interval", "inf"], "must be a positive number of seconds"),
    (["watch", "--interval", "soon"], "not a number of seconds"),
    (["watch", "--below", "9" * 400 + "G"], "too long"),
    (["watch", "--below", "１２３M"], "not a size or percentage"),
    (["watch", "--below", "0"], "positive"),
    (["watch", "--below", "100%"], "between 0 and 1"),
    (["watch", "--shm-above", "0"], "above 0 and at most 100"),
    (["watch", "--shm-above", "101%"], "above 0 and at most 100"),
    (["--json", "watch"], "--json before 'watch'"),
    (["run", "--signal", "SIGUSR1", "--", "true"], "--signal needs --guard"),
    (["run", "--reserve", "5%", "--", "true"], "--reserve needs --guard"),
    (["run", "--guard", "--signal", "SIGNOPE", "--", "true"], "not a signal name"),
    (["run", "--guard", "--signal", "0", "--", "true"], "not a signal number"),
    (["run", "--guard", "--checkpoint-seconds", "-1", "--", "true"], "0 or more seconds"),
    (["run", "--guard", "--reserve", "100%", "--", "true"], "between 0 and 1"),
    (["run", "--observe", "--", "true"], "--observe needs --guard"),
    (["replay", "x.rec", "--margin", "0.5"], "must be 1 or more"),
    (["replay", "x.rec", "--checkpoint-seconds", "-1"], "0 or more seconds"),
    (["--frobnicate"], "unrecognized arguments"),
])
def test_impossible_values_are_usage_errors(host: FakeHost, argv: list[str],
                                            message: str) -> None:
    proc = run(*argv[:1], "--root", host.root, *argv[1:])
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("argv", [["--json"], []])
def test_closed_pipe_ends_quietly(host: FakeHost, argv: list[str]) -> None:
    """The reader is gone before the first write (`| head -1` that already exited): exit 141
    (128 + SIGPIPE, as `yes` shows in PIPESTATUS), nothing on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "cgwatch", "--root", host.root, *argv],
                              stdout=write_end, stderr=subprocess.PIPE, text=True,
                              cwd=PROJECT, timeout=30)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_watch_into_a_closed_pipe_ends_quietly(host: FakeHost) -> None:
    """`cgwatch watch | head -3`: head exits after the start record; the next line (an
    event) finds the pipe closed: exit 141, no traceback. (Like `tail -f`, watch can only
    notice at its next write.)"""
    proc = subprocess.Popen([sys.executable, "-m", "cgwatch", "watch", "--root", host.root,
                             "--interval", "0.05"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=PROJECT)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith("cgwatch watch: cgroup v1 /job")
        proc.stdout.close()
        host.write(f"{host.level_dir('/job')}/memory.failcnt", "7\n")
        assert proc.wait(timeout=20) == 141
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)  # waits, and closes the pipes
