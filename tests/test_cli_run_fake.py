"""`cgwatch run` and `cgwatch watch` as commands, on fake trees (--root): exit statuses, the
explanation, silence when nothing happened, watch's lines and its clean stop. The real OOM
kill is in tests/test_events_real.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.fake_tree import FakeHost, GiB, MiB

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def host(request: pytest.FixtureRequest, tmp_path: Any) -> FakeHost:
    host = FakeHost(str(tmp_path), request.param)
    host.make_path({"/job": 64 * MiB, "/job/task": None})
    for path in ("/job", "/job/task"):
        d = host.level_dir(path)
        if host.version == 2:
            for name in ("memory.events", "memory.events.local"):
                host.write(f"{d}/{name}", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
            host.write(f"{d}/memory.peak", f"{64 * MiB}\n")
        else:
            host.write(f"{d}/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
            host.write(f"{d}/memory.failcnt", "0\n")
            host.write(f"{d}/memory.max_usage_in_bytes", f"{64 * MiB}\n")
    host.move_to("/job/task")
    return host


def cgwatch(host: FakeHost, *args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cgwatch.cli", args[0], "--root", host.root,
                             *args[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=PROJECT, **kw)


def oom_script(host: FakeHost) -> str:
    """A command that does what the kernel does in an OOM kill: count it, then SIGKILL."""
    task, job = host.path(host.level_dir("/job/task")), host.path(host.level_dir("/job"))
    if host.version == 2:
        events = "low 0\\nhigh 0\\nmax 9\\noom 1\\noom_kill 1\\n"
        local = "low 0\\nhigh 0\\nmax 9\\noom 1\\noom_kill 0\\n"
        return (f"printf '{events}' > {task}/memory.events; "
                f"printf '{local}' > {job}/memory.events.local; "
                f"printf '{events}' > {job}/memory.events; kill -KILL $$")
    oom_control = "oom_kill_disable 0\\nunder_oom 0\\noom_kill 1\\n"
    return (f"printf '{oom_control}' > {task}/memory.oom_control; "
            f"echo 40 > {job}/memory.failcnt; kill -KILL $$")


def test_run_explains_a_kill(host: FakeHost) -> None:
    proc = cgwatch(host, "run", "--", "sh", "-c", oom_script(host))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 137
    assert out == ""
    flat = " ".join(" ".join(line.removeprefix("cgwatch:") for line in err.splitlines()).split())
    assert "sh was killed by the kernel's OOM killer (SIGKILL, exit status 137)" in flat
    assert "cgroup /job " in flat and "(the smallest limit" not in flat
    assert "limit 64.0 MiB (67108864 bytes)" in flat
    peak_file = "memory.peak" if host.version == 2 else "memory.max_usage_in_bytes"
    assert f"peak usage 64.0 MiB ({peak_file})" in flat
    assert "OOM kills 1 in /job/task while sh ran" in flat


@pytest.mark.parametrize("script, status", [
    ("exit 0", 0), ("exit 3", 3), ("kill -TERM $$", 143), ("kill -KILL $$", 137),
])
def test_run_is_silent_when_nothing_happened(host: FakeHost, script: str, status: int) -> None:
    proc = cgwatch(host, "run", "--", "sh", "-c", script)
    assert proc.communicate(timeout=30) == ("", "")
    assert proc.returncode == status


def test_run_passes_output_and_arguments_through(host: FakeHost) -> None:
    proc = cgwatch(host, "run", "--", "sh", "-c", 'echo "$1"; echo err >&2', "sh", "a b")
    assert proc.communicate(timeout=30) == ("a b\n", "err\n")


@pytest.mark.parametrize("argv, status, message", [
    (["run", "--", "/nonexistent/cmd"], 127, "command not found"),
    (["run", "--", "{plain_file}"], 126, "Permission denied"),
    (["run"], 2, "give a command"),
])
def test_run_errors(host: FakeHost, argv: list[str], status: int, message: str) -> None:
    plain_file = os.path.join(host.root, "not-a-program")
    with open(plain_file, "w") as f:
        f.write("data\n")
    os.chmod(plain_file, 0o644)
    proc = cgwatch(host, *[a.format(plain_file=plain_file) for a in argv])
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == status and message in err


def test_run_forwards_sigterm(host: FakeHost) -> None:
    proc = cgwatch(host, "run", "--", "sh", "-c", "echo up; exec sleep 30")
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM


def test_watch_lines_and_clean_stop(host: FakeHost) -> None:
    proc = cgwatch(host, "watch", "--interval", "0.05", "--below", "90%")
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith(f"cgwatch watch: cgroup v{host.version} /job/task")
    assert "available" in proc.stdout.readline()
    lines = [proc.stdout.readline() for _ in range(2)]
    assert "events:" in lines[0] and "alerts below 90% of total" in lines[1]
    # 64 MiB limit, 90 MiB usage - 10 MiB inactive: already below 90% -> reported at once
    alert = proc.stdout.readline()
    assert "WARNING available memory 0 B is below 57.6 MiB (90% of total)" in alert
    job = host.level_dir("/job")
    if host.version == 2:
        host.write(f"{job}/memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 2\n")
    else:
        host.write(f"{job}/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    line = proc.stdout.readline()
    assert "ERROR" in line and "cgroup /job: a process was killed by the OOM killer" in line
    assert "(oom_kill 0 -> 2; limit 64.0 MiB" in line
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and err == ""


def test_watch_json_lines(host: FakeHost) -> None:
    host.set_usage("/job", 20 * MiB, 0)
    proc = cgwatch(host, "watch", "--json", "--interval", "0.05")
    assert proc.stdout is not None
    start = json.loads(proc.stdout.readline())
    assert start["type"] == "start" and start["cgroup_path"] == "/job/task"
    assert start["available_memory"] == 44 * MiB and start["total_memory"] == 64 * MiB
    assert start["least_headroom"] == "/job" and start["thresholds"] == []
    name = "memory.events" if host.version == 2 else "memory.failcnt"
    text = "low 0\nhigh 0\nmax 5\noom 0\noom_kill 0\n" if host.version == 2 else "5\n"
    host.write(f"{host.level_dir('/job')}/{name}", text)
    event = json.loads(proc.stdout.readline())
    assert event["type"] == "event" and event["counter"] in ("max", "failcnt")
    assert (event["cgroup_path"], event["old"], event["new"]) == ("/job", 0, 5)
    assert event["limit"] == 64 * MiB and event["time"] <= time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=10)
    assert proc.returncode == 0


def test_plain_command_unchanged(host: FakeHost) -> None:
    """The subcommands leave `cgwatch` and `cgwatch --json` as they were."""
    proc = subprocess.run([sys.executable, "-m", "cgwatch.cli", "--json", "--root", host.root],
                          capture_output=True, text=True, cwd=PROJECT, timeout=30)
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    assert data["total_memory"] == 64 * MiB and data["host"]["mem_total"] == 64 * GiB
