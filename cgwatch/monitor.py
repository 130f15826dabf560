"""The Monitor: cached cgroup memory limits, live headroom, and the thread that keeps them true.

Shape (DESIGN.md §3): the cgroup is resolved once; the result is an immutable snapshot that a
background thread replaces whenever inotify says a limit changed, a cgroup was removed, or
the slow timer finds the process moved. Queries read the current snapshot without a lock, so
they see either the old or the new state, never a mix, and never raise.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from . import discovery, tree, values
from .files import READ_SIZE, close_quietly, read_file, under_root
from .hostmem import HostMemory
from .names import FileNames
from .tree import Level
from .watcher import Change, Target, TargetGone, Watcher, WatchUnavailable

log = logging.getLogger("cgwatch")
_pread = os.pread  # a module global: one lookup less per read on the hot path

WATCHING = "watching"  # inotify keeps the cache exact; queries read it as is
POLLING = "polling"  # no inotify: limits re-read when the cache is older than poll_interval
HOST = "host"  # no usable memory cgroup: host values (MemTotal / MemAvailable)

# How often a re-resolve is retried when the tree changes between resolving and watching.
_RESOLVE_ATTEMPTS = 5


@dataclass(frozen=True)
class Status:
    """How the monitor gets its answers, and why."""

    mode: str  # WATCHING, POLLING or HOST
    reason: str  # why not WATCHING (empty when all is well), or a problem with a level
    version: Optional[int]  # cgroup version of the memory hierarchy, None without one
    cgroup_path: Optional[str]  # the process's path inside the hierarchy
    directory: Optional[str]  # where that path's files were found
    host_source: str  # "meminfo" or "psutil"


@dataclass(frozen=True)
class LevelInfo:
    """One level as it is now, for display and diagnosis (read live, not the hot path)."""

    cgroup_path: str
    directory: str
    limit: Optional[int]
    usage: Optional[int]
    inactive_file: Optional[int]
    headroom: Optional[int]  # limit - (usage - inactive_file), None without a limit
    binds_total: bool  # this level's limit is total_memory()
    binds_available: bool  # this level's headroom is available_memory()
    problem: Optional[str]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# (lower bound on the headroom or None, limit, usage fd, stat fd, memory.stat needle)
_LimitedLevel = tuple[Optional[int], int, int, int, bytes]


@dataclass(frozen=True)
class _Snapshot:
    total: int
    # (None, limit, usage fd, stat fd, b"\n<memory.stat key> ") of each limited level: all the
    # hot path needs (None: "usage not read yet", see available_memory)
    limited: tuple[_LimitedLevel, ...]
    levels: tuple[Level, ...]
    host: HostMemory
    status: Status
    resolution: discovery.Resolution
    expires: Optional[float]  # None: kept exact by the watcher; else re-read after this time


def headroom(limit: int, usage: int, inactive_file: int) -> int:
    """limit - working set, where the working set leaves out reclaimable inactive page cache
    (the kubelet's definition) and is never negative."""
    working_set = usage - inactive_file
    return limit - working_set if working_set > 0 else limit


_monitors: weakref.WeakSet[Monitor] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for monitor in list(_monitors):
        monitor._forget_thread_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Monitor:
    """Memory limits and headroom of the calling process's cgroup, kept current.

    `root` prefixes every path read (/proc/..., /sys/fs/cgroup/...), so tests can use a fake
    tree. `migration_interval`: seconds between checks that the process was not moved to
    another cgroup (nothing notifies that). `poll_interval`: cache lifetime when inotify is
    unavailable. `use_inotify=False` forces polling.
    """

    def __init__(
        self,
        root: str = "/",
        *,
        migration_interval: float = 5.0,
        poll_interval: float = 0.02,
        use_inotify: bool = True,
    ) -> None:
        self.root = root
        self.migration_interval = migration_interval
        self.poll_interval = poll_interval
        self._use_inotify = use_inotify
        self._lock = threading.RLock()  # serialises writers of the snapshot, never queries
        self._closed = False
        self._reported: set[str] = set()
        self._proc_cgroup_text = ""
        self._watcher: Optional[Watcher] = None
        self._watch_problem = ""
        self._thread: Optional[threading.Thread] = None
        self._wake_r, self._wake_w = -1, -1
        self._pid = os.getpid()
        self._limit_fds: dict[str, int] = {}  # directory -> its limit file, kept by the thread
        self._change_hooks: list[Callable[[list[Change]], None]] = []
        self._reload_hooks: list[Callable[[], None]] = []
        self._target_hooks: list[Callable[[], list[Target]]] = []
        self._snap: _Snapshot = self._build_snapshot(previous=None)
        _monitors.add(self)
        self._arm()

    # ---- queries: no lock, no exception -------------------------------------------------

    def total_memory(self) -> int:
        """The smallest hard limit on the path to the top, capped at host RAM (bytes)."""
        snap = self._snap
        if snap.expires is None:
            return snap.total
        return self._fresh_snapshot(snap).total

    def available_memory(self) -> int:
        """Bytes this process can still allocate before some level's limit or the host's
        MemAvailable stops it: min over limited levels of limit - (usage - inactive_file)."""
        snap = self._snap
        if snap.expires is not None:
            snap = self._fresh_snapshot(snap)
        try:
            best = -1
            order: Sequence[_LimitedLevel] = snap.limited
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
                elif best >= 0 and bound >= best:
                    break
                else:
                    usage = limit - bound
                # Inlined values.find_stat_value (this loop is the hot path): `key` is
                # b"\n<name> ", so a match is a whole key at a line start; int() rejects
                # anything but a number. Not found (first line, or missing): the full parser
                # decides, and raises if it is really missing.
                data = _pread(stat_fd, READ_SIZE, 0)
                start = data.find(key)
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
            return best if best > 0 else 0
        except Exception as e:  # noqa: BLE001 - a query must answer, whatever went wrong
            return self._available_after_error(snap, e)

    @property
    def status(self) -> Status:
        return self._snap.status

    def levels(self) -> list[LevelInfo]:
        """Every level from the process's cgroup to the top, read now."""
        snap = self._fresh_snapshot(self._snap) if self._snap.expires is not None else self._snap
        res = snap.resolution
        if not isinstance(res, discovery.Resolved):
            return []
        names = FileNames.for_version(res.version)
        reads = []
        for lvl in snap.levels:
            usage = inactive = room = None
            problem = lvl.problem
            try:
                usage = values.parse_counter(read_file(os.path.join(lvl.directory,
                                                                           names.usage)))
                stat = read_file(os.path.join(lvl.directory, "memory.stat")).encode()
                inactive = values.find_stat_value(stat, names.inactive_key)
            except FileNotFoundError:
                pass  # v2 levels without the memory controller (and the root) have no usage
            except (OSError, ValueError) as e:
                problem = problem or str(e)
            if lvl.limit is not None and usage is not None and inactive is not None:
                room = headroom(lvl.limit, usage, inactive)
            reads.append(LevelInfo(lvl.cgroup_path, lvl.directory, lvl.limit, usage, inactive,
                                   room, False, False, problem))
        limits = [r.limit for r in reads if r.limit is not None]
        total_binder = min(limits) if limits and min(limits) < snap.host.total else None
        rooms = [r.headroom for r in reads if r.headroom is not None]
        room_binder = min(rooms) if rooms else None
        result = []
        for info in reads:
            # Only the first (deepest) of equal levels is marked as binding.
            binds_total = total_binder is not None and info.limit == total_binder
            binds_available = room_binder is not None and info.headroom == room_binder
            if binds_total:
                total_binder = None
            if binds_available:
                room_binder = None
            result.append(replace(info, binds_total=binds_total,
                                  binds_available=binds_available))
        return result

    def host_memory(self) -> tuple[int, int]:
        """(MemTotal, MemAvailable) of the host, bytes."""
        host = self._snap.host
        return host.total, host.available()

    # ---- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop the thread and the watches. Queries keep answering, from polling reads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock:
            self._stop_watching()
            self._close_limit_fds()
            # The thread closes the read end of the wake pipe as it exits; the write end is ours.
            if self._wake_w >= 0:
                os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
            self._watch_problem = "monitor closed"
            snap = self._snap
            if isinstance(snap.resolution, discovery.Resolved):
                self._snap = self._publishable(snap.resolution, snap.levels, snap.host)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # The thread holds only a weak reference, so an unclosed monitor is still collected;
        # waking the thread lets it see that and exit.
        try:
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")
                os.close(self._wake_w)
        except (OSError, AttributeError):
            pass
        try:
            self._close_limit_fds()
        except AttributeError:
            pass  # __init__ did not get that far

    # ---- hooks for the events layer ------------------------------------------------------

    def _add_change_hook(self, hook: Callable[[list[Change]], None]) -> None:
        self._change_hooks.append(hook)

    def _add_target_hook(self, hook: Callable[[], list[Target]]) -> None:
        """More inotify targets (events.py: memory.events files), asked for on every re-watch.
        The hook runs under self._lock and must not raise."""
        with self._lock:
            self._target_hooks.append(hook)
            if self._watcher is not None and not self._start_watching():
                self._reload("the cgroup tree changed while it was being watched")

    def _remove_hooks(self, *hooks: object) -> None:
        """Drop the events layer's hooks. The lists are replaced, not mutated, because the
        thread may be iterating over them."""
        with self._lock:
            self._change_hooks = [h for h in self._change_hooks if h not in hooks]
            self._reload_hooks = [h for h in self._reload_hooks if h not in hooks]
            if any(h in hooks for h in self._target_hooks):
                self._target_hooks = [h for h in self._target_hooks if h not in hooks]
                if self._watcher is not None and not self._start_watching():
                    self._reload("the cgroup tree changed while it was being watched")

    # ---- building snapshots (under self._lock) ---------------------------------------------

    def _report(self, reason: str) -> None:
        """Log a fallback or problem once per distinct reason."""
        if reason and reason not in self._reported:
            self._reported.add(reason)
            log.warning("cgwatch: %s", reason)

    def _build_snapshot(self, previous: Optional[_Snapshot]) -> _Snapshot:
        resolution, self._proc_cgroup_text = tree.resolve_process(self.root)
        host = previous.host if previous is not None else HostMemory(self.root)
        if host.reason:
            self._report(host.reason)
        if isinstance(resolution, discovery.Resolved):
            try:
                old_levels = previous.levels if previous is not None else ()
                lvls = tree.build_levels(self.root, resolution, old_levels)
                return self._publishable(resolution, lvls, host)
            except OSError as e:
                resolution = discovery.Unresolved(f"cannot read {resolution.directory}: {e}")
        assert isinstance(resolution, discovery.Unresolved)
        self._report(f"no memory cgroup, using host values: {resolution.reason}")
        status = Status(HOST, resolution.reason, None, None, None, host.source)
        return _Snapshot(host.total, (), (), host, status, resolution, None)

    def _publishable(self, res: discovery.Resolved, lvls: tuple[Level, ...],
                     host: HostMemory) -> _Snapshot:
        # The hot path searches memory.stat for the whole line start "\n<key> ".
        key = b"\n" + FileNames.for_version(res.version).inactive_key + b" "
        limited = tuple((None, lvl.limit, lvl.kept.usage_fd, lvl.kept.stat_fd, key)
                        for lvl in lvls if lvl.limit is not None and lvl.kept is not None)
        total = min([host.total] + [lvl.limit for lvl in lvls if lvl.limit is not None])
        problems = [lvl.problem for lvl in lvls if lvl.problem]
        for problem in problems:
            self._report(problem)
        reason = "; ".join(problems)
        if self._watcher is not None:
            mode = WATCHING
        else:
            # Also the state during construction, until _arm() has created the watcher.
            mode = POLLING
            reason = "; ".join(r for r in (self._watch_problem or "not watching yet", reason) if r)
        status = Status(mode, reason, res.version, res.cgroup_path, res.directory, host.source)
        expires = None if mode == WATCHING else time.monotonic() + self.poll_interval
        return _Snapshot(total, limited, lvls, host, status, res, expires)

    def _reload(self, why: str) -> None:
        """Resolve everything again (the process moved, a cgroup vanished, a fork)."""
        with self._lock:
            log.debug("cgwatch: re-resolving (%s)", why)
            self._close_limit_fds()
            for _ in range(_RESOLVE_ATTEMPTS):
                self._snap = self._build_snapshot(self._snap)
                if self._watch_and_verify():
                    break
                why = "the cgroup tree changed while it was being watched"
            else:
                self._fall_back_to_polling(f"cgroup tree kept changing ({why})")
            for hook in self._reload_hooks:
                hook()

    def _reload_changed_limits(self, targets: list[Target]) -> None:
        """Re-read only the limit files that raised an event, each with one pread(2) through a
        descriptor kept for it, and publish. Few syscalls matter on this path: each lets the
        GIL go, and a busy Python thread can keep it for a whole switch interval (5 ms) before
        this thread gets it back, all while total_memory() still answers the old limit.
        Anything unusual (unreadable, a level that becomes limited and has no usage
        descriptors yet) takes the full re-read."""
        with self._lock:
            snap = self._snap
            res = snap.resolution
            if not isinstance(res, discovery.Resolved):
                return
            lvls = list(snap.levels)
            for target in targets:
                index = target.level_index
                if not (0 <= index < len(lvls)
                        and os.path.dirname(target.path) == lvls[index].directory):
                    self._reload_limits()  # the levels changed under the watch: re-read all
                    return
                lvl = lvls[index]
                try:
                    fd = self._limit_fds.get(lvl.directory)
                    if fd is None:
                        fd = os.open(target.path, os.O_RDONLY | os.O_CLOEXEC)
                        self._limit_fds[lvl.directory] = fd
                    limit = values.parse_limit(os.pread(fd, 64, 0), res.version)
                except (OSError, ValueError):
                    limit = -1
                if limit == -1 or (limit is not None and lvl.kept is None) or lvl.problem:
                    self._reload_limits()
                    return
                lvls[index] = replace(lvl, limit=limit)
            self._snap = self._publishable(res, tuple(lvls), snap.host)

    def _close_limit_fds(self) -> None:
        fds, self._limit_fds = self._limit_fds, {}
        close_quietly(*fds.values())

    def _reload_limits(self) -> None:
        """Re-read the limits of the levels already known (a limit file changed)."""
        with self._lock:
            if not self._reread_limits():
                self._reload("the process's cgroup directory vanished")

    def _reread_limits(self) -> bool:
        """Publish a snapshot with freshly read limits; False if our directory is gone."""
        snap = self._snap
        res = snap.resolution
        if not isinstance(res, discovery.Resolved):
            return True
        try:
            lvls = tree.build_levels(self.root, res, snap.levels)
        except OSError:
            return False
        # A limit that cannot be read right now (a writer truncated the file and has not
        # written yet, say) keeps its last good value rather than vanishing from the min.
        old = {lvl.directory: lvl for lvl in snap.levels}
        lvls = tuple(
            replace(lvl, limit=old[lvl.directory].limit, kept=old[lvl.directory].kept)
            if lvl.problem and lvl.directory in old and old[lvl.directory].limit is not None
            else lvl
            for lvl in lvls
        )
        self._snap = self._publishable(res, lvls, snap.host)
        return True

    def _watch_and_verify(self) -> bool:
        """Watch the resolved levels, then look again: a change made before the watches
        existed shows in the second look, one made after raises an event. False: resolve
        again (a path vanished, or the process moved meanwhile)."""
        if not self._start_watching():
            return False
        try:
            text = read_file(under_root(self.root, "/proc/self/cgroup"))
        except OSError:
            text = ""
        if text != self._proc_cgroup_text:
            return False
        return self._reread_limits()

    # ---- the watcher and its thread ----------------------------------------------------------

    def _watch_targets(self) -> list[Target]:
        snap = self._snap
        res = snap.resolution
        if not isinstance(res, discovery.Resolved):
            return []
        names = FileNames.for_version(res.version)
        targets = []
        for index, lvl in enumerate(snap.levels):
            limit_path = os.path.join(lvl.directory, names.limit)
            if os.path.exists(limit_path):
                targets.append(Target(limit_path, "limit", index))
            if index > 0:
                # rmdir of a cgroup raises no event on its own files on some kernels (seen on
                # 6.18, v1), only IN_DELETE in the parent directory: watch parents for that.
                targets.append(Target(lvl.directory, "dir", index))
        targets.extend(self._extra_targets())
        return targets

    def _extra_targets(self) -> list[Target]:
        return [target for hook in self._target_hooks for target in hook()]

    def _start_watching(self) -> bool:
        """Point inotify at the current levels, creating the watcher if it is missing (so a
        watch limit hit earlier is retried on every re-resolve). False if a path vanished
        between resolving and watching: the caller resolves again."""
        if not self._use_inotify:
            self._watch_problem = "inotify disabled by the caller"
            return True
        if self._closed:
            return True
        if self._watcher is None:
            try:
                self._watcher = Watcher()
            except WatchUnavailable as e:
                self._fall_back_to_polling(str(e))
                return True
        try:
            self._watcher.replace(self._watch_targets())
        except TargetGone:
            return False
        except WatchUnavailable as e:
            self._fall_back_to_polling(str(e))
            return True
        self._watch_problem = ""
        snap = self._snap
        if isinstance(snap.resolution, discovery.Resolved):
            self._snap = self._publishable(snap.resolution, snap.levels, snap.host)
        return True

    def _fall_back_to_polling(self, reason: str) -> None:
        self._watch_problem = reason
        self._report(f"{reason}; polling every {self.poll_interval}s instead")
        self._stop_watching()
        snap = self._snap
        if isinstance(snap.resolution, discovery.Resolved):
            self._snap = self._publishable(snap.resolution, snap.levels, snap.host)

    def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    def _arm(self) -> None:
        """Start watching (if possible) and the background thread."""
        with self._lock:
            # Both paths publish a snapshot that reflects the watcher's state.
            if not self._watch_and_verify():
                self._reload("the cgroup tree changed while it was being watched")
            self._wake_r, self._wake_w = os.pipe()
            for fd in (self._wake_r, self._wake_w):
                os.set_inheritable(fd, False)
            # The first migration check is one interval away: everything was just resolved.
            first_check = time.monotonic() + self.migration_interval
            self._thread = threading.Thread(target=_run_thread, args=(weakref.ref(self),
                                            self._wake_r, first_check), name="cgwatch",
                                            daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

    def _thread_step(self, poller: select.poll, state: dict[str, Any]) -> float:
        """One turn of the background loop before it blocks: process what is ready, register
        the watcher's fd if it changed, and return how long to block (ms)."""
        for ready_fd in state.pop("ready", ()):
            if ready_fd == self._wake_r:
                os.read(ready_fd, 512)
            elif self._watcher is not None and ready_fd == state.get("registered"):
                self._handle_changes(self._watcher)
        if time.monotonic() >= state["next_check"]:
            self._periodic_check()
            state["next_check"] = time.monotonic() + self.migration_interval
        fd = self._watcher.fileno() if self._watcher is not None else None
        if fd != state.get("registered"):
            if state.get("registered") is not None:
                poller.unregister(state["registered"])
            if fd is not None:
                poller.register(fd, select.POLLIN)
            state["registered"] = fd
        return max(0.0, float(state["next_check"]) - time.monotonic()) * 1000

    def _handle_changes(self, watcher: Watcher) -> None:
        try:
            changes, rebuild = watcher.read()
        except OSError as e:
            with self._lock:
                self._fall_back_to_polling(f"reading inotify failed: {e}")
            return
        lvls = self._snap.levels
        # A "dir" watch sits on level i; only the removal of level i-1 (our path) matters there,
        # not a sibling's.
        removed = any(c.target.kind == "dir" and 0 < c.target.level_index < len(lvls)
                      and c.name == os.path.basename(lvls[c.target.level_index - 1].directory)
                      for c in changes)
        if rebuild or removed:
            self._reload("a watched cgroup was removed or the event queue overflowed")
        elif any(c.target.kind == "limit" for c in changes):
            self._reload_changed_limits([c.target for c in changes if c.target.kind == "limit"])
        for hook in self._change_hooks:
            hook(changes)

    def _periodic_check(self) -> None:
        try:
            text = read_file(under_root(self.root, "/proc/self/cgroup"))
        except OSError:
            text = ""
        if text != self._proc_cgroup_text:
            self._reload("the process moved to another cgroup")
        elif self._watcher is None and self._use_inotify and not self._closed:
            self._reload("retrying inotify")  # the watch limit may have been raised or freed
        self._snap.host.refresh_bound()

    # ---- slow paths: polling, fork, errors ---------------------------------------------------

    def _fresh_snapshot(self, snap: _Snapshot) -> _Snapshot:
        """The snapshot to answer from when the cached one may be stale."""
        if self._pid != os.getpid():
            self._rearm_after_fork()
            return self._snap
        # Only one thread re-reads; others answer from the snapshot they have, which is at most
        # one poll interval old.
        stale = self._closed or time.monotonic() >= (snap.expires or 0.0)
        if stale and self._lock.acquire(blocking=False):
            try:
                if self._snap is snap:
                    self._reload_limits()
                    if self._closed:
                        self._maybe_check_migration()
            finally:
                self._lock.release()
        return self._snap

    _last_migration_check = 0.0

    def _maybe_check_migration(self) -> None:
        # Without a thread (closed), migration is checked from the query path at the same rate.
        now = time.monotonic()
        if self._closed and now - self._last_migration_check >= self.migration_interval:
            self._last_migration_check = now
            self._periodic_check()

    def _forget_thread_after_fork(self) -> None:
        """In a fork child: the thread did not survive. Mark the cache stale; the next query
        re-arms (starting threads inside an at-fork handler is not safe)."""
        self._thread = None
        self._lock = threading.RLock()  # the parent's may have been held by another thread
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        close_quietly(self._wake_r, self._wake_w)
        self._wake_r = self._wake_w = -1
        self._snap = replace(self._snap, expires=0.0)

    def _rearm_after_fork(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._snap = self._build_snapshot(self._snap)
            if not self._closed:
                self._arm()

    def _available_after_error(self, snap: _Snapshot, error: Exception) -> int:
        """A hot-path read failed (a removed cgroup gives ENODEV): re-resolve and answer from
        fresh reads, never above total_memory(); if even that fails, the host's MemAvailable
        capped at total_memory()."""
        self._report(f"reading usage failed ({error!r}); re-resolving")
        try:
            self._reload(f"read error: {error!r}")
            rooms = [self._snap.total, self._snap.host.available()]
            for info in self.levels():
                if info.headroom is not None:
                    rooms.append(info.headroom)
                elif info.limit is not None and info.usage is not None:
                    # memory.stat unreadable: limit - usage can only be lower than the truth.
                    rooms.append(info.limit - info.usage)
            return max(0, min(rooms))
        except Exception as e2:  # noqa: BLE001
            self._report(f"fallback read failed too ({e2!r}); answering min(host available, "
                         "total_memory())")
            try:
                return max(0, min(snap.host.available(), snap.total))
            except Exception:  # noqa: BLE001
                return snap.total


def _run_thread(ref: weakref.ref[Monitor], wake_r: int, first_check: float) -> None:
    """The background thread: block on inotify and the wake pipe, with the slow timer.

    It keeps only a weak reference to its monitor while blocked, so a monitor that is dropped
    without close() is collected and its __del__ wakes the thread to exit.
    """
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    state: dict[str, Any] = {"next_check": first_check}
    try:
        while True:
            monitor = ref()
            if monitor is None or monitor._closed or monitor._wake_r != wake_r:
                return
            try:
                timeout_ms = monitor._thread_step(poller, state)
            except Exception:  # noqa: BLE001 - the thread must outlive any one bad reading
                log.exception("cgwatch: background thread error (continuing)")
                timeout_ms = 1000.0
            del monitor
            try:
                state["ready"] = [fd for fd, _ in poller.poll(timeout_ms)]
            except OSError:
                state["ready"] = []
    finally:
        close_quietly(wake_r)

