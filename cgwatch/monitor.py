"""Internal. The Monitor: cached cgroup memory limits and live headroom, kept true
(tracker.py), with a public seam for the layers built on it (subscribe, layout).

Queries read the current immutable snapshot without a lock and never raise. Before
answering, a query makes two cheap checks (about 0.3 us together): poll(0) on the inotify
descriptor (a limit write by any process queues its event before that write(2) returns, so a
query that starts after the write sees it: read-your-writes), and the clock (every
`confirm_interval`, 0.1 s, it re-reads /proc/self/cgroup: nothing notifies a move to another
cgroup). Only when one fires does it take the tracker's lock and bring the snapshot up to
date itself, so the answers are exact with or without the background thread.
"""

from __future__ import annotations

import os
import time

from . import values
from .envswitch import switch_off
from .files import READ_SIZE
from .frozen import replace
from .headroom import headroom, throttle_headroom
from .proclimits import least_room as _least_room
from .seam import Change, Layout, Subscription
from .snapshot import (
    HOST,
    POLLING,
    WATCHING,
    LevelInfo,
    Snapshot,
    Status,
    read_levels,
    uncached_available,
)
from .tracker import Tracker

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Callable, Optional

    from .snapshot import HeadroomSource

__all__ = ["HOST", "POLLING", "WATCHING", "Change", "Layout", "LevelInfo", "Monitor",
           "Status", "Subscription", "headroom"]

_pread = os.pread  # module globals: one lookup less per call on the hot path
_monotonic = time.monotonic


def _thread_default() -> bool:
    """CGWATCH_THREAD=0 makes monitors thread-free by default (for code you cannot edit that
    forks a lot: DataLoader workers, fork pools); `envswitch` spells on and off."""
    return not switch_off("CGWATCH_THREAD", os.environ)


class Monitor:
    """Memory limits and headroom of the calling process's cgroup, kept current.

    `root` prefixes every path read (/proc/..., /sys/fs/cgroup/...), so tests can use a fake
    tree. `confirm_interval`: at most this long (seconds) after a move to another cgroup,
    queries answer for the new one. `migration_interval`: the background thread's own check
    for a move (its only idle wake-up). `poll_interval`: how often a closed monitor re-reads.
    `use_inotify=False` forces polling, exact all the same (each query preads every level's
    limit file); CGWATCH_INOTIFY=0 does it for every monitor of the process, and a process
    polls by itself when the uid has too few inotify instances left (docs/design.md §3a).

    `thread`: serve this monitor from the process-wide background thread (default True, or
    the CGWATCH_THREAD environment variable). Thread-free, queries stay exact (they drain
    inotify and check for moves themselves); what needs the thread is telling anyone without
    a query: `subscribe()` and `Events` start it when they are used. The default monitor
    behind the module functions is thread-free (`cgwatch.default_monitor()`).

    `pid`: another process's cgroup instead of ours (a sidecar, `cgwatch serve --pid`):
    resolved from /proc/PID/cgroup and /proc/PID/mountinfo, its move checked the same way.
    In another mount namespace its files are read under /proc/PID/root (ptrace read access
    needed); a cgroup that cannot be resolved gives mode HOST with the reason, as for ours.

    `fresh`: every query first applies the changes the kernel has queued (default). With
    `fresh=False` a watching, threaded monitor answers from the cache as the thread keeps it
    (no check at all per call): a limit write is seen after the thread's wake-up (~0.15 ms
    here), a move after `migration_interval`.
    """

    def __init__(
        self,
        root: str = "/",
        *,
        migration_interval: float = 5.0,
        confirm_interval: float = 0.1,
        poll_interval: float = 0.02,
        use_inotify: bool = True,
        thread: Optional[bool] = None,
        fresh: bool = True,
        pid: Optional[int] = None,
    ) -> None:
        self.root = root
        self.migration_interval = migration_interval
        self.confirm_interval = confirm_interval
        self.poll_interval = poll_interval
        self.pid = pid  # None: this process
        self._tracker = Tracker(root, migration_interval=migration_interval,
                                confirm_interval=confirm_interval, poll_interval=poll_interval,
                                use_inotify=use_inotify,
                                thread=_thread_default() if thread is None else thread,
                                fresh=fresh, pid=pid)

    # ---- queries: no lock unless something changed, no exception ----------------------------

    def total_memory(self) -> int:
        """The smallest hard limit on the path to the top, capped at host RAM (bytes)."""
        tracker = self._tracker
        snap = tracker.snap
        if snap.trusted:
            return snap.total
        pending = snap.pending
        if (pending is not None and pending(0)) or tracker.applying \
                or _monotonic() >= tracker.due:
            return tracker.refresh(snap).total
        # Read again after the checks: the thread may have consumed and published the change
        # between the first read and pending(0) (docs/design.md section 3).
        return tracker.snap.total

    def available_memory(self) -> int:
        """Bytes this process can still allocate before some level's limit or the host's
        MemAvailable stops it: min over limited levels of limit - (usage - inactive_file)."""
        tracker = self._tracker
        snap = tracker.snap
        if not snap.trusted:
            pending = snap.pending
            if (pending is not None and pending(0)) or tracker.applying \
                    or _monotonic() >= tracker.due:
                snap = tracker.refresh(snap)
                if snap.uncached:
                    return self._uncached(snap)
            else:
                snap = tracker.snap  # again after the checks, as in total_memory()
        try:
            best = -1
            order: Sequence[HeadroomSource] = snap.limited
            if len(order) > 1:
                # limit - usage is a lower bound on a level's headroom (inactive_file >= 0), and
                # costs one small read instead of memory.stat. Visit levels from the lowest
                # bound up and stop at the first whose bound is already >= the best headroom
                # found: that level, and every one after it, cannot lower the minimum.
                order = sorted([(lim - int(_pread(ufd, 64, 0)), lim, ufd, sfd, key)
                                for _, lim, ufd, sfd, key in order])
            for bound, limit, usage_fd, stat_fd, key in order:
                if bound is None:
                    usage = int(_pread(usage_fd, 64, 0))
                    if usage < 0:  # int() takes "-1", which no kernel writes
                        raise ValueError(f"negative usage {usage}")
                elif best >= 0 and bound >= best:
                    break
                else:
                    usage = limit - bound
                    if usage < 0:
                        raise ValueError(f"negative usage {usage}")
                # Inlined values.find_stat_value (this loop is the hot path): `key` is
                # b"\n<name> ", so a match is a whole key at a line start; int() rejects
                # anything but a number. Not found (first line, or missing): the full parser
                # decides, and raises if it is really missing.
                data = _pread(stat_fd, READ_SIZE, 0)
                # From the end: the key is unique, and v1's total_inactive_file sits near the
                # end of a ~1.5 KiB file (85 ns against 270 ns from the start, on 6.18).
                start = data.rfind(key)
                if start < 0:
                    inactive = values.find_stat_value(data, key[1:-1])
                else:
                    start += len(key)
                    end = data.find(b"\n", start)
                    inactive = int(data[start:end] if end >= 0 else data[start:])
                room = headroom(limit, usage, inactive)
                if room < 0:
                    room = 0  # over the limit (v1 lets usage overshoot briefly); -1 means "none"
                if best < 0 or room < best:
                    best = room
            # Skip the host's meminfo when a cheap lower bound on MemAvailable already shows
            # the host cannot be the binding level: min() would not change (hostmem.py says why
            # the bound is sound).
            if best < 0 or best > snap.host.available_lower_bound():
                host = snap.host.available()
                if best < 0 or host < best:
                    best = host
            if snap.process:
                # A limit no cgroup enforces (RLIMIT_AS/DATA, a Slurm job's declared --mem):
                # one read of /proc/self/statm, only when such a limit is set (proclimits.py)
                room = _least_room(snap.process)
                if best < 0 or room < best:
                    best = room
            if best > snap.total:
                # Only when MemTotal is below a level's headroom (garbage in meminfo, or a
                # fake tree): never above total_memory(), whatever the inputs.
                best = snap.total
            return best if best > 0 else 0
        except Exception as e:  # noqa: BLE001 - a query must answer, whatever went wrong
            return self._available_after_error(snap, e)

    @property
    def status(self) -> Status:
        tracker = self._tracker
        snap = self._current()
        reason = snap.status.reason
        if tracker.read_problem:
            reason = "; ".join(r for r in (reason, tracker.read_problem) if r)
        return replace(snap.status, reason=reason, confirmed_at=tracker.confirmed_at,
                       thread=tracker.served(), watches=tracker.watches)

    def levels(self) -> list[LevelInfo]:
        """Every level from the process's cgroup to the top, read now."""
        return read_levels(self._current())

    def throttle_headroom(self) -> Optional[int]:
        """Bytes before throttling starts: the least of high - working set over the levels
        with a v2 memory.high (None: no such level). A job over memory.high is not killed, but
        slowed hard by reclaim; size work by the smaller of this and available_memory()."""
        return throttle_headroom([info.high_headroom for info in self.levels()])

    def host_memory(self) -> tuple[int, int]:
        """(MemTotal, MemAvailable) of the host, bytes."""
        host = self._tracker.snap.host
        return host.total, host.available()

    # ---- the seam: what layers built on a monitor use ----------------------------------------

    def layout(self) -> Layout:
        """The resolved levels now (version, levels leaf first, generation), read-only."""
        self._current()
        return self._tracker.layout()

    def subscribe(self, callback: Callable[[Change], None], *,
                  files: Optional[Callable[[Layout], list[str]]] = None) -> Subscription:
        """Call `callback(change)` on the background thread after every re-resolve
        ("layout"), limit change ("limits") and change of a file that `files(layout)` names
        ("files"; asked again on every re-resolve, so it follows the levels; inotify
        IN_MODIFY, e.g. v2 memory.events). Starts the thread if needed. The callback must be
        quick and must not raise; `Subscription.close()` detaches it (a fork child's copy is
        detached already)."""
        return self._tracker.subscribe(callback, files)

    @property
    def subscriptions(self) -> int:
        """How many subscriptions are attached (an Events, an exporter, ...)."""
        return self._tracker.subscriptions

    # ---- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release every descriptor and watch and leave the background thread. Queries keep
        answering, from fresh reads (at most every poll_interval: /proc/self/cgroup first,
        so a move to another cgroup is followed, then the limits)."""
        self._tracker.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- slow paths -------------------------------------------------------------------------

    def _current(self) -> Snapshot:
        """The snapshot, brought up to date as a query would (for the slower accessors)."""
        tracker = self._tracker
        snap = tracker.snap
        if snap.trusted:
            return snap
        pending = snap.pending
        if (pending is not None and pending(0)) or tracker.applying \
                or _monotonic() >= tracker.due:
            return tracker.refresh(snap)
        return tracker.snap  # again after the checks, as in total_memory()

    def _uncached(self, snap: Snapshot) -> int:
        try:
            return uncached_available(snap)
        except Exception as e:  # noqa: BLE001
            self._tracker.report(f"reading the levels failed ({e!r}); answering "
                                 "min(host available, total_memory())")
            return self._last_resort(snap)

    def _available_after_error(self, snap: Snapshot, error: Exception) -> int:
        """A hot-path read failed (a removed cgroup gives ENODEV): re-resolve and answer from
        fresh reads, never above total_memory()."""
        tracker = self._tracker
        tracker.report(f"reading usage failed ({error!r}); re-resolving")
        try:
            tracker.resolve_again(f"read error: {error!r}")
            tracker.read_problem = f"reading usage failed: {error}"
            return uncached_available(tracker.snap)
        except Exception as e2:  # noqa: BLE001
            tracker.report(f"fallback read failed too ({e2!r}); answering min(host "
                           "available, total_memory())")
            return self._last_resort(snap)

    @staticmethod
    def _last_resort(snap: Snapshot) -> int:
        try:
            return max(0, min(snap.host.available(), snap.total))
        except Exception:  # noqa: BLE001
            return snap.total
