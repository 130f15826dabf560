"""Internal. The Tracker keeps one monitor's snapshot true: it resolves the cgroup, watches
the levels with inotify, applies changes, re-checks /proc/self/cgroup, and tells subscribers.

Who runs it:
- the process-wide loop thread (loop.py), which wakes on the inotify descriptor and on a slow
  timer (`migration_interval`): its only wake-up while idle;
- the queries themselves (`refresh`), whenever the hot path's cheap checks say so: a poll(0)
  of the inotify descriptor found changes queued (a limit write queues its event before the
  writer's write(2) returns, so a query that starts after it always sees it), or the
  `confirm_interval` (0.1 s) since /proc/self/cgroup was last read has passed, or a polling
  cache expired, or something that failed is due for a retry.

So the cache is exact without the thread; the thread only makes changes visible to
subscribers (and in `fresh=False` mode, to queries) without a query.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import threading
import time
import weakref
from dataclasses import replace
from typing import Callable, NamedTuple, Optional

from . import discovery, names, snapshot, tree, values
from .files import read_file, under_root
from .hostmem import HostMemory
from .kept import KeptDir, kept_dir
from .loop import LOOP, Timer, at_fork_in_child
from .names import FileNames
from .snapshot import HOST, POLLING, WATCHING, Snapshot
from .tree import Level
from .watcher import Change as WatchChange
from .watcher import Target, TargetGone, Watcher, WatchUnavailable

log = logging.getLogger("cgwatch")

_RESOLVE_ATTEMPTS = 5  # re-resolves when the tree changes between resolving and watching
RETRY_INTERVAL = 1.0  # seconds between retries of what failed (inotify, the thread, a resolve)


class Layout(NamedTuple):
    """The resolved levels, read-only: what the events layer and the exporter build on."""

    version: Optional[int]  # None: no memory cgroup (host values)
    levels: tuple[Level, ...]  # leaf first; Level.read(name) reads a file of that level
    generation: int  # rises with every re-resolve


class Change(NamedTuple):
    """What a subscriber is told: `kind` is "layout" (re-resolved: levels may differ),
    "limits" (a limit changed) or "files" (a file it asked to watch changed: `paths`)."""

    kind: str
    layout: Layout
    paths: tuple[str, ...] = ()


class Subscription:
    """A subscriber's hold on a monitor; close() detaches it (also done in a fork child)."""

    def __init__(self, tracker: Tracker, callback: Callable[[Change], None],
                 files: Optional[Callable[[Layout], list[str]]]) -> None:
        # Weak: the tracker holds its subscriptions, and a cycle would outlive a dropped monitor
        self._tracker: Optional[weakref.ref[Tracker]] = weakref.ref(tracker)
        self.callback = callback
        self.files = files

    @property
    def active(self) -> bool:
        return self._tracker is not None and self._tracker() is not None

    def close(self) -> None:
        ref, self._tracker = self._tracker, None
        tracker = ref() if ref is not None else None
        if tracker is not None:
            tracker.unsubscribe(self)

    def detach(self) -> None:
        self._tracker = None

    def deliver(self, change: Change) -> None:
        if self._tracker is not None:
            self.callback(change)


class Tracker:
    def __init__(self, root: str, *, migration_interval: float, confirm_interval: float,
                 poll_interval: float, use_inotify: bool, thread: bool, fresh: bool) -> None:
        self.root = root
        self.migration_interval = migration_interval
        self.confirm_interval = confirm_interval
        self.poll_interval = poll_interval
        self.use_inotify = use_inotify
        self.thread = thread
        self.fresh = fresh
        self.lock = threading.RLock()  # serialises writers of the snapshot
        self.applying = False  # inotify changes were read and are not yet published
        self.due = 0.0  # when a query must call refresh() even if nothing is pending
        self.closed = False
        self.confirmed_at: Optional[float] = None
        self._pid = os.getpid()
        self._reported: set[str] = set()
        self._proc_text = b""
        self._proc_self: Optional[KeptDir] = None
        self._watcher: Optional[Watcher] = None
        # epoll, not poll: a select.poll object refuses concurrent poll() calls (RuntimeError),
        # and queries from several threads check it at once. epoll_wait(0) is ~0.2 us.
        self._poller: Optional[select.epoll] = None
        self._loop_fd = -1  # the watcher descriptor registered with the loop
        self._timer: Optional[Timer] = None
        self._watch_problem = ""
        self._loop_problem = ""
        self._resolve_failed = False
        self._next_confirm = 0.0
        self._retry_at = 0.0
        self._generation = 0
        self._subs: list[Subscription] = []
        self.snap: Snapshot = self._build(None)
        at_fork_in_child(self._after_fork_in_child)
        with self.lock:
            self._arm()

    # ---- what queries call ---------------------------------------------------------------

    def refresh(self, snap: Snapshot) -> Snapshot:
        """Bring the snapshot up to date (the slow path of a query); never raises."""
        try:
            if self._pid != os.getpid():
                self._rearm_after_fork()
            with self.lock:
                now = time.monotonic()
                if self.closed:
                    if snap is self.snap and now >= (snap.expires or 0.0):
                        self._reread_limits()
                    self.due = 0.0
                    return self.snap
                if self._watcher is not None:
                    self._drain()
                if now >= self._next_confirm:
                    self._confirm(now)
                cur = self.snap
                if cur.expires is not None and now >= cur.expires:
                    self._reload_limits()
                if now >= self._retry_at and self._needs_retry():
                    self._retry(now)
                self._set_due()
        except Exception as e:  # noqa: BLE001 - a query must answer, whatever went wrong
            self.report(f"refreshing the cache failed ({e!r}); answering from the last one")
        return self.snap

    def report(self, reason: str) -> None:
        """Log a fallback or problem once per distinct reason."""
        if reason and reason not in self._reported:
            self._reported.add(reason)
            log.warning("cgwatch: %s", reason)

    def served(self) -> bool:
        """Whether the loop thread serves this monitor right now."""
        return not self.closed and self._timer is not None and LOOP.running()

    @property
    def subscriptions(self) -> int:
        return len(self._subs)

    def layout(self) -> Layout:
        snap = self.snap
        return Layout(snap.status.version, snap.levels, snap.generation)

    # ---- subscriptions ---------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Change], None],
                  files: Optional[Callable[[Layout], list[str]]] = None) -> Subscription:
        sub = Subscription(self, callback, files)
        with self.lock:
            self._subs = [*self._subs, sub]
            if files is not None and self._watcher is not None and not self._start_watching():
                self.reload("the cgroup tree changed while it was being watched")
            self._attach_loop()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self.lock:
            self._subs = [s for s in self._subs if s is not sub]
            if sub.files is not None and self._watcher is not None \
                    and not self._start_watching():
                self.reload("the cgroup tree changed while it was being watched")
            self._attach_loop()

    def _notify(self, kind: str, paths: tuple[str, ...] = ()) -> None:
        if not self._subs:
            return
        change = Change(kind, self.layout(), paths)
        for sub in self._subs:
            LOOP.call_soon(functools.partial(sub.deliver, change))

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for sub in self._subs:
                sub.detach()
            self._subs = []
            self._detach_loop()
            self._stop_watching()
            self._proc_self = None
            self.snap.host.close()
            self.snap = snapshot.without_descriptors(self.snap, "monitor closed",
                                                     time.monotonic())
            self.due = 0.0

    def __del__(self) -> None:
        # Dropped without close(): the loop holds only weak references and drops them at its
        # next turn; wake it for that. No lock here: a collection can run this inside any
        # critical section, the loop's own included.
        try:
            if self._timer is not None:
                self._timer.cancel()
            LOOP.wake()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _after_fork_in_child(self) -> None:
        """In a fork child: the loop thread did not survive and the inotify instance is the
        parent's; drop our copies, detach every subscription (its owner is a forked copy),
        and let the next query re-resolve (starting threads in an at-fork handler is unsafe)."""
        self.lock = threading.RLock()  # the parent's may have been held by another thread
        self.applying = False
        self._loop_fd = -1
        self._timer = None
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        # Not closed here: a query may still hold the snapshot whose `pending` is its poll();
        # it closes when the last such snapshot is dropped (and watches nothing meanwhile).
        self._poller = None
        self._proc_self = None
        for sub in self._subs:
            sub.detach()
        self._subs = []
        self.snap = replace(self.snap, pending=None, trusted=False, expires=0.0)
        self.due = 0.0

    def _rearm_after_fork(self) -> None:
        with self.lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self.snap = self._build(self.snap)
            if not self.closed:
                self._arm()

    # ---- building snapshots (under self.lock) ------------------------------------------------

    def _build(self, previous: Optional[Snapshot]) -> Snapshot:
        resolution, text = tree.resolve_process(self.root)
        if isinstance(resolution, discovery.Unresolved) and resolution.transient \
                and previous is not None \
                and isinstance(previous.resolution, discovery.Resolved):
            # Cannot read /proc/self now (EMFILE in an fd-starved process, say): the levels
            # known before are still the best answer (their descriptors are open); retry.
            self._resolve_failed = True
            self.report(f"{resolution.reason}; answering from the levels resolved before "
                        f"(retried every {RETRY_INTERVAL:g} s)")
            return replace(previous, status=replace(previous.status, reason=resolution.reason))
        self._proc_text = text.encode()
        self._resolve_failed = isinstance(resolution, discovery.Unresolved) \
            and resolution.transient
        host = previous.host if previous is not None and previous.host.fd >= 0 \
            else HostMemory(self.root)
        if host.reason:
            self.report(host.reason)
        self._generation += 1
        if isinstance(resolution, discovery.Resolved):
            try:
                lvls = tree.build_levels(self.root, resolution)
                return self._publishable(resolution, lvls, host)
            except OSError as e:
                self._resolve_failed = True
                resolution = discovery.Unresolved(f"cannot read {resolution.directory}: {e}")
        assert isinstance(resolution, discovery.Unresolved)
        self.report(f"no memory cgroup, using host values: {resolution.reason}")
        return snapshot.host_only(resolution, host, self._generation)

    def _publishable(self, res: discovery.Resolved, lvls: tuple[Level, ...],
                     host: HostMemory) -> Snapshot:
        for lvl in lvls:
            if lvl.problem:
                self.report(lvl.problem)
        if self._watcher is not None:
            mode, reason = WATCHING, self._loop_problem
            expires = None
        else:
            # Also the state during construction, until _arm() has created the watcher.
            mode, reason = POLLING, self._watch_problem or "not watching yet"
            expires = time.monotonic() + self.poll_interval
        snap = snapshot.make(res, lvls, host, mode, reason, expires, self._generation)
        if mode == WATCHING and not self.fresh and self.thread and LOOP.running():
            snap = replace(snap, trusted=True)
        elif self._poller is not None:
            snap = replace(snap, pending=self._poller.poll)
        return snap

    def _republish(self) -> None:
        snap = self.snap
        if isinstance(snap.resolution, discovery.Resolved):
            self.snap = self._publishable(snap.resolution, snap.levels, snap.host)
        self._set_due()

    def _set_due(self) -> None:
        due = self._next_confirm
        if self.snap.expires is not None:
            due = min(due, self.snap.expires)
        if self._needs_retry():
            due = min(due, self._retry_at)
        self.due = due

    def reload(self, why: str) -> None:
        """Resolve everything again (the process moved, a cgroup vanished, a fork)."""
        with self.lock:
            log.debug("cgwatch: re-resolving (%s)", why)
            for _ in range(_RESOLVE_ATTEMPTS):
                self.snap = self._build(self.snap)
                if self._watch_and_verify():
                    break
                why = "the cgroup tree changed while it was being watched"
            else:
                self._fall_back_to_polling(f"cgroup tree kept changing ({why})")
            self._next_confirm = time.monotonic() + self.confirm_interval
            self._set_due()
            self._notify("layout")

    def _reload_limits(self) -> None:
        """Re-read the limits of the levels already known; re-resolve if our directory went."""
        if not self._reread_limits():
            self.reload("the process's cgroup directory vanished")

    def _reread_limits(self) -> bool:
        """Publish a snapshot with freshly read limits; False if our directory is gone."""
        snap = self.snap
        res = snap.resolution
        if not isinstance(res, discovery.Resolved):
            return True
        try:
            lvls = tree.build_levels(self.root, res)
        except OSError:
            return False
        # A limit that cannot be read right now (a writer truncated the file and has not
        # written yet, say) keeps its last good value rather than vanishing from the min.
        old = {lvl.directory: lvl for lvl in snap.levels}
        lvls = tuple(
            replace(lvl, limit=old[lvl.directory].limit)
            if lvl.problem and lvl.directory in old and old[lvl.directory].limit is not None
            else lvl
            for lvl in lvls
        )
        if self.closed:
            self.snap = snapshot.without_descriptors(
                replace(snap, levels=lvls, total=min([snap.host.total] + [
                    lvl.limit for lvl in lvls if lvl.limit is not None])),
                "monitor closed", time.monotonic() + self.poll_interval)
            return True
        self.snap = self._publishable(res, lvls, snap.host)
        return True

    def _reload_changed_limits(self, targets: list[Target]) -> None:
        """Re-read only the limit files that raised an event, each with one pread(2) through
        its kept descriptor, and publish. Anything unusual (unreadable, a level that becomes
        limited and has no usage descriptors yet) takes the full re-read."""
        snap = self.snap
        res = snap.resolution
        if not isinstance(res, discovery.Resolved):
            return
        limit_name = FileNames.for_version(res.version).limit
        lvls = list(snap.levels)
        for target in targets:
            index = target.level_index
            if not (0 <= index < len(lvls)
                    and os.path.dirname(target.path) == lvls[index].directory):
                self._reload_limits()  # the levels changed under the watch: re-read all
                return
            lvl = lvls[index]
            try:
                limit = values.parse_limit(lvl.read(limit_name), res.version)
            except (OSError, ValueError):
                limit = -1
            if limit == -1 or (limit is not None and lvl.limit is None) or lvl.problem:
                self._reload_limits()
                return
            lvls[index] = replace(lvl, limit=limit)
        self.snap = self._publishable(res, tuple(lvls), snap.host)

    def _confirm(self, now: float) -> None:
        """Is the process still in the cgroup it was resolved in? (3-4 us: one pread.)"""
        self._next_confirm = now + self.confirm_interval
        try:
            if self._proc_self is None:
                self._proc_self = kept_dir(under_root(self.root, os.path.dirname(
                    names.PROC_CGROUP)), check=False)
            text = self._proc_self.pread(os.path.basename(names.PROC_CGROUP), 65536)
        except OSError:
            self._proc_self = None
            return  # cannot tell now (no descriptor left?): try again next time
        if text != self._proc_text:
            self.reload("the process moved to another cgroup")
        self.confirmed_at = now

    def _needs_retry(self) -> bool:
        if self.closed:
            return False
        return bool(self._loop_problem or self._resolve_failed
                    or (self.use_inotify and self._watcher is None
                        and self.snap.status.mode != HOST))

    def _retry(self, now: float) -> None:
        self._retry_at = now + RETRY_INTERVAL
        if self._resolve_failed or (self.use_inotify and self._watcher is None):
            self.reload("retrying what failed")  # the limits may have been raised or freed
        else:
            self._attach_loop()
            self._republish()

    # ---- watching (under self.lock) ---------------------------------------------------------

    def _arm(self) -> None:
        if not self._watch_and_verify():
            self.reload("the cgroup tree changed while it was being watched")
        self._next_confirm = time.monotonic() + self.confirm_interval
        self._attach_loop()
        self._republish()

    def _watch_and_verify(self) -> bool:
        """Watch the resolved levels, then look again: a change made before the watches
        existed shows in the second look, one made after raises an event. False: resolve
        again (a path vanished, or the process moved meanwhile)."""
        if not self._start_watching():
            return False
        try:
            text = read_file(under_root(self.root, names.PROC_CGROUP)).encode()
        except OSError:
            text = b""
        if text != self._proc_text:
            return False
        return self._reread_limits()

    def _targets(self) -> list[Target]:
        snap = self.snap
        res = snap.resolution
        if not isinstance(res, discovery.Resolved):
            return []
        limit_name = FileNames.for_version(res.version).limit
        targets = []
        for index, lvl in enumerate(snap.levels):
            limit_path = os.path.join(lvl.directory, limit_name)
            if os.path.exists(limit_path):
                targets.append(Target(limit_path, "limit", index))
            if index > 0:
                # rmdir of a cgroup raises no event on its own files on some kernels (seen on
                # 6.18, v1), only IN_DELETE in the parent directory: watch parents for that.
                targets.append(Target(lvl.directory, "dir", index))
        layout = self.layout()
        for sub in self._subs:
            if sub.files is None:
                continue
            try:
                paths = sub.files(layout)
            except Exception:  # noqa: BLE001 - a subscriber's list must not stop the watch
                paths = []
            # A file that does not exist (v2 memory.events at the root, or where the memory
            # controller is off) is not watched; it appears only with a re-resolve anyway.
            targets.extend(Target(path, "files", -1) for path in paths if os.path.exists(path))
        return targets

    def _start_watching(self) -> bool:
        """Point inotify at the current levels, creating the watcher if it is missing (so a
        watch limit hit earlier is retried on every re-resolve). False if a path vanished
        between resolving and watching: the caller resolves again."""
        if not self.use_inotify:
            self._watch_problem = "inotify disabled by the caller"
            return True
        if self.closed:
            return True
        if self._watcher is None:
            try:
                self._watcher = Watcher()
            except WatchUnavailable as e:
                self._fall_back_to_polling(str(e))
                return True
            try:
                self._poller = select.epoll(1)
                self._poller.register(self._watcher.fileno(), select.EPOLLIN)
            except OSError as e:
                self._fall_back_to_polling(f"cannot create an epoll descriptor: {e}")
                return True
        try:
            self._watcher.replace(self._targets())
        except TargetGone:
            return False
        except WatchUnavailable as e:
            self._fall_back_to_polling(str(e))
            return True
        self._watch_problem = ""
        self._attach_loop()
        self._republish()
        return True

    def _fall_back_to_polling(self, reason: str) -> None:
        self._watch_problem = reason
        self.report(f"{reason}; polling every {self.poll_interval}s instead")
        self._stop_watching()
        self._republish()

    def _stop_watching(self) -> None:
        if self._loop_fd >= 0:
            LOOP.unregister(self._loop_fd)
            self._loop_fd = -1
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        # Not closed here: a query may still hold the snapshot whose `pending` is its poll();
        # it closes when the last such snapshot is dropped (and watches nothing meanwhile).
        self._poller = None

    def _drain(self) -> None:
        """Read and apply every queued inotify change (non-blocking; nothing queued is cheap)."""
        watcher = self._watcher
        if watcher is None:
            return
        self.applying = True
        try:
            try:
                changes, rebuild = watcher.read()
            except OSError as e:
                self._fall_back_to_polling(f"reading inotify failed: {e}")
                return
            if changes or rebuild:
                self._apply(changes, rebuild)
        finally:
            self.applying = False

    def _apply(self, changes: list[WatchChange], rebuild: bool) -> None:
        lvls = self.snap.levels
        # A "dir" watch sits on level i; only the removal of level i-1 (our path) matters
        # there, not a sibling's.
        removed = any(c.target.kind == "dir" and 0 < c.target.level_index < len(lvls)
                      and c.name == os.path.basename(lvls[c.target.level_index - 1].directory)
                      for c in changes)
        limits = [c.target for c in changes if c.target.kind == "limit"]
        if rebuild or removed:
            self.reload("a watched cgroup was removed or the event queue overflowed")
        elif limits:
            self._reload_changed_limits(limits)
            self._notify("limits")
        files = tuple(sorted({c.target.path for c in changes if c.target.kind == "files"}))
        if files:
            self._notify("files", files)

    # ---- the loop thread's side -------------------------------------------------------------

    def _attach_loop(self) -> None:
        """Register with the loop thread when this monitor wants one (its own `thread`, or
        a subscriber's need), else leave it."""
        if self.closed or not (self.thread or self._subs):
            self._detach_loop()
            self._loop_problem = ""
            return
        fd = self._watcher.fileno() if self._watcher is not None else -1
        if fd != self._loop_fd:
            if self._loop_fd >= 0:
                LOOP.unregister(self._loop_fd)
            if fd >= 0:
                LOOP.register(fd, select.POLLIN, self._on_readable)
            self._loop_fd = fd
        if self._timer is None:
            self._timer = LOOP.call_at(time.monotonic() + self.migration_interval,
                                       self._on_timer)
        problem = LOOP.ensure_running()
        if problem and problem != self._loop_problem:
            self.report(f"{problem}: queries keep the cache exact themselves; events and "
                        "callbacks wait until it can start (retried every "
                        f"{RETRY_INTERVAL:g} s)")
        self._loop_problem = problem

    def _detach_loop(self) -> None:
        if self._loop_fd >= 0:
            LOOP.unregister(self._loop_fd)
            self._loop_fd = -1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_readable(self, fd: int, revents: int) -> None:
        with self.lock:
            if fd == self._loop_fd:
                self._drain()
                self._set_due()

    def _on_timer(self) -> None:
        """The slow timer: a move to another cgroup raises no event, so look; retry what
        failed; refresh the host reserve bound (hostmem.py)."""
        with self.lock:
            self._timer = None
            if self.closed:
                return
            now = time.monotonic()
            self._confirm(now)
            if self._needs_retry():
                self._retry(now)
            self.snap.host.refresh_bound()
            self._attach_loop()
            self._set_due()
