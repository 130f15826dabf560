"""Internal. The Tracker keeps one monitor's snapshot true: it resolves the cgroup, watches
the levels with inotify, applies changes, re-checks /proc/self/cgroup, and tells subscribers.

Who runs it:
- the process-wide loop thread (loop.py), which wakes on the process's inotify descriptor
  (watchhub.py: one instance for every monitor) and on the one slow timer of the process
  (ticker.py, every `migration_interval`): its only wake-ups while idle;
- the queries themselves (`refresh`), whenever the hot path's cheap checks say so: a poll(0)
  of the inotify descriptor found changes queued (a limit write queues its event before the
  writer's write(2) returns, so a query that starts after it always sees it), or the
  `confirm_interval` (0.1 s) since /proc/self/cgroup was last read has passed, or (polling)
  a limit file reads other than before, or something that failed is due for a retry.

So the cache is exact without the thread; the thread only makes changes visible to
subscribers (and in `fresh=False` mode, to queries) without a query.
"""

from __future__ import annotations

import threading
import time

from . import discovery, resolver, tree
from .frozen import replace
from .inotify import Target, TargetGone, WatchEvent
from .logs import Reporter, log
from .loop import LOOP, at_fork_in_child
from .resolver import RETRY_INTERVAL, Resolver
from .seam import Change, Layout, Subscribers, Subscription
from .snapshot import HOST, POLLING, Snapshot
from .ticker import TICKER, Reads
from .watchhub import at_exit, watch_targets
from .watchlease import WatchLease

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

    from .hostmem import HostMemory
    from .tree import Level

_RESOLVE_ATTEMPTS = 5  # re-resolves when the tree changes between resolving and watching


class Tracker:
    def __init__(self, root: str, *, migration_interval: float, confirm_interval: float,
                 poll_interval: float, use_inotify: bool, thread: bool, fresh: bool,
                 pid: Optional[int] = None) -> None:
        self.migration_interval = migration_interval
        self.confirm_interval = confirm_interval
        self.poll_interval = poll_interval
        self.thread = thread
        self.fresh = fresh
        self.lock = threading.RLock()  # serialises writers of the snapshot
        self.applying = False  # inotify changes were read and are not yet published
        self.due = 0.0  # when a query must call refresh() even if nothing is pending
        self.closed = False
        self.confirmed_at: Optional[float] = None
        # The last read the hot path could not use (shown in status until the next
        # re-resolve): such problems are found by queries, not while building a snapshot.
        self.read_problem = ""
        self._forked = False  # set in a fork child until its first query re-arms
        self._reporter = Reporter()
        # The Reporter's method, not ours: a cycle would keep a dropped monitor (and the
        # loop thread) alive until the garbage collector runs (tests/test_lifecycle.py).
        self._where = Resolver(root, pid, self._reporter.report)
        self._proc = self._where.proc
        self._use = WatchLease(use_inotify, self._poke, self._on_changes)
        self._watch = self._use.watch
        self._loop_problem = ""
        self._next_confirm = 0.0
        self._retry_at = 0.0
        self._subs = Subscribers()
        self.snap: Snapshot = self._where.build(None, self._publishable)
        at_fork_in_child(self._after_fork_in_child)
        with self.lock:
            self._start()
        at_exit(self.release_at_exit)

    # ---- what queries call ---------------------------------------------------------------

    def refresh(self, snap: Snapshot) -> Snapshot:
        """Bring the snapshot up to date (the slow path of a query); never raises."""
        try:
            if self._forked:  # a flag, not os.getpid(): that is a system call each time
                self._rearm_after_fork()
            with self.lock:
                now = time.monotonic()
                if self.closed:
                    if snap is self.snap and now >= (snap.expires or 0.0):
                        self._refresh_closed()
                    self.due = 0.0
                    return self.snap
                if self._use.used(now):
                    self._retry_at = 0.0  # idle until now: watch again
                # Always (~1 us): the loop thread may have read our event and not yet queued
                # it; the hub's lock makes this wait for that (watchhub.py).
                self._drain()
                if now >= self._next_confirm:
                    self._confirm(now)
                cur = self.snap
                if cur.expires is not None and now >= cur.expires:
                    self._refresh_limits()
                elif cur.status.mode == POLLING and cur.pending is not None and cur.pending(0):
                    self._refresh_limits()  # polling: a limit file reads otherwise now
                if now >= self._retry_at and self._needs_retry():
                    self._retry(now)
                self._set_due()
        except Exception as e:  # noqa: BLE001 - a query must answer, whatever went wrong
            self.report(f"refreshing the cache failed ({e!r}); answering from the last one")
        return self.snap

    def report(self, reason: str, choice: bool = False, per_process: bool = False) -> None:
        """Log a fallback or problem once (logs.Reporter)."""
        self._reporter.report(reason, choice, per_process)

    def served(self) -> bool:
        """Whether the loop thread serves this monitor right now."""
        return not self.closed and TICKER.present(self) and LOOP.running()

    @property
    def watches(self) -> int:
        """Kernel watches this monitor holds on the process's inotify instance."""
        return self._watch.watches

    @property
    def subscriptions(self) -> int:
        return len(self._subs)

    def layout(self) -> Layout:
        snap = self.snap
        return Layout(snap.status.version, snap.levels, snap.generation)

    # ---- subscriptions ---------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Change], None],
                  files: Optional[Callable[[Layout], list[str]]] = None) -> Subscription:
        sub = Subscription(self.unsubscribe, callback, files)
        with self.lock:
            self._subs.add(sub)
            self._files_changed(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self.lock:
            self._subs.remove(sub)
            self._files_changed(sub)

    def _files_changed(self, sub: Subscription) -> None:
        """A subscription came or went: watch its files too (or no more), and want the loop."""
        if sub.files is not None and self._watch.active:
            self._watch_or_resolve()
        self._attach_loop()

    def _notify(self, kind: str, paths: tuple[str, ...] = ()) -> None:
        if len(self._subs):
            self._subs.notify(Change(kind, self.layout(), paths))

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self._subs.detach_all()
            TICKER.leave(self)
            self._watch.stop()
            self._proc.forget_descriptor()
            self.snap = resolver.closed(self.snap, time.monotonic())
            self.due = 0.0

    def release_at_exit(self) -> None:
        """Interpreter shutdown (atexit): remove every inotify watch now and answer by polling
        until the end, never watching again. The kernel releases watches only after an SRCU
        grace period (fsnotify): left to the instance's close at the process's exit, that
        wait delayed every exit by 0-15 ms (6.18); removed here, they are released while the
        rest of the shutdown runs, and the close finds none."""
        with self.lock:
            if self.closed or not self._watch.active:
                return
            self._use.release_at_exit()
            self._republish()

    def _after_fork_in_child(self) -> None:
        """In a fork child: the loop thread did not survive and the inotify instance is the
        parent's; drop our copies, detach every subscription (its owner is a forked copy),
        and let the next query re-resolve (starting threads in an at-fork handler is unsafe)."""
        self.lock = threading.RLock()  # the parent's may have been held by another thread
        self._forked = True
        self.applying = False
        self._watch.forget_after_fork()
        self._proc.forget_descriptor()
        self._subs.detach_all()
        self.snap = replace(self.snap, pending=None, trusted=False, expires=0.0)
        self.due = 0.0

    def _rearm_after_fork(self) -> None:
        with self.lock:
            if not self._forked:
                return
            self._forked = False
            self.snap = self._where.build(self.snap, self._publishable)
            if not self.closed:
                self._start()

    # ---- building snapshots (under self.lock) ------------------------------------------------

    def _publishable(self, res: discovery.Resolved, lvls: tuple[Level, ...],
                     host: HostMemory) -> Snapshot:
        for lvl in lvls:
            if lvl.problem:
                self.report(lvl.problem)
        watching = self._watch.active
        # Polling is also the state during construction, until _start() has created the
        # watcher: exact all the same (every query checks the limit files).
        reason = self._loop_problem if watching else self._use.problem or "not watching yet"
        return resolver.publishable(
            res, lvls, host, self._where.generation, watching=watching, reason=reason,
            trusted=watching and not self.fresh and self.thread and LOOP.running(),
            pending=self._watch.pending)

    def _republish(self) -> None:
        snap = self.snap
        if isinstance(snap.resolution, discovery.Resolved):
            self.snap = self._publishable(snap.resolution, snap.levels, snap.host)
        self._set_due()

    def _set_due(self) -> None:
        if self.snap.uncached:
            self.due = 0.0  # every query reads anew
            return
        if self._watch.queued or self._use.idle:
            # Another thread read our changes, or the watches were given back for want of
            # use: the next query applies them, or watches again.
            self.due = 0.0
            return
        due = self._next_confirm
        if self.snap.expires is not None:
            due = min(due, self.snap.expires)
        if self._needs_retry():
            due = min(due, self._retry_at)
        self.due = due

    def resolve_again(self, why: str) -> None:
        """Resolve everything again (the process moved, a cgroup vanished, a fork)."""
        with self.lock:
            log.debug("cgwatch: re-resolving (%s)", why)
            self.read_problem = ""
            for _ in range(_RESOLVE_ATTEMPTS):
                self.snap = self._where.build(self.snap, self._publishable)
                if self._watch_and_verify():
                    break
                why = "the cgroup tree changed while it was being watched"
            else:
                self._fall_back_to_polling(f"cgroup tree kept changing ({why})")
            self._next_confirm = time.monotonic() + self.confirm_interval
            self._set_due()
            self._notify("layout")

    def _refresh_limits(self) -> None:
        """Re-read the limits of the levels already known; re-resolve if our directory went."""
        if not self._publish_fresh_limits():
            self.resolve_again("the process's cgroup directory vanished")

    def _publish_fresh_limits(self) -> bool:
        """Publish a snapshot with freshly read limits; False if our directory is gone."""
        snap = self._where.fresh_limits(self.snap, self.closed, self.poll_interval,
                                        self._publishable)
        if snap is None:
            return False
        self.snap = snap
        return True

    def _refresh_closed(self) -> None:
        snap = self._where.closed_refresh(self.snap, self.poll_interval, self._publishable)
        if snap is not None:
            self.snap = snap

    def _apply_limit_changes(self, targets: list[Target]) -> None:
        snap = self._where.changed_limits(self.snap, targets, self._publishable)
        if snap is None:
            self._refresh_limits()  # anything unusual takes the full re-read
        else:
            self.snap = snap

    def _confirm(self, now: float, reads: Optional[Reads] = None) -> None:
        """Is the process still in the cgroup it was resolved in? (one pread, ~1.2 us here;
        on the timer, one read serves every monitor: `reads`)"""
        self._next_confirm = now + self.confirm_interval
        self.snap.host.refresh_bound_if_due(now)  # thread-free monitors have no timer for it
        moved = self._proc.moved(reads)
        if moved is None:
            return  # cannot tell now (no descriptor left?): try again next time
        if moved:
            self.resolve_again("the process moved to another cgroup")
        elif self.snap.status.version == 1 and tree.hidden_limit_moved(self.snap.levels, reads):
            self._refresh_limits()
        self.confirmed_at = now

    def _needs_retry(self) -> bool:
        if self.closed:
            return False
        return bool(self._loop_problem or self._where.failed or self._wants_watch())

    def _wants_watch(self) -> bool:
        return self._use.wants() and self.snap.status.mode != HOST

    def _retry(self, now: float) -> None:
        self._retry_at = now + RETRY_INTERVAL
        if self._where.failed:
            self.resolve_again("retrying what failed")  # the limits may have been raised or freed
        elif self._wants_watch():
            # Not before the hub's back-off (quota.backoff): no re-resolve per try, and no
            # probe until then.
            self._watch_or_resolve()
            if not self._watch.active:
                self._retry_at = max(self._retry_at, self._use.next_try(now))
            elif not self._publish_fresh_limits():
                # Watching now: a limit written while we polled, before the watch existed,
                # raised no event, and the thread's timer retries without a query's
                # limit_check first; read the limits again (as _watch_and_verify does).
                self.resolve_again("our cgroup vanished")
        else:
            self._attach_loop()
            self._republish()

    # ---- watching (under self.lock) ---------------------------------------------------------

    def _start(self) -> None:
        if not self._watch_and_verify():
            self.resolve_again("the cgroup tree changed while it was being watched")
        self._next_confirm = time.monotonic() + self.confirm_interval
        self._attach_loop()
        self._republish()

    def _watch_and_verify(self) -> bool:
        """Watch the resolved levels, then look again: a change made before the watches
        existed shows in the second look, one made after raises an event. False: resolve
        again (a path vanished, or the process moved meanwhile)."""
        if not self._start_watching():
            return False
        if self._proc.moved() is not False:
            return False
        return self._publish_fresh_limits()

    def _start_watching(self) -> bool:
        """Point inotify at the current levels, creating the watcher if it is missing (so a
        watch limit hit earlier is retried on every re-resolve). False if a path vanished
        between resolving and watching: the caller resolves again."""
        if self.closed:
            return True
        try:
            failed = self._use.watch_now(lambda: watch_targets(self.layout(), self._subs))
        except TargetGone:
            return False
        if failed is not None:
            self._fall_back_to_polling(*failed)
            return True
        self._attach_loop()
        self._republish()
        return True

    def _watch_or_resolve(self) -> None:
        if not self._start_watching():
            self.resolve_again("the cgroup tree changed while it was being watched")

    def _fall_back_to_polling(self, reason: str, choice: bool = False) -> None:
        self.report(f"{reason}; polling instead (a pread of each limit file per query)",
                    choice, per_process=True)
        self._use.fall_back(reason)
        self._republish()

    def _drain(self) -> None:
        """Read and apply every queued inotify change (non-blocking; nothing queued is cheap)."""
        if not self._watch.active:
            return
        self.applying = True
        try:
            try:
                changes, rebuild = self._use.read()
            except OSError as e:
                self._fall_back_to_polling(f"reading inotify failed: {e}")
                return
            if changes or rebuild:
                self._apply(changes, rebuild)
        finally:
            self.applying = False

    def _apply(self, changes: list[WatchEvent], rebuild: bool) -> None:
        limits = [c.target for c in changes if c.target.kind == "limit"]
        if rebuild:
            self.resolve_again("a watched file was removed or the event queue overflowed")
        elif limits:
            self._apply_limit_changes(limits)
            self._notify("limits")
        files = tuple(sorted({c.target.path for c in changes if c.target.kind == "files"}))
        if files:
            self._notify("files", files)

    # ---- the loop thread's side -------------------------------------------------------------

    def _attach_loop(self) -> None:
        """Be on the ticker (and have the hub's descriptor on the loop) when this monitor
        wants the thread (its own `thread`, or a subscriber's need), else leave both."""
        if self.closed or not (self.thread or len(self._subs)):
            TICKER.leave(self)
            self._watch.want_loop(False)
            self._loop_problem = ""
            return
        self._watch.want_loop(True)
        problem = TICKER.join(self, self.migration_interval)
        if problem and problem != self._loop_problem:
            self.report(f"{problem}: queries keep the cache exact themselves; events and "
                        "callbacks wait until it can start (retried every "
                        f"{RETRY_INTERVAL:g} s)")
        self._loop_problem = problem

    def _poke(self) -> None:
        self.due = 0.0  # another monitor read our changes (watchhub.Hub): next query applies

    def _on_changes(self) -> None:
        with self.lock:
            if not self.closed:
                self._drain()
                self._set_due()

    def on_tick(self, now: float, reads: Reads) -> None:
        """The process's slow timer (ticker.py): a move to another cgroup raises no event, so
        look; retry what failed; give the watches back when idle; refresh the host reserve
        bound (hostmem.py), once per tick for every monitor."""
        with self.lock:
            if self.closed:
                return
            self._confirm(now, reads)
            if self._use.release_if_idle(now, bool(len(self._subs)), self.fresh):
                self._republish()
            if self._needs_retry() and now >= self._retry_at:
                self._retry(now)
            host = self.snap.host
            reads.once(("host", id(host)), host.refresh_bound)
            self._set_due()
