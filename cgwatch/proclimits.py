"""Internal. Limits on this process that no cgroup enforces: RLIMIT_AS, RLIMIT_DATA, and a
Slurm job's declared `--mem` where only slurmstepd's sampling enforces it.

Each is a level of its own in `levels()` and counts in `available_memory()` as limit minus the
process's current size, read from /proc/self/statm only when such a limit is set (statm, not
status: ~3 us against ~40 us for status here, fs/proc/task_mmu.c `task_statm()`):

- RLIMIT_AS (`ulimit -v`, Grid Engine's h_vmem, PBS vmem): the kernel refuses a mapping when
  `mm->total_vm + npages` would pass it (mm/mmap.c `may_expand_vm()`, 6.18); total_vm is
  statm's first field (status `VmSize`).
- RLIMIT_DATA: `may_expand_vm()` checks `mm->data_vm` (private writable mappings that are not
  stack: `is_data_mapping()`) for such mappings, and brk() checks the heap plus the data
  segment (`check_data_rlimit()`). statm's sixth field is data_vm + stack_vm (status `VmData`
  plus `VmStk`): the stack (~132 KiB) counts too, so the room is a little under the truth.
- A Slurm job's declared limit (`slurm.from_environ`, or the controller's answer for a plain
  `srun --mem`: `slurmctl.ask`, once per job step and node, only when no cgroup of the job
  carries a limit): the job's use is not known without a cgroup, so its bound counts this
  process's resident set (statm's second field, `VmRSS`: a floor of the job's use, so the
  answer is an upper bound, said in the level's `problem`). It counts in total_memory() too.

The limits are read once per snapshot (`resource.getrlimit`, ~1 us here), never per query.
"""

from __future__ import annotations

import os
import resource  # here, not when first needed: a lazy import fails with EMFILE (~0.1 ms)

from .frozen import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Callable, Optional

    from .slurm import Declared

STATM = "/proc/self/statm"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
RLIMIT_AS = "RLIMIT_AS"
RLIMIT_DATA = "RLIMIT_DATA"
SLURM = "slurm"
# the /proc/self/statm field (from 0, in pages) each kind's use is read from
USAGE_FIELDS = {RLIMIT_AS: 0, RLIMIT_DATA: 5, SLURM: 1}


class ProcessLimit(Frozen):
    """One limit on this process: its kind, how it is shown, its value (bytes)."""

    __slots__ = _fields = ("kind", "label", "limit", "note")
    kind: str  # RLIMIT_AS, RLIMIT_DATA or SLURM
    label: str  # the level's name in the table ("RLIMIT_AS (ulimit -v)", "slurm job 4 ...")
    limit: int
    note: str  # what the level's figures mean (shown as the level's problem)

    def __init__(self, kind: str, label: str, limit: int, note: str = "") -> None:
        fill(self, locals())


def parse_statm(data: bytes, page_size: int) -> list[int]:
    """The seven fields of /proc/PID/statm in bytes (size resident shared text lib data dt,
    pages in the file); ValueError unless seven numbers."""
    fields = data.split()
    if len(fields) != 7 or not all(f.isdigit() for f in fields):
        raise ValueError(f"not 7 numbers in /proc/self/statm: {data[:60]!r}")
    return [int(f) * page_size for f in fields]


def rlimit_limits(as_soft: int, data_soft: int, infinity: int) -> tuple[ProcessLimit, ...]:
    """The rlimit levels for these soft limits (`infinity`: resource.RLIM_INFINITY)."""
    out = []
    if 0 <= as_soft != infinity:
        out.append(ProcessLimit(RLIMIT_AS, "RLIMIT_AS (ulimit -v)", as_soft,
                                "address space: usage is VmSize"))
    if 0 <= data_soft != infinity:
        out.append(ProcessLimit(RLIMIT_DATA, "RLIMIT_DATA (ulimit -d)", data_soft,
                                "data mappings and heap: usage is VmData + VmStk"))
    return tuple(out)


def slurm_limit(environ: Mapping[str, str], levels: Sequence[tuple[str, Optional[int]]],
                ask: Optional[Callable[[Declared, Mapping[str, str]], Declared]] = None,
                ) -> tuple[Optional[ProcessLimit], str]:
    """The Slurm job's declared limit when no cgroup limit on the path is at or below it
    (then a cgroup enforces it, or something tighter binds): None otherwise; and why it could
    not be known ("" when nothing is wrong).

    `levels`: (cgroup path, limit) of each level, the process's own first. Without
    `SLURM_MEM_PER_*` (a plain `srun --mem`) the controller is asked (`ask`, default
    `slurmctl.ask`: once per job step and node, bounded) unless a cgroup of the job or step
    carries a limit (`slurm.needs_controller`)."""
    if "SLURM_JOB_ID" not in environ and "SLURM_JOBID" not in environ:
        return None, ""  # the common case costs no import of slurm.py (and so of re)
    from .slurm import from_environ, needs_controller

    declared = from_environ(environ)
    if declared is None:
        return None, ""
    problem = ""
    if needs_controller(environ, levels):
        if ask is None:
            from .slurmctl import ask as ask_controller
            ask = ask_controller
        declared = ask(declared, environ)
        problem = declared.problem or ""
    if declared.limit is None or any(limit is not None and limit <= declared.limit
                                     for _, limit in levels):
        return None, problem
    return ProcessLimit(SLURM, f"slurm job {declared.job} {declared.option} (declared)",
                        declared.limit,
                        "declared, not enforced by a cgroup (slurmstepd samples it); usage is "
                        "this process's VmRSS, a floor of the job's"), ""


def read_process_limits(environ: Mapping[str, str], levels: Sequence[tuple[str, Optional[int]]],
                        ) -> tuple[tuple[ProcessLimit, ...], str]:
    """The limits on this process that no cgroup enforces (one getrlimit each), and why the
    Slurm job's could not be known ("" when nothing is wrong). `levels` as `slurm_limit`."""
    try:
        found = rlimit_limits(resource.getrlimit(resource.RLIMIT_AS)[0],
                              resource.getrlimit(resource.RLIMIT_DATA)[0],
                              resource.RLIM_INFINITY)
    except (OSError, ValueError):
        found = ()
    declared, problem = slurm_limit(environ, levels)
    return found + ((declared,) if declared is not None else ()), problem


def rooms(limits: Sequence[ProcessLimit], statm: bytes,
          page_size: int = PAGE_SIZE) -> list[tuple[int, int]]:
    """(usage, room) of each limit from one /proc/self/statm text; room is never negative."""
    fields = parse_statm(statm, page_size)
    return [(fields[USAGE_FIELDS[lim.kind]],
             max(0, lim.limit - fields[USAGE_FIELDS[lim.kind]])) for lim in limits]


def read_statm() -> bytes:
    """/proc/self/statm (one line, ~30 bytes)."""
    fd = os.open(STATM, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 256)
    finally:
        os.close(fd)


def least_room(limits: Sequence[ProcessLimit]) -> int:
    """The smallest limit - current size over `limits` (read now)."""
    return min(room for _, room in rooms(limits, read_statm()))
