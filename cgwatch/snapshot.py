"""Internal. The immutable snapshot queries answer from, its status, and the reads that do
not use the hot path: the per-level table (`read_levels`) and the uncached answer.

A snapshot is published whole (one attribute store), so a query sees the old state or the
new one, never a mix.
"""

from __future__ import annotations

import os

from . import discovery, names, proclimits, values
from .frozen import Frozen, fill, replace
from .headroom import binding_levels, headroom
from .hostmem import HostMemory
from .names import FileNames
from .proclimits import ProcessLimit, read_process_limits
from .tree import Level
from .units import human_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Callable, Optional

    # (lower bound on the headroom or None, limit, usage fd, stat fd, memory.stat needle)
    HeadroomSource = tuple[Optional[int], int, int, int, bytes]

WATCHING = "watching"  # inotify keeps the cache exact; queries read it as is
POLLING = "polling"  # no inotify: each query preads the limit files (tree.limit_check)
HOST = "host"  # no usable memory cgroup: host values (MemTotal / MemAvailable)


class Status(Frozen):
    """How the monitor gets its answers, and why. (No __slots__: `status.__dict__` is the
    fields by name, as JSON output uses it.)"""

    _fields = ("mode", "reason", "version", "cgroup_path", "directory", "host_source",
               "confirmed_at", "above", "thread", "watches")
    mode: str  # WATCHING, POLLING or HOST
    reason: str  # why not WATCHING (empty when all is well), or a problem with a level
    version: Optional[int]  # cgroup version of the memory hierarchy, None without one
    cgroup_path: Optional[str]  # the process's path inside the hierarchy
    directory: Optional[str]  # where that path's files were found
    host_source: str  # "meminfo" or "psutil"
    # time.monotonic() when /proc/self/cgroup last said the process is still in cgroup_path
    confirmed_at: Optional[float]
    # What cannot be seen from here: "" when the whole path to the root is visible, else a
    # sentence (a v1 limit above the visible top, or a v2 namespace/subtree whose ancestors'
    # limits no file shows)
    above: str
    thread: bool  # the background thread serves this monitor now
    # inotify watches this monitor holds on the process's one instance (0: none, the monitor
    # polls or holds no level); the instance itself is the process's (docs/design.md)
    watches: int

    def __init__(self, mode: str, reason: str, version: Optional[int],
                 cgroup_path: Optional[str], directory: Optional[str], host_source: str,
                 confirmed_at: Optional[float] = None, above: str = "",
                 thread: bool = False, watches: int = 0) -> None:
        fill(self, locals())


class LevelInfo(Frozen):
    """One level as it is now, for display and diagnosis (read live, not the hot path).
    `as_dict()` (and `__dict__`) give the fields by name."""

    _fields = ("cgroup_path", "directory", "limit", "usage", "inactive_file", "headroom",
               "binds_total", "binds_available", "problem", "high", "high_headroom",
               "swap_limit", "swap_usage", "hidden", "kind", "slurm_role", "slurm_id")
    cgroup_path: str
    directory: str
    limit: Optional[int]
    usage: Optional[int]
    inactive_file: Optional[int]
    headroom: Optional[int]  # limit - (usage - inactive_file), None without a limit
    binds_total: bool  # this level's limit is total_memory()
    binds_available: bool  # this level's headroom is available_memory()
    problem: Optional[str]
    high: Optional[int]  # v2 memory.high (throttling starts above it); None: none
    high_headroom: Optional[int]  # high - working set, None without a high limit
    swap_limit: Optional[int]  # swap this level may use (v1: memsw - limit)
    swap_usage: Optional[int]  # swap in use (v1: memory.stat total_swap)
    # A v1 limit above the visible hierarchy: usage and headroom are the top visible level's
    # (a floor of the usage there, so the headroom is an upper bound)
    hidden: bool
    # "cgroup", or a limit on the process that no cgroup enforces (proclimits.py):
    # "RLIMIT_AS", "RLIMIT_DATA", "slurm" (a Slurm job's declared --mem)
    kind: str
    slurm_role: Optional[str]  # "job" or "step": this cgroup is the Slurm job's or step's
    slurm_id: Optional[str]  # the job id ("4") or step id ("4.0") of that level

    def __init__(self, cgroup_path: str, directory: str, limit: Optional[int],
                 usage: Optional[int], inactive_file: Optional[int], headroom: Optional[int],
                 binds_total: bool, binds_available: bool, problem: Optional[str],
                 high: Optional[int] = None, high_headroom: Optional[int] = None,
                 swap_limit: Optional[int] = None, swap_usage: Optional[int] = None,
                 hidden: bool = False, kind: str = "cgroup", slurm_role: Optional[str] = None,
                 slurm_id: Optional[str] = None) -> None:
        fill(self, locals())


class Snapshot(Frozen):
    __slots__ = _fields = ("total", "limited", "levels", "host", "status", "resolution",
                           "expires", "pending", "trusted", "generation", "uncached", "process")
    total: int
    # (None, limit, usage fd, stat fd, b"\n<memory.stat key> ") of each limited level: all the
    # hot path needs (None: "usage not read yet", see Monitor.available_memory)
    limited: tuple[HeadroomSource, ...]
    levels: tuple[Level, ...]  # leaf first; a v1 hidden ancestor last (Level.hidden)
    host: HostMemory
    status: Status
    resolution: discovery.Resolution
    expires: Optional[float]  # None: kept exact by inotify; else re-read after this time
    # epoll.poll(0) over the inotify descriptor: a query drains pending changes first when it
    # says something is queued (read-your-writes). None: nothing to drain.
    pending: Optional[Callable[[float], list[tuple[int, int]]]]
    # True: the loop thread alone keeps it (Monitor(fresh=False)); the query checks nothing
    trusted: bool
    generation: int  # rises with every re-resolve (not with a limit change)
    # True: available_memory() reads every level anew (a closed monitor, or a limited level
    # whose usage files could not be opened: it must not drop out of the minimum)
    uncached: bool
    # limits on the process that no cgroup enforces (RLIMIT_AS/DATA, a Slurm job's declared
    # --mem), read with the snapshot: available_memory() reads /proc/self/statm only if any
    process: tuple[ProcessLimit, ...]

    def __init__(self, total: int, limited: tuple[HeadroomSource, ...], levels: tuple[Level, ...],
                 host: HostMemory, status: Status, resolution: discovery.Resolution,
                 expires: Optional[float],
                 pending: Optional[Callable[[float], list[tuple[int, int]]]] = None,
                 trusted: bool = False, generation: int = 0, uncached: bool = False,
                 process: tuple[ProcessLimit, ...] = ()) -> None:
        fill(self, locals())


def make(res: discovery.Resolved, levels: tuple[Level, ...], host: HostMemory, mode: str,
         reason: str, expires: Optional[float], generation: int) -> Snapshot:
    """The snapshot of resolved levels; `reason` is the watch state's (problems of the levels
    are added here)."""
    # The hot path searches memory.stat for the whole line start "\n<key> ".
    key = b"\n" + FileNames.for_version(res.version).inactive_key + b" "
    usage_name = FileNames.for_version(res.version).usage
    limited = []
    for lvl in levels:
        if lvl.limit is not None and lvl.kept is not None and lvl.kept.has(usage_name) \
                and lvl.kept.has(names.STAT):
            limited.append((None, lvl.limit, lvl.kept.fd(usage_name), lvl.kept.fd(names.STAT),
                            key))
    cgroup_limits = [lvl.limit for lvl in levels if lvl.limit is not None]
    process, process_problem = _process_limits(
        [(lvl.cgroup_path, lvl.limit) for lvl in levels])
    # A Slurm job's declared --mem counts in total_memory() (rlimits limit mappings, not
    # memory: they count in available_memory() only)
    total = min([host.total] + cgroup_limits
                + [p.limit for p in process if p.kind == proclimits.SLURM])
    blind = sum(1 for lvl in levels if lvl.limit is not None) > len(limited)
    problems = [lvl.problem for lvl in levels if lvl.problem] + [process_problem]
    problems += [f"{p.label} counted in total_memory(): {p.note.split(';')[0]}"
                 for p in process if p.kind == proclimits.SLURM]
    reason = "; ".join(r for r in (reason, *problems) if r)
    status = Status(mode, reason, res.version, res.cgroup_path, res.directory, host.source,
                    above=_above(res, levels))
    return Snapshot(total, tuple(limited), levels, host, status, res, expires,
                    generation=generation, uncached=blind, process=process)


def _above(res: discovery.Resolved, levels: tuple[Level, ...]) -> str:
    """The status sentence on what lies above the visible top level ("" if nothing)."""
    visible = [lvl for lvl in levels if not lvl.hidden]
    hidden = [lvl for lvl in levels if lvl.hidden]
    if hidden and visible:
        return (f"a limit of {human_bytes(hidden[0].limit)} above {visible[-1].cgroup_path} "
                "(v1 hierarchical_memory_limit): its usage cannot be seen, so "
                "available_memory() is an upper bound there")
    top = visible[-1] if visible else None
    if res.version == 2 and top is not None and top.kept is not None \
            and top.kept.has(FileNames.for_version(2).limit):
        # The real v2 root has no memory.max; a top level that has one (its descriptor was
        # opened when its limit was read) is a namespace root or a subtree mount, and no
        # file shows the limits above it (checked on 6.1).
        return f"limits above {top.cgroup_path} cannot be seen from here"
    return ""


def _process_limits(levels: Sequence[tuple[str, Optional[int]]],
                    ) -> tuple[tuple[ProcessLimit, ...], str]:
    """The limits on the process that no cgroup enforces (`levels`: each level's cgroup path
    and limit, the process's own first), and why one could not be read ("")."""
    try:
        return read_process_limits(os.environ, levels)
    except Exception as e:  # noqa: BLE001 - a snapshot must be made (EMFILE on a lazy import)
        return (), f"rlimits and a Slurm job's declared limit not read: {e}"


def host_only(res: discovery.Unresolved, host: HostMemory, generation: int) -> Snapshot:
    process, problem = _process_limits(())
    reason = "; ".join(r for r in (res.reason, problem) if r)
    status = Status(HOST, reason, None, None, None, host.source)
    total = min([host.total] + [p.limit for p in process if p.kind == proclimits.SLURM])
    return Snapshot(total, (), (), host, status, res, None, generation=generation,
                    process=process)


def without_descriptors(snap: Snapshot, reason: str, expires: float) -> Snapshot:
    """The same levels with no kept descriptor (a closed monitor): answers are read anew."""
    levels = tuple(replace(lvl, kept=None) for lvl in snap.levels)
    status = replace(snap.status, mode=POLLING if snap.levels else snap.status.mode,
                     reason=reason)
    return replace(snap, limited=(), levels=levels, status=status, expires=expires,
                   pending=None, trusted=False, uncached=True)


def read_levels(snap: Snapshot) -> list[LevelInfo]:
    """Every level from the process's cgroup to the top, read now, with the binding marks
    (`headroom.binding_levels`: a level binds only where the host does not bind tighter)."""
    res = snap.resolution
    if not isinstance(res, discovery.Resolved):
        return _marked(snap, _process_levels(snap))
    fnames = FileNames.for_version(res.version)
    reads = []
    for lvl in snap.levels:
        usage = inactive = room = None
        stat = b""
        problem = lvl.problem
        try:
            usage = values.parse_counter(lvl.read(fnames.usage))
            stat = lvl.read(names.STAT)
            inactive = values.find_stat_value(stat, fnames.inactive_key)
        except FileNotFoundError:
            pass  # v2 levels without the memory controller (and the root) have no usage
        except (OSError, ValueError) as e:
            problem = problem or str(e)
        if lvl.limit is not None and usage is not None and inactive is not None:
            room = headroom(lvl.limit, usage, inactive)
        high, swap_limit, swap_usage = _throttle_and_swap(lvl, fnames, stat)
        high_room = headroom(high, usage, inactive) \
            if high is not None and usage is not None and inactive is not None else None
        if lvl.hidden:
            high = high_room = swap_limit = swap_usage = None
        reads.append(LevelInfo(lvl.cgroup_path, lvl.directory, lvl.limit, usage, inactive,
                               room, False, False, problem, high, high_room, swap_limit,
                               swap_usage, lvl.hidden))
    return _marked(snap, _slurm_roles(reads) + _process_levels(snap))


def _marked(snap: Snapshot, reads: list[LevelInfo]) -> list[LevelInfo]:
    """`reads` with binds_total and binds_available set (`headroom.binding_levels`)."""
    # rlimits bound mappings, not memory: never total_memory()
    total_at, available_at = binding_levels(
        [r.limit if r.kind in ("cgroup", proclimits.SLURM) else None for r in reads],
        [r.headroom for r in reads], snap.host.total,
        _host_available(snap.host) if any(r.headroom is not None for r in reads) else None)
    return [replace(info, binds_total=i == total_at, binds_available=i == available_at)
            for i, info in enumerate(reads)]


def _slurm_roles(reads: list[LevelInfo]) -> list[LevelInfo]:
    """The levels with the Slurm job's and step's marked (a path that is not Slurm's: as is)."""
    if not reads:
        return reads
    from .slurm import parse_slurm_cgroup  # not at import: it compiles regular expressions

    place = parse_slurm_cgroup(reads[0].cgroup_path)
    if place is None:
        return reads
    out = []
    for info in reads:
        role = place.role(info.cgroup_path)
        out.append(info if role is None else replace(
            info, slurm_role=role, slurm_id=str(place.job) if role == "job" else place.step_id))
    return out


def _process_levels(snap: Snapshot) -> list[LevelInfo]:
    """A level for each limit on the process that no cgroup enforces, read now."""
    if not snap.process:
        return []
    problem: Optional[str] = None
    try:
        used = proclimits.rooms(snap.process, proclimits.read_statm())
    except (OSError, ValueError) as e:
        used, problem = [], str(e)
    out = []
    for i, lim in enumerate(snap.process):
        usage, room = used[i] if used else (None, None)
        out.append(LevelInfo(lim.label, proclimits.STATM, lim.limit, usage, None, room,
                             False, False, problem or lim.note, kind=lim.kind))
    return out



def _host_available(host: HostMemory) -> Optional[int]:
    """MemAvailable, or None when it cannot be read (the marks then follow the levels)."""
    try:
        return host.available()
    except (OSError, ValueError):
        return None


def _optional_number(lvl: Level, name: str, version: int) -> Optional[int]:
    """A limit-like file that may be absent (no swap accounting, the v2 root): None then."""
    if not name:
        return None
    try:
        return values.parse_limit(lvl.read(name), version)
    except (OSError, ValueError):
        return None


def _throttle_and_swap(lvl: Level, fnames: FileNames, stat: bytes,
                       ) -> tuple[Optional[int], Optional[int], Optional[int]]:
    """(memory.high, swap limit, swap usage) of a level, each None where not known. Swap
    usage is the kernel's own figure: v2 memory.swap.current, v1 `total_swap` of the
    memory.stat already read (`stat`)."""
    high = _optional_number(lvl, fnames.high, fnames.version)
    swap_limit = _optional_number(lvl, fnames.swap_limit, fnames.version)
    if fnames.version == 1:
        # v1 memsw limits memory + swap: the swap share is the difference of two settings.
        swap_limit = swap_limit - lvl.limit if swap_limit is not None \
            and lvl.limit is not None and swap_limit >= lvl.limit else None
        try:
            swap_usage = values.parse_v1_swap(stat)
        except ValueError:
            swap_usage = None
    else:
        swap_usage = _optional_number(lvl, fnames.swap_usage, fnames.version)
    return high, swap_limit, swap_usage


def uncached_available(snap: Snapshot) -> int:
    """available_memory() from fresh reads of every level, never above total: what a closed
    monitor and the error path answer. A limited level never drops out: whose memory.stat
    cannot be read counts as limit - usage, whose usage cannot be read either as 0 (neither
    is ever above the truth)."""
    rooms = [snap.total, snap.host.available()]
    for info in read_levels(snap):
        if info.headroom is not None:
            rooms.append(info.headroom)
        elif info.limit is not None:
            rooms.append(info.limit - info.usage if info.usage is not None else 0)
    return max(0, min(rooms))
