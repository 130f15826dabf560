"""The command line's pure parts as tables: sizes (Threshold.parse, human_bytes), burst
coalescing, what `cgwatch run` keeps of its events, the table's legend and /dev/shm line, and
the SIGBUS explanation."""

from __future__ import annotations

import os
import signal
from typing import Any, Optional

import pytest

from cgwatch.alerts import Threshold
from cgwatch.cli.coalesce import Coalescer, rises_suffix
from cgwatch.cli.explain import KILL_COUNTERS, explain_shm, find_culprit
from cgwatch.cli.runlog import RunLog
from cgwatch.cli.show import format_table
from cgwatch.event import Event
from cgwatch.shm import ShmUsage, shm_limits, shm_usage
from cgwatch.units import human_bytes

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


# ---- sizes -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("1Gi", GiB), ("512Mi", 512 * MiB), ("64Ki", 64 * KiB), ("2Ti", 2 * TiB),
    ("512MB", 512 * MiB), ("512M", 512 * MiB), ("1.5Gi", 1536 * MiB), ("1gib", GiB),
    ("1024b", 1024), ("1024B", 1024), (" 3 Gi ", 3 * GiB), ("0.5Ki", 512),
    ("4294967296", 4 * GiB), ("4096T", 4096 * TiB),
])
def test_sizes(text: str, expected: int) -> None:
    assert Threshold.parse(text) == Threshold(bytes=expected)


@pytest.mark.parametrize("text, message", [
    ("9" * 400, "too long"), ("9" * 400 + "G", "too long"), ("1" + "0" * 30 + "T", "4 EiB"),
    ("1" * 38, "4 EiB"), ("9" * 30 + "%", "between 0 and 1"),
    ("²", "not a size"), ("١٢٣M", "not a size"), ("１G", "not a size"),
    ("1Gii", "not a size"), ("1iB", "not a size"), ("1.5b", "whole"), ("0.1b", "whole"),
    ("0.0001Ki", "positive"), ("nan", "not a size"), ("inf", "not a size"),
    ("1e9", "not a size"), ("-1Mi", "not a size"), ("1 G B", "not a size"),
])
def test_sizes_rejected_with_a_value_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Threshold.parse(text)


@pytest.mark.parametrize("value, expected", [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
    (-5000, "-4.9 KiB"), (64 * MiB, "64.0 MiB"), (1 << 62, "4096.0 PiB"),
    (10 ** 400, f"{10 ** 400 * 10 // (1 << 50) // 10}.{10 ** 400 * 10 // (1 << 50) % 10} PiB"),
    (-(10 ** 400), "-" + f"{(10 ** 401 + (1 << 49)) // (1 << 50) // 10}"
     f".{(10 ** 401 + (1 << 49)) // (1 << 50) % 10} PiB"),
])
def test_human_bytes(value: Optional[int], expected: str) -> None:
    assert human_bytes(value) == expected


# ---- coalescing --------------------------------------------------------------------------

def ev(counter: str = "max", level: int = 0, old: int = 0, new: int = 1, t: float = 0.0,
       usage: int = 60 * MiB, **kw: Any) -> Event:
    return Event("/job", "/sys/fs/cgroup/job", level, counter, old, new, 64 * MiB, usage,
                 t, "memory.events", 2, **kw)


def test_coalescer_first_at_once_rest_merged_per_second() -> None:
    c = Coalescer(1.0)
    assert c.offer(ev(old=0, new=1), 0.0) == [(ev(old=0, new=1), 1)]
    assert c.offer(ev(old=1, new=2), 0.1) == []
    assert c.offer(ev(old=2, new=5), 0.5) == []
    assert c.offer(ev("oom_kill", old=0, new=1), 0.6) == [(ev("oom_kill", old=0, new=1), 1)]
    assert c.offer(ev(level=1, old=0, new=1), 0.6) == [(ev(level=1, old=0, new=1), 1)]
    assert c.next_due() == 1.0
    assert c.due(0.99) == []
    merged = c.due(1.0)
    assert len(merged) == 1 and merged[0][1] == 2
    assert (merged[0][0].old, merged[0][0].new) == (1, 5)  # type: ignore[union-attr]
    # a rise right after the merged line waits for the next window
    assert c.offer(ev(old=5, new=6), 1.2) == []
    assert c.next_due() == 2.0
    assert c.due(2.0)[0][1] == 1
    # quiet for a window: the next rise is printed at once again
    assert c.offer(ev(old=6, new=7), 3.5) == [(ev(old=6, new=7), 1)]
    assert c.flush() == [] and c.next_due() is None


def test_coalescer_rises_a_window_apart_are_lines_of_their_own() -> None:
    # v1's failcnt polled each second, rising at every poll: no line waits, none is merged.
    c = Coalescer(1.0)
    for i, now in enumerate([0.0, 1.1, 2.2, 3.3]):
        rise = ev("failcnt", old=i, new=i + 1)
        assert c.offer(rise, now) == [(rise, 1)]
    assert c.flush() == [] and c.next_due() is None


def test_coalescer_bounds_lines_in_a_storm() -> None:
    c = Coalescer(1.0)
    lines = []
    for i in range(50 * 25):  # 50 `max` events a second for 25 s
        lines += c.offer(ev(old=i, new=i + 1), i / 50)
    lines += c.flush()
    assert 24 <= len(lines) <= 27
    assert sum(r for _, r in lines) == 50 * 25


def test_rises_suffix() -> None:
    assert rises_suffix(1) == "" and rises_suffix(37) == " [37 rises in 1s]"


# ---- what `cgwatch run` keeps ------------------------------------------------------------

def test_runlog_keeps_a_bounded_summary() -> None:
    log = RunLog()
    for i in range(100_000):
        log.add(ev(old=i, new=i + 1, t=float(i), usage=60 * MiB + i))
    log.add(ev("oom_kill", old=0, new=1, t=5.0))
    log.add(ev("oom_kill", old=1, new=3, t=6.0))
    assert len(log) == 2
    merged = {e.counter: e for e in log.events()}
    assert (merged["max"].old, merged["max"].new, merged["max"].time) == (0, 100_000, 99_999.0)
    assert (merged["oom_kill"].old, merged["oom_kill"].new) == (0, 3)
    assert sum(e.delta for e in log.events() if e.counter in KILL_COUNTERS) == 3
    assert log.peak_usage == 60 * MiB + 99_999
    (summary,) = [s for s in log.summaries() if s.first.counter == "max"]
    assert summary.rises == 100_000 and summary.as_dict()["first"] == {"old": 0, "new": 1,
                                                                      "time": 0.0}


def test_runlog_counter_restart_counts_every_rise() -> None:
    log = RunLog()
    log.add(ev("oom_kill", old=0, new=2))
    log.add(ev("oom_kill", old=0, new=1))  # the level was removed and made again
    (merged,) = log.events()
    assert merged.delta == 3


def test_runlog_keeps_own_rises_apart_for_the_culprit() -> None:
    """v2 `oom` at /job: first repeated from below (local unchanged), then its own (local
    rose). Merging both into one Event would hide the own rise from find_culprit."""
    log = RunLog()
    log.add(ev("oom", level=1, old=0, new=1, local_old=0, local_new=0))
    log.add(ev("oom", level=1, old=1, new=2, local_old=0, local_new=1))
    culprit = find_culprit(log.events())
    assert culprit is not None and culprit.certain


# ---- the table ---------------------------------------------------------------------------

def table_data(marks: list[tuple[bool, bool]],
               shm: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    return {
        "total_memory": 64 * MiB, "available_memory": 32 * MiB, "dev_shm": shm,
        "host": {"mem_total": 8 * GiB, "mem_available": 4 * GiB, "source": "/proc/meminfo"},
        "status": {"mode": "watching", "reason": "", "version": 2, "cgroup_path": "/job",
                   "directory": "/sys/fs/cgroup/job"},
        "levels": [{"binds_total": t, "binds_available": a, "cgroup_path": f"/l{i}",
                    "limit": None, "usage": MiB, "inactive_file": 0, "headroom": None}
                   for i, (t, a) in enumerate(marks)],
    }


@pytest.mark.parametrize("marks, legend", [
    ([], None),
    ([(False, False)], None),
    ([(True, False)], "T: limit that sets total_memory"),
    ([(False, True), (False, False)], "A: level with the least headroom"),
    ([(True, True)], "T: limit that sets total_memory   A: level with the least headroom"),
    ([(True, False), (False, True)],
     "T: limit that sets total_memory   A: level with the least headroom"),
])
def test_legend_only_for_marks_that_appear(marks: list[tuple[bool, bool]],
                                           legend: Optional[str]) -> None:
    lines = format_table(table_data(marks)).splitlines()
    legends = [line for line in lines if "limit that sets" in line or "least headroom" in line]
    assert legends == ([legend] if legend else [])


@pytest.mark.parametrize("limits, shown", [(True, True), (False, False)])
def test_table_shows_a_small_dev_shm(limits: bool, shown: bool) -> None:
    shm = {"path": "/dev/shm", "size": 16 * MiB, "used": 4 * MiB, "available": 12 * MiB,
           "percent_used": 25.0, "limits": limits}
    text = format_table(table_data([], shm))
    assert ("/dev/shm:         16.0 MiB (16777216 bytes), 4.0 MiB used" in text) == shown


# ---- /dev/shm ----------------------------------------------------------------------------

def test_shm_usage_under_a_root(tmp_path: Any) -> None:
    assert shm_usage(str(tmp_path)) is None  # no dev/shm there
    os.makedirs(tmp_path / "dev" / "shm")
    usage = shm_usage(str(tmp_path))
    assert usage is not None and usage.path == str(tmp_path / "dev" / "shm")
    st = os.statvfs(tmp_path / "dev" / "shm")
    assert usage.size == st.f_blocks * st.f_frsize
    assert 0 <= usage.used <= usage.size and 0 <= usage.available <= usage.size


def test_shm_limits() -> None:
    small = ShmUsage("/dev/shm", 64 * MiB, 0, 64 * MiB)
    assert shm_limits(small, GiB) and not shm_limits(small, 32 * MiB)
    assert not shm_limits(None, GiB)
    assert ShmUsage("/dev/shm", 64 * MiB, 16 * MiB, 48 * MiB).percent_used == 25.0


FULL = ShmUsage("/dev/shm", 16 * MiB, 16 * MiB, 0)


@pytest.mark.parametrize("status, sig, peak, expected", [
    (128 + signal.SIGBUS, signal.SIGBUS, FULL, "python died of SIGBUS (exit status 135)"),
    (128 + signal.SIGBUS, None, FULL, "python died of SIGBUS (exit status 135)"),  # via a shell
    (1, None, FULL, "python failed (exit status 1) while /dev/shm was 100% full"),
    (128 + signal.SIGBUS, signal.SIGBUS, ShmUsage("/dev/shm", 16 * MiB, 8 * MiB, 8 * MiB),
     None),
    (0, None, FULL, None),
    (135, signal.SIGBUS, None, None),
])
def test_explain_shm(status: int, sig: Optional[int], peak: Optional[ShmUsage],
                     expected: Optional[str]) -> None:
    text = explain_shm("python", status, sig, peak, GiB)
    if expected is None:
        assert text is None
        return
    assert text is not None
    flat = " ".join(" ".join(line.removeprefix("cgwatch:") for line in
                             text.splitlines()).split())
    assert expected in flat
    assert "docker run --shm-size" in flat and "emptyDir with medium: Memory" in flat
    assert "16.0 MiB of 16.0 MiB" in flat and "(1.0 GiB of memory is available)" in flat


# ---- `cgwatch run`: the arguments checked, the end's label ----------------------------------

def _run_args(command: list[str], guard: bool = False, **options: Any) -> Any:
    import argparse

    values = {"signal": None, "reserve": None, "checkpoint_seconds": None, **options}
    return argparse.Namespace(command=command, guard=guard, **values)


@pytest.mark.parametrize("args, expected", [
    pytest.param(_run_args(["--", "sleep", "1"]), (["sleep", "1"], ""), id="dash-dash-dropped"),
    pytest.param(_run_args(["sleep", "--", "x"]), (["sleep", "--", "x"], ""),
                 id="a-later-dash-dash-is-cmd-s"),
    pytest.param(_run_args(["--"]), ([], "give a command: cgwatch run -- CMD [ARGS]"),
                 id="no-command"),
    pytest.param(_run_args([]), ([], "give a command: cgwatch run -- CMD [ARGS]"),
                 id="nothing"),
    pytest.param(_run_args(["true"], signal=signal.SIGUSR1), (["true"], "--signal needs --guard"),
                 id="signal-without-guard"),
    pytest.param(_run_args(["true"], reserve=Threshold(bytes=MiB), checkpoint_seconds=2.0),
                 (["true"], "--reserve needs --guard"), id="the-first-guard-option-named"),
    pytest.param(_run_args(["true"], checkpoint_seconds=2.0),
                 (["true"], "--checkpoint-seconds needs --guard"), id="checkpoint-seconds"),
    pytest.param(_run_args(["true"], guard=True, signal=signal.SIGUSR1), (["true"], ""),
                 id="with-guard"),
    pytest.param(_run_args(["true"], restarts=3), (["true"], "--restarts needs --guard"),
                 id="restarts-without-guard"),
    pytest.param(_run_args(["true"], guard=True, restart_delay=2.0),
                 (["true"], "--restart-delay needs --restarts"), id="delay-without-restarts"),
    pytest.param(_run_args(["true"], guard=True, restarts=0, restart_delay=2.0), (["true"], ""),
                 id="restarts-0-with-a-delay"),
    pytest.param(_run_args(["true"], observe=True), (["true"], "--observe needs --guard"),
                 id="observe-without-guard"),
    pytest.param(_run_args(["true"], record="r"), (["true"], "--record needs --guard"),
                 id="record-without-guard"),
    pytest.param(_run_args(["true"], guard=True, observe=True, record="r"), (["true"], ""),
                 id="observe-and-record"),
    pytest.param(_run_args(["true"], guard=True, observe=True, restarts=2),
                 (["true"], "--restarts with --observe: an observing guard never stops CMD"),
                 id="observe-never-restarts"),
    pytest.param(_run_args(["true"], guard=True, record="r", restarts=2),
                 (["true"], "--record with --restarts: a record holds one guard's life"),
                 id="one-record-one-life"),
])
def test_run_check_arguments(args: Any, expected: tuple[list[str], str]) -> None:
    from cgwatch.cli.run import check_arguments

    assert check_arguments(args) == expected


@pytest.mark.parametrize("returncode, label", [
    (0, "exit 0"), (3, "exit 3"), (75, "exit 75"),
    (-signal.SIGKILL, "killed by SIGKILL"), (-signal.SIGTERM, "killed by SIGTERM"),
])
def test_run_end_label(returncode: int, label: str) -> None:
    from cgwatch.cli.run import end_label

    assert end_label(returncode) == label
