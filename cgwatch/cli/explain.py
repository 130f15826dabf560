"""What `cgwatch run` prints when an OOM kill happened while its command ran: which cgroup's
limit was reached, the limit, the peak usage, and what to do.

`find_culprit` (which level ran out of memory) and `explain` (the text) are pure and
table-tested in tests/test_cli_run_explain.py; run.py gathers their inputs.
"""

from __future__ import annotations

import signal
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from ..event import Event
from ..shm import ShmUsage
from ..units import human_bytes

KILL_COUNTERS = ("oom_kill", "oom_group_kill")
# /dev/shm at least this full at its fullest while CMD ran counts as "was full": a worker
# mapping a 10 MiB batch into a 64 MiB tmpfs with 6 MiB left dies at 90%, not at 100%.
SHM_FULL_PERCENT = 90.0


@dataclass(frozen=True)
class Culprit:
    """The level whose limit was reached."""

    cgroup_path: str
    directory: str
    limit: Optional[int]
    certain: bool  # seen to run out of memory (False: only the smallest limit on the path)


@dataclass(frozen=True)
class Report:
    command: str  # argv[0] as given
    status: int  # the exit status `cgwatch run` returns (128+N for signal N)
    signal: Optional[int]  # the signal that ended the command, if one did
    kills: tuple[Event, ...]  # oom_kill rises on the path while it ran (v2: deepest level)
    culprit: Optional[Culprit]  # None: no limited level on the path ran out of memory
    peak: Optional[int]  # the culprit's peak usage as the kernel reports it
    peak_file: str  # where the peak came from ("" when unknown)


def find_culprit(events: Sequence[Event],
                 limited: Sequence[tuple[str, str, int]]) -> Optional[Culprit]:
    """The level that ran out of memory, from the events seen during the run.

    In order of evidence: a v2 `oom` rise in the level's own memory.events.local, or v1's
    `oom` (OOM notification for that level); then a rise of `max` / `failcnt` (the limit was
    hit); then, with none of those, the level with the smallest limit (`limited`: path,
    directory, limit of each limited level, leaf first). None if nothing on the path has a
    limit.
    """
    def own_oom(e: Event) -> bool:
        if e.counter != "oom" or e.limit is None:
            return False
        if e.local_new is not None and e.local_old is not None:
            return e.local_new > e.local_old
        return not e.propagated

    for test in (own_oom,
                 lambda e: e.counter in ("max", "failcnt") and e.limit is not None
                 and not e.propagated):
        hits = [e for e in events if test(e)]
        if hits:
            first = min(hits, key=lambda e: e.level)
            return Culprit(first.cgroup_path, first.directory, first.limit, True)
    if not limited:
        return None
    path, directory, limit = min(limited, key=lambda x: x[2])
    return Culprit(path, directory, limit, False)


def signal_name(number: int) -> str:
    """`SIGKILL`, or `signal 70` for a number Python has no name for."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def explain(report: Report) -> str:
    """The lines for stderr, each prefixed `cgwatch: `."""
    cmd = report.command
    kills = sum(e.new - e.old for e in report.kills)
    where = sorted({e.cgroup_path for e in report.kills})
    if report.signal == signal.SIGKILL:
        head = (f"{cmd} was killed by the kernel's OOM killer (SIGKILL, exit status "
                f"{report.status}).")
    elif report.signal is not None:
        head = (f"{cmd} died of {signal_name(report.signal)} (exit status {report.status}) "
                f"after the kernel's OOM killer killed a process in {', '.join(where)}.")
    else:
        head = (f"while {cmd} ran, the kernel's OOM killer killed a process in "
                f"{', '.join(where)} ({cmd} exited with status {report.status}).")
    lines = _wrap(head)
    if report.culprit is None:
        lines += _wrap("no memory limit on this process's cgroup path was reached: the host "
                       "itself ran out of memory (or a limit above the visible cgroup tree).")
        lines += [f"  OOM kills   {kills} in {', '.join(where)}"]
        lines += _wrap(f"what to do: free memory on the host or give the machine more, or "
                       f"make {cmd} use less (smaller batches, fewer worker processes).")
        return "\n".join("cgwatch: " + line for line in lines)
    c = report.culprit
    peak = (f"{human_bytes(report.peak)} ({report.peak_file})" if report.peak is not None
            else "not reported by this kernel")
    lines += [
        f"  cgroup      {c.cgroup_path}" + ("" if c.certain else
                                             " (the smallest limit on the path)"),
        f"  limit       {human_bytes(c.limit)}"
        + (f" ({c.limit} bytes)" if c.limit is not None else ""),
        f"  peak usage  {peak}",
        f"  OOM kills   {kills} in {', '.join(where)} while {cmd} ran",
    ]
    lines += _wrap(f"what to do: raise that cgroup's memory limit (docker run --memory, "
                   f"Kubernetes resources.limits.memory, systemd MemoryMax=) or make {cmd} "
                   "use less memory (smaller batches, fewer worker processes); a program can "
                   "call cgwatch.available_memory() to learn how much it may still allocate.")
    return "\n".join("cgwatch: " + line for line in lines)


def explain_shm(cmd: str, status: int, sig: Optional[int], peak: Optional[ShmUsage],
                available: int) -> Optional[str]:
    """The lines for a CMD that died of SIGBUS (or failed) while /dev/shm was nearly full at
    some point (`peak`: its fullest sample); None when that does not apply. A full tmpfs
    does not fail a write with ENOSPC when the page is touched through mmap: the kernel
    sends SIGBUS (Linux shmem fault path, seen on 5.15 and 6.x), "Bus error" in a shell,
    "DataLoader worker (pid N) is killed by signal: Bus error" in PyTorch."""
    if peak is None or peak.percent_used < SHM_FULL_PERCENT or status == 0:
        return None
    fullest = (f"{peak.percent_used:.0f}% full at its fullest: {human_bytes(peak.used)} of "
               f"{human_bytes(peak.size)}")
    if sig == signal.SIGBUS or status == 128 + signal.SIGBUS:
        head = (f"{cmd} died of SIGBUS (exit status {status}) while /dev/shm was {fullest}. "
                "A process that touches a new page of a shared-memory file when that tmpfs "
                "is full gets SIGBUS (\"Bus error\"), however much memory is left")
    else:
        head = (f"{cmd} failed (exit status {status}) while /dev/shm was {fullest}. Any "
                "of its processes that then touched a new page of shared memory got SIGBUS "
                "(\"Bus error\"; PyTorch: \"DataLoader worker ... is killed by signal: Bus "
                "error\")")
    if peak.size < available:
        head += f" ({human_bytes(available)} of memory is available)."
    else:
        head += "."
    lines = _wrap(head)
    lines += _wrap("what to do: give it a bigger /dev/shm (docker run --shm-size=1g; "
                   "Kubernetes: an emptyDir with medium: Memory and a sizeLimit, mounted at "
                   "/dev/shm) or make it use less shared memory (PyTorch DataLoader: fewer "
                   "num_workers, smaller batches, a smaller prefetch_factor).")
    return "\n".join("cgwatch: " + line for line in lines)


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, width=88, subsequent_indent="  ", break_on_hyphens=False)
