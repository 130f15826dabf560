"""`cgwatch run` and `cgwatch watch` as commands, on fake trees (--root): exit statuses, the
explanation, silence when nothing happened, watch's lines, its coalescing and its clean stop,
run's JSON report and its oom_score_adj. The real OOM kill is in tests/test_events_real.py.

Every command starts with SIGINT at its default (not what this test's parent had: `nohup`,
`cmd &` in a script ignore it, and Python then never raises KeyboardInterrupt) and is killed
at the end of its test if still running."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
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


STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_process_left() -> Iterator[None]:
    """Kill whatever a test started and did not see end (an assert failed midway)."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cgwatch(host: FakeHost, *args: str, **kw: Any) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "cgwatch.cli", args[0], "--root",
                             host.root, *args[1:]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=PROJECT,
                            preexec_fn=_default_sigint, **kw)
    STARTED.append(proc)
    return proc


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
    proc.communicate(timeout=60)
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
    out, err = proc.communicate(timeout=60)
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
    proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_plain_command_unchanged(host: FakeHost) -> None:
    """The subcommands leave `cgwatch` and `cgwatch --json` as they were."""
    proc = subprocess.run([sys.executable, "-m", "cgwatch.cli", "--json", "--root", host.root],
                          capture_output=True, text=True, cwd=PROJECT, timeout=30)
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    assert data["total_memory"] == 64 * MiB and data["host"]["mem_total"] == 64 * GiB


def test_watch_coalesces_a_burst(host: FakeHost) -> None:
    """Rises of one counter at one level within a second: the first at once, the rest as one
    line with their number (issue 11: 937 lines in 25 s at a v2 memory.max)."""
    proc = cgwatch(host, "watch", "--interval", "0.02")
    assert proc.stdout is not None
    for _ in range(3):
        proc.stdout.readline()  # the start record
    job = host.level_dir("/job")
    name = "memory.events" if host.version == 2 else "memory.failcnt"
    counter = "max" if host.version == 2 else "failcnt"

    def set_count(n: int) -> None:
        text = f"low 0\nhigh 0\nmax {n}\noom 0\noom_kill 0\n" if host.version == 2 else f"{n}\n"
        host.write(f"{job}/{name}", text)

    set_count(5)
    first = proc.stdout.readline()
    assert f"({counter} 0 -> 5;" in first and "rises in" not in first
    started = time.monotonic()
    for n in range(10, 60, 5):  # ten more rises, each seen by its own poll
        time.sleep(0.06)
        set_count(n)
    merged = proc.stdout.readline()
    elapsed = time.monotonic() - started
    # The window is the second after the first rise was seen; on a loaded machine this test
    # may read `first` late and write the last rises after the window closed (seen at load
    # ~10). Those open a window of their own: one more line at once and at most one merged.
    later = []
    while " -> 55;" not in (later or [merged])[-1] and len(later) < 2:
        later.append(proc.stdout.readline())
    assert f"({counter} 5 -> " in merged and " -> 55;" in (later or [merged])[-1], (merged, later)
    rises = int(merged.rsplit("[", 1)[1].split()[0])
    assert 2 <= rises <= 10 and merged.rstrip().endswith("rises in 1s]")
    assert elapsed < 3
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == ""
    # whatever the burst left after the merged line, it is at most one more line
    assert len([line for line in out.splitlines() if f"{counter} " in line]) <= 1


def test_run_json_report_names_the_killed_command(host: FakeHost, tmp_path: Any) -> None:
    report_file = tmp_path / "report.json"
    proc = cgwatch(host, "run", "--json", "--report", str(report_file), "--", "sh", "-c",
                   oom_script(host))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 137 and out == ""
    data = json.loads(err)
    assert data == json.loads(report_file.read_text())
    assert data["type"] == "run" and data["exit_status"] == 137 and data["signal"] == "SIGKILL"
    assert data["oom_kills"] == 1 and data["oom_kills_in"] == ["/job/task"]
    assert data["killed_process"]["command"][:2] == ["sh", "-c"]
    assert isinstance(data["killed_process"]["pid"], int) and data["pid"] == \
        data["killed_process"]["pid"]
    assert data["culprit"]["cgroup_path"] == "/job" and data["culprit"]["limit"] == 64 * MiB
    assert any(e["counter"] == "oom_kill" and e["rises"] == 1 for e in data["events"])
    assert any("killed by the kernel's OOM killer" in line for line in data["explanation"])


def test_run_json_when_nothing_happened(host: FakeHost) -> None:
    proc = cgwatch(host, "run", "--json", "--", "sh", "-c", "exit 3")
    out, err = proc.communicate(timeout=30)
    data = json.loads(err)
    assert proc.returncode == 3 and data["exit_status"] == 3 and data["signal"] is None
    assert data["oom_kills"] == 0 and data["killed_process"] is None
    assert data["explanation"] == [] and data["events"] == []


@pytest.mark.parametrize("found, expected", [
    ("0\n", "-500\n"), ("300\n", "-500\n"), ("-499\n", "-500\n"),
    ("-500\n", "-500\n"), ("-900\n", "-900\n"), ("-1000\n", "-1000\n"), ("junk\n", "junk\n"),
])
def test_run_only_lowers_oom_score_adj(host: FakeHost, found: str, expected: str) -> None:
    path = os.path.join(host.root, "proc/self/oom_score_adj")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(found)
    proc = cgwatch(host, "run", "--", "sh", "-c", "exit 0")
    assert proc.communicate(timeout=30) == ("", "") and proc.returncode == 0
    with open(path) as f:
        assert f.read() == expected


def test_run_does_not_write_through_a_link(host: FakeHost, tmp_path: Any) -> None:
    elsewhere = tmp_path / "precious"
    elsewhere.write_text("0\n")
    path = os.path.join(host.root, "proc/self/oom_score_adj")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(elsewhere, path)
    proc = cgwatch(host, "run", "--", "sh", "-c", "exit 0")
    assert proc.communicate(timeout=30) == ("", "") and proc.returncode == 0
    assert elsewhere.read_text() == "0\n" and os.path.islink(path)


def test_run_never_creates_oom_score_adj(host: FakeHost) -> None:
    path = os.path.join(host.root, "proc/self/oom_score_adj")
    if os.path.lexists(path):
        os.unlink(path)
    proc = cgwatch(host, "run", "--", "sh", "-c", "exit 0")
    assert proc.communicate(timeout=30) == ("", "") and proc.returncode == 0
    assert not os.path.lexists(path)


def test_run_verbose_coalesces_a_burst(host: FakeHost) -> None:
    job = host.path(host.level_dir("/job"))
    if host.version == 2:
        writes = "; ".join(f"printf 'low 0\\nhigh 0\\nmax {n}\\noom 0\\noom_kill 0\\n' > "
                           f"{job}/memory.events; sleep 0.1" for n in range(1, 9))
        counter = "max"
    else:
        writes = "; ".join(f"echo {n} > {job}/memory.failcnt; sleep 1.1" for n in range(1, 4))
        counter = "failcnt"
    proc = cgwatch(host, "run", "-v", "--", "sh", "-c", writes + "; sleep 1.5")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == ""
    lines = [line for line in err.splitlines() if f"({counter} " in line]
    assert lines and all(line.startswith("cgwatch: ") for line in lines)
    if host.version == 2:
        # 8 rises 0.1 s apart: the first line at once, then one merged line per second for
        # the rest (or the few a scan saw as one), never 8. On a loaded machine the writes
        # can take longer than 0.8 s, and a rise after the first second's window opens a new
        # window with a line of its own (seen at load 38: 0->1, [6 rises in 1s], 7->8), so
        # the count allows a second window; the burst is still merged.
        assert 2 <= len(lines) <= 4, lines
        assert any("rises in 1s]" in line for line in lines), lines
        assert lines[-1].count(" -> 8;") == 1 and sum(" -> 8;" in line for line in lines) == 1
    else:
        # v1 polls failcnt every second, so rises 1.1 s apart are mostly a line each; but on a
        # loaded machine a late poll sees two writes as one rise (seen in CI's run at load ~6:
        # "failcnt 0 -> 2", then "2 -> 3"). What cannot vary: every rise is told once, in
        # order, from 0 to 3, and no line merges a burst. That rises a window apart are never
        # merged is the Coalescer's, proven with given times in
        # test_cli_pure.test_coalescer_rises_a_window_apart_are_lines_of_their_own.
        steps = [re.search(r"\(failcnt (\d+) -> (\d+);", line) for line in lines]
        assert all(steps), lines
        chain = [(int(m.group(1)), int(m.group(2))) for m in steps if m]
        assert chain[0][0] == 0 and chain[-1][1] == 3, lines
        assert all(a[1] == b[0] for a, b in zip(chain, chain[1:])), lines
        assert 1 <= len(lines) <= 3 and not any("rises in" in line for line in lines), lines


RANKS_SAVE = (  # two "ranks" record their save (cgwatch/saves.py), then the launcher fails
    "import os, sys\n"
    "from cgwatch import saves\n"
    "for rank in range(int(sys.argv[1])):\n"
    "    saves.record_start(rank, 2)\n"
    "saves.record_save(0, 2, 41, 'ckpt/checkpoint-41')\n"
    "if sys.argv[1] == '2':\n"
    "    saves.record_save(1, 2, 41, 'ckpt/checkpoint-41')\n"
    "print(os.environ['CGWATCH_SAVES_DIR'])\n"
    "sys.stdout.flush()\n"
    "os.kill(os.getpid(), int(sys.argv[2])) if sys.argv[2] != '0' else sys.exit(1)\n")


@pytest.mark.parametrize("saved, signum, status, line", [
    # torchrun's 1 for workers that exited 75, after both ranks recorded their save.
    ("2", "0", 75, "cgwatch run: every rank (2) saved at step 41 after the guard's stop; "
                   "python ended with exit 1; exit 75 (saved, may be resumed)\n"),
    # Lightning's launcher (rank 0) SIGKILLed by its observer after both saved.
    ("2", "9", 75, "cgwatch run: every rank (2) saved at step 41 after the guard's stop; "
                   "python ended with killed by SIGKILL; exit 75 (saved, may be resumed)\n"),
    # One rank never recorded its save: never 75.
    ("1", "0", 1, "cgwatch run: only 1 of 2 ranks recorded a save after the guard's stop; "
                  "python ended with exit 1; not saved: exit 1\n"),
])
def test_run_exits_75_when_every_rank_recorded_its_save(
        host: FakeHost, saved: str, signum: str, status: int, line: str) -> None:
    proc = cgwatch(host, "run", "--", sys.executable, "-c", RANKS_SAVE, saved, signum)
    out, err = proc.communicate(timeout=60)
    name = os.path.basename(sys.executable)
    assert (proc.returncode, err) == (status, line.replace("python", name))
    directory = out.strip()
    assert os.path.basename(directory).startswith("cgwatch-saves-")
    assert not os.path.exists(directory)  # run removed what it made


def test_run_json_has_the_ranks_saves(host: FakeHost) -> None:
    proc = cgwatch(host, "run", "--json", "--", sys.executable, "-c", RANKS_SAVE, "2", "0")
    _, err = proc.communicate(timeout=60)
    data = json.loads(err)
    assert proc.returncode == 75 and data["exit_status"] == 75
    assert data["saves"] == {
        "saved": 2, "expected": 2, "ranks": 2, "attempt": 0, "step": 41, "complete": True,
        "line": f"cgwatch run: every rank (2) saved at step 41 after the guard's stop; "
                f"{os.path.basename(sys.executable)} ended with exit 1; exit 75 (saved, may be "
                "resumed)"}



def test_no_temporary_directory_no_records(tmp_path: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # $TMPDIR unwritable (a read-only container): CMD runs as before, nothing added to its
    # environment, its status passed on.
    import tempfile

    from cgwatch.cli.run import child_environment, make_saves_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    assert make_saves_dir() is None
    assert child_environment(None, 0, None) is None
