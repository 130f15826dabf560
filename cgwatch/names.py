"""Internal. Every kernel file name cgwatch reads or writes, per cgroup version, in one place."""

from __future__ import annotations

from .frozen import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

PROC_CGROUP = "/proc/self/cgroup"
PROC_MOUNTINFO = "/proc/self/mountinfo"


def proc_file(name: str, pid: Optional[int] = None) -> str:
    """/proc/self/NAME, or /proc/PID/NAME for another process (`cgwatch serve --pid`)."""
    return f"/proc/{'self' if pid is None else int(pid)}/{name}"


MEMINFO = "/proc/meminfo"
ZONEINFO = "/proc/zoneinfo"
VMSTAT = "/proc/vmstat"
OOM_SCORE_ADJ = "/proc/self/oom_score_adj"

STAT = "memory.stat"
USE_HIERARCHY = "memory.use_hierarchy"  # v1 only
CONTROLLERS = "cgroup.controllers"  # v2 only
EVENT_CONTROL = "cgroup.event_control"  # v1 only: eventfd registration
PRESSURE = "memory.pressure"  # v2 only: PSI

# Event counter files (counters.py parses them).
EVENTS = "memory.events"
EVENTS_LOCAL = "memory.events.local"
OOM_CONTROL = "memory.oom_control"
FAILCNT = "memory.failcnt"


class FileNames(Frozen):
    """The file names that differ between cgroup versions."""

    __slots__ = _fields = ("version", "limit", "usage", "inactive_key", "peak", "counters",
                           "high", "swap_limit", "swap_usage")
    version: int
    limit: str  # the hard limit
    usage: str  # current usage, hierarchical
    inactive_key: bytes  # memory.stat key of hierarchical inactive page cache
    peak: str  # the highest usage seen
    counters: tuple[str, ...]  # event counter files, in reading order
    high: str  # the throttling limit (v2 memory.high; "" on v1, whose soft limit is no cap)
    swap_limit: str  # v2: swap alone; v1: memory + swap (memsw)
    swap_usage: str  # v2 only; v1's is memory.stat total_swap (values.parse_v1_swap)

    def __init__(self, version: int, limit: str, usage: str, inactive_key: bytes, peak: str,
                 counters: tuple[str, ...], high: str, swap_limit: str,
                 swap_usage: str) -> None:
        fill(self, locals())

    @staticmethod
    def for_version(version: int) -> FileNames:
        return V2 if version == 2 else V1


# v2's `inactive_file` is already hierarchical; v1's plain `inactive_file` is local to the
# cgroup and `total_inactive_file` covers its descendants, matching `usage_in_bytes`.
V2 = FileNames(2, "memory.max", "memory.current", b"inactive_file", "memory.peak",
               (EVENTS, EVENTS_LOCAL), "memory.high", "memory.swap.max", "memory.swap.current")
V1 = FileNames(1, "memory.limit_in_bytes", "memory.usage_in_bytes", b"total_inactive_file",
               "memory.max_usage_in_bytes", (OOM_CONTROL, FAILCNT), "",
               "memory.memsw.limit_in_bytes", "")
