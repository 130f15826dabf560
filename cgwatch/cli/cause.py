"""Internal. Why CMD ended, for `cgwatch run`: the evidence gathered around it (/dev/shm sampled
while it runs, the host's OOM kill count before and after, the OOM kills counted on its cgroup
path, the culprit level's peak, the rlimits it inherited), turned into explain.py's report and
texts, and the JSON report (`--json`, `--report FILE`). explain.py words it; this module
reads and assembles; run.py runs CMD.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from .. import names, values
from ..event import Event
from ..files import read_file, under_root
from ..shm import ShmUsage, shm_usage
from .child import exit_status
from .explain import (
    KILL_COUNTERS,
    Above,
    Report,
    SlurmJob,
    explain,
    explain_rlimit,
    explain_sampled,
    explain_shm,
    find_culprit,
    signal_name,
    slurm_job,
)

if TYPE_CHECKING:
    from ..events import Item
    from ..monitor import Monitor
    from ..snapshot import LevelInfo
    from .runlog import RunLog


def read_host_oom_kills(root: str) -> Optional[int]:
    """The host's count of OOM kills (/proc/vmstat `oom_kill`, Linux 4.13+)."""
    try:
        text = read_file(under_root(root, names.VMSTAT))
    except OSError:
        return None
    return values.parse_flat_keyed(text).get("oom_kill")


def _read_peak(directory: str, version: int) -> tuple[Optional[int], str]:
    name = names.FileNames.for_version(version).peak
    try:
        return values.parse_counter(read_file(os.path.join(directory, name))), name
    except (OSError, ValueError):
        return None, ""


def _read_rlimits() -> list[tuple[str, int]]:
    """The soft RLIMIT_AS/RLIMIT_DATA that CMD inherits from us, where set."""
    import resource

    out = []
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        soft = resource.getrlimit(getattr(resource, name))[0]
        if soft != resource.RLIM_INFINITY:
            out.append((name, soft))
    return out


def build_report(command: str, returncode: int, seen: list[Item],
                 monitor: Monitor, slurm: Optional[SlurmJob] = None) -> Optional[Report]:
    """The report to print, or None when no OOM kill touched the path. `seen`: the events
    (RunLog.events() gives one merged Event per counter and level)."""
    events = [e for e in seen if isinstance(e, Event)]
    kills = [e for e in events if e.counter in KILL_COUNTERS]
    if not kills:
        return None
    if monitor.status.version == 2:
        # Hierarchical: every ancestor repeats a kill, and a reader may see the repeats in a
        # later scan than the original. The deepest level that counted one says where.
        deepest = min(e.level for e in kills)
        kills = [e for e in kills if e.level == deepest]
    levels = monitor.levels()
    visible = [lvl for lvl in levels if not lvl.hidden]
    top = visible[-1].cgroup_path if visible else ""
    culprit = find_culprit(events, _above(levels, monitor.status.above),
                           len(visible) - 1 if visible else None)
    peak, peak_file = (None, "")
    version = monitor.status.version
    if culprit is not None and version is not None:
        peak, peak_file = _read_peak(culprit.directory, version)
    sig = -returncode if returncode < 0 else None
    return Report(command, exit_status(returncode), sig, tuple(kills), culprit, peak, peak_file,
                  top, slurm)


def _above(levels: list[LevelInfo], above: str) -> Optional[Above]:
    """The level above the visible hierarchy, when a limit may be there: v1's hidden level
    (its value from hierarchical_memory_limit), or, where `status.above` says limits above
    the top cannot be seen, one of unknown value."""
    for lvl in levels:
        if lvl.hidden:
            return (lvl.cgroup_path, lvl.directory, lvl.limit)
    if above and levels:
        top = levels[-1]
        return (f"(above {top.cgroup_path})", top.directory, None)
    return None


@dataclass(frozen=True)
class Cause:
    """What explains CMD's end; each part None where nothing says so."""

    report: Optional[Report]  # an OOM kill counted on the path
    host_note: Optional[str]  # a SIGKILL while the host's OOM killer struck off the path
    other: Optional[str]  # /dev/shm full; else slurmstepd's sampling or an rlimit (explain.py)
    slurm: Optional[SlurmJob]

    def texts(self) -> list[str]:
        """What `run` prints on stderr, in order (nothing: CMD's output is left alone)."""
        return [text for text in (self.host_note and "cgwatch: " + self.host_note,
                                  self.report is not None and explain(self.report), self.other)
                if text]


def find_cause(name: str, returncode: int, runlog: RunLog, monitor: Monitor, root: str,
               host_kills_before: Optional[int], shm_peak: Optional[ShmUsage]) -> Cause:
    """Why CMD (`name`) ended with `returncode`, once its events were all scanned (the
    monitor still open)."""
    slurm = slurm_job(monitor.status.cgroup_path, os.environ, monitor.levels())
    report = build_report(name, returncode, list(runlog.events()), monitor, slurm)
    host_note: Optional[str] = None
    if report is None and returncode == -signal.SIGKILL:
        after = read_host_oom_kills(root)
        if host_kills_before is not None and after is not None and after > host_kills_before:
            host_note = (f"{name} was killed by SIGKILL; meanwhile the kernel's "
                         f"OOM killer killed {after - host_kills_before} process(es) on "
                         "this host, none counted on this cgroup path (see `dmesg` for "
                         "'Killed process')")
    status = exit_status(returncode)
    sig = -returncode if returncode < 0 else None
    other = explain_shm(name, status, sig, shm_peak, monitor.available_memory())
    # Other causes, when no OOM kill explains the end (the evidence each needs: explain.py)
    if report is None and host_note is None:
        other = other or explain_sampled(name, status, sig, 0, slurm) \
            or explain_rlimit(name, status, sig, _read_rlimits())
    return Cause(report, host_note, other, slurm)


def report_json(command: list[str], pid: Optional[int], returncode: int, cause: Cause,
                runlog: RunLog, shm_peak: Optional[ShmUsage],
                shm_last: Optional[ShmUsage]) -> dict[str, Any]:
    """The report as plain data: what `--json` prints and `--report FILE` writes."""
    report = cause.report
    sig = -returncode if returncode < 0 else None
    kills = sum(e.delta for e in report.kills) if report is not None else 0
    killed = None
    if report is not None and sig == signal.SIGKILL:
        # CMD itself died of SIGKILL while the OOM killer struck on its path: it is the victim
        # (another process's SIGKILL at the same moment is the one case this misnames).
        killed = {"pid": pid, "command": command}
    culprit = report.culprit if report is not None else None
    return {
        "type": "run", "command": command, "pid": pid,
        "exit_status": exit_status(returncode),
        "signal": None if sig is None else signal_name(sig),
        "oom_kills": kills,
        "oom_kills_in": sorted({e.cgroup_path for e in report.kills}) if report else [],
        "killed_process": killed,
        # limit: a visible level's limit was reached; above: a limit above the visible
        # hierarchy; host: no limit on the path was reached (a global OOM)
        "cause": report.cause if report is not None else None,
        "culprit": None if culprit is None else {
            "cgroup_path": culprit.cgroup_path, "limit": culprit.limit,
            "certain": culprit.certain, "kind": culprit.kind,
            "peak": report.peak if report else None,
            "peak_file": report.peak_file if report else ""},
        "events": [s.as_dict() for s in runlog.summaries()],
        "headroom_alerts": runlog.alerts,
        "peak_usage_seen": runlog.peak_usage,
        "dev_shm": {"peak": shm_peak.as_dict() if shm_peak else None,
                    "at_exit": shm_last.as_dict() if shm_last else None},
        "explanation": [line.removeprefix("cgwatch: ") for text in cause.texts()
                        for line in text.splitlines()],
        "slurm": None if cause.slurm is None else cause.slurm.as_dict(),
    }


def write_report(path: str, data: dict[str, Any]) -> None:
    try:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    except OSError as e:
        print(f"cgwatch run: cannot write the report to {path}: {e.strerror or e}",
              file=sys.stderr)


class ShmSampler:
    """/dev/shm's fullest moment while CMD runs (a worker's segments are freed when it dies,
    so the use at exit can be low again): statvfs every 0.25 s on a thread."""

    INTERVAL = 0.25

    def __init__(self, root: str) -> None:
        self.root = root
        self.peak: Optional[ShmUsage] = None
        self.last: Optional[ShmUsage] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped,
                                        name="cgwatch-run-shm", daemon=True)

    def __enter__(self) -> ShmSampler:
        self.sample()
        if self.last is not None:  # no /dev/shm: nothing to follow
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()

    def sample(self) -> None:
        usage = shm_usage(self.root)
        if usage is None:
            return
        self.last = usage
        if self.peak is None or usage.used >= self.peak.used:
            self.peak = usage

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.INTERVAL):
            self.sample()
