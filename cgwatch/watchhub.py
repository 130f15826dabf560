"""Internal. What a monitor watches with inotify, and the one inotify instance of the process
that watches it.

Every monitor of the process puts its targets (its levels' limit files, the files its
subscribers asked for) on one shared Watcher (inotify.py) through its own `LevelWatch`, and
queries poll(0) one epoll over it. One instance per process, not per monitor: the kernel
counts instances per uid (quota.py), and 128 monitors in one process took 128 of them. The
instance is made on the first watch (only if quota.py allows it) and closed when no monitor
watches any more, giving it back to the uid.

Events are read by whoever comes first (a query's refresh or the loop thread) and handed to
the monitors they concern: queued in each one's `inbox`, and its `poke()` makes its next query
take the slow path. Every member is poked before the read too, so a query that starts while
another thread has read its event but not yet queued it still takes the slow path, where it
waits for the hub's lock and finds the event queued (read-your-writes across monitors).
"""

from __future__ import annotations

import atexit
import os
import select
import threading
import time
import weakref

from . import quota
from .inotify import QuotaBusy, Target, Watcher, WatchEvent, WatchUnavailable
from .loop import LOOP, at_fork_in_child
from .names import FileNames
from .seam import Layout, Subscription

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Callable, Optional


def watch_targets(layout: Layout, subscriptions: Iterable[Subscription]) -> list[Target]:
    """Every level's limit file and the files each subscriber names for this layout (those
    that exist).

    No directory is watched. A cgroup that holds a process, or a cgroup below it, cannot be
    removed (rmdir fails with EBUSY, checked on 6.18 v1), so a level on our path goes only
    after the process moved out, and the move is what the confirmation of /proc/self/cgroup
    finds. rmdir raises nothing on a watch of the directory itself or of its files either
    (6.18 v1: no IN_DELETE_SELF, no IN_IGNORED), only IN_DELETE in the parent, which every
    sibling's removal raises too: watching parents woke every process of a node whenever a
    job or pod cgroup under a shared parent went."""
    if layout.version is None:
        return []
    limit_name = FileNames.for_version(layout.version).limit
    targets = []
    for index, lvl in enumerate(layout.levels):
        if lvl.hidden:
            continue  # no file of a hidden ancestor can be watched (tracker re-reads it)
        limit_path = os.path.join(lvl.directory, limit_name)
        if os.path.exists(limit_path):
            targets.append(Target(limit_path, "limit", index))
    for sub in subscriptions:
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


# Watchers whose watches were dropped at interpreter shutdown, kept from closing until the
# module itself is torn down (Tracker.release_at_exit).
_released: list[Watcher] = []


class Hub:
    """The process's one inotify instance and the monitors that share it; use `HUB`."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.lock = threading.RLock()
        self.watcher: Optional[Watcher] = None
        # epoll, not poll: a select.poll object refuses concurrent poll() calls (RuntimeError),
        # and queries from several threads check it at once. epoll_wait(0) is ~0.2 us.
        self._epoll: Optional[select.epoll] = None
        self._members: weakref.WeakValueDictionary[int, LevelWatch] = \
            weakref.WeakValueDictionary()
        self._tokens = 0
        self._looped: set[int] = set()  # members that want the loop thread to read events
        self._registered = -1  # the descriptor registered on the loop
        self._reader: Optional[weakref.ref[_Reader]] = None
        self._refusals = 0  # creations refused in a row (quota.backoff)
        self._next_try = 0.0
        self._refusal: Optional[WatchUnavailable] = None
        self._limit = 0  # the instance limit our instance was taken under (quota.give_back)
        self.at_exit = False
        self.reading = False  # between the pokes before a read and those after it
        self.dead: list[int] = []  # members collected without stop(): dropped on the next use

    def join(self, member: LevelWatch) -> int:
        with self.lock:
            self._tokens += 1
            self._members[self._tokens] = member
            return self._tokens

    @property
    def pending(self) -> Optional[Callable[[float], list[tuple[int, int]]]]:
        epoll = self._epoll
        return epoll.poll if epoll is not None else None

    def fileno(self) -> int:
        watcher = self.watcher
        return watcher.fileno() if watcher is not None else -1

    def start(self) -> None:
        """Make the instance if there is none (raises WatchUnavailable, QuotaRefused): not
        before the back-off after a refusal has passed, so N monitors of a refused process
        make one probe, not N."""
        with self.lock:
            if self.watcher is not None:
                return
            now = time.monotonic()
            if self._refusal is not None and now < self._next_try:
                raise _bare(self._refusal)
            # The spread from the clock's microseconds: `random` costs ~1 ms to import.
            spread = time.monotonic_ns() // 1000 % 1000 / 1000
            limit = quota.read_limit()
            try:
                watcher = Watcher(limit)
            except QuotaBusy as e:
                # Another process of the uid is deciding: no refusal, try again at the next
                # retry (the tracker's, >= 1 s), never wait for its lock here (a query).
                self._next_try = now + 0.5 + spread
                self._refusal = _bare(e)
                raise
            except WatchUnavailable as e:  # EMFILE too: none left, back off the same
                self._refusals += 1
                self._next_try = now + quota.backoff(self._refusals, spread)
                self._refusal = _bare(e)
                raise
            try:
                epoll = select.epoll(1)
                epoll.register(watcher.fileno(), select.EPOLLIN)
            except OSError as e:
                watcher.close()
                raise WatchUnavailable(f"cannot create an epoll descriptor: {e}") from e
            self.watcher, self._epoll, self._limit = watcher, epoll, limit
            self._refusals, self._refusal = 0, None
            self._sync_loop()

    def watches(self, token: int) -> int:
        """Kernel watches the member holds (shared ones counted for each member)."""
        watcher = self.watcher
        return watcher.watches_of(token) if watcher is not None else 0

    def next_try(self) -> float:
        """When a refused creation may be tried again (0: now)."""
        return self._next_try if self._refusal is not None else 0.0

    def replace(self, token: int, targets: list[Target]) -> None:
        with self.lock:
            self._drop_dead()
            assert self.watcher is not None
            self.watcher.replace(targets, token)

    def _drop_dead(self) -> None:
        while self.dead:
            self.drop(self.dead.pop())

    def drop(self, token: int) -> None:
        """Let go of a member's watches; with no member watching, give the instance back
        (at interpreter exit: keep it open until the end, `_released`)."""
        with self.lock:
            self._looped.discard(token)
            watcher = self.watcher
            if watcher is None:
                return
            watcher.drop(token)
            self._drop_dead()
            if watcher.owners() == 0 and self.watcher is watcher:
                self.watcher, self._epoll = None, None
                if self.at_exit:
                    _released.append(watcher)
                else:
                    # Not closed here: a query may still hold the snapshot whose `pending`
                    # is the epoll's poll(); it closes when the last such snapshot goes.
                    watcher.close()
                    quota.give_back(self._limit, os.environ)
            self._sync_loop()

    def want_loop(self, token: int, want: bool) -> None:
        with self.lock:
            member = self._members.get(token)
            if want:
                self._looped.add(token)
                if member is not None and self._reader is not None:
                    member.reader = self._reader()
            else:
                self._looped.discard(token)
                if member is not None:
                    member.reader = None
            self._sync_loop()

    def _sync_loop(self) -> None:
        """Have the descriptor on the loop while a live member wants it. The loop holds the
        callback weakly and members that want it hold the `_Reader` strongly: when the last
        of them is collected without close(), the loop drops the registration itself (and
        its thread exits if nothing else is registered)."""
        reader = self._reader() if self._reader is not None else None
        fd = self.fileno() if self._looped else -1
        if fd == self._registered and (fd < 0 or reader is not None):
            return
        if self._registered >= 0:
            LOOP.unregister(self._registered)
            self._registered = -1
        self._reader = None
        if fd >= 0:
            reader = _Reader(self)
            self._reader = weakref.ref(reader)
            for token in list(self._looped):
                member = self._members.get(token)
                if member is not None:
                    member.reader = reader
            LOOP.register(fd, select.POLLIN, reader.on_readable)
            self._registered = fd

    def collect(self, member: LevelWatch) -> tuple[list[WatchEvent], bool]:
        """What is queued for `member`, after reading the instance if it has events."""
        with self.lock:
            epoll = self._epoll
            if epoll is not None and epoll.poll(0):
                self._read()
            inbox, member.inbox = member.inbox, []
        changes: list[WatchEvent] = []
        rebuild = False
        for found, again in inbox:
            changes.extend(found)
            rebuild = rebuild or again
        return changes, rebuild

    def _read(self) -> list[LevelWatch]:
        """Read the instance (under the lock) and queue each member's changes."""
        assert self.watcher is not None
        self._drop_dead()
        if self.watcher is None:
            return []
        members = list(self._members.values())
        self.reading = True  # a member deciding its next due time meanwhile says "now"
        try:
            for member in members:
                member.poke()
            got = []
            for token, found in self.watcher.read_all().items():
                owner = self._members.get(token)
                if owner is not None:
                    owner.inbox.append(found)
                    owner.poke()
                    got.append(owner)
        finally:
            self.reading = False
        return got

    def _on_readable(self, fd: int, revents: int) -> None:
        """The loop thread: read, then let each member with changes apply them (outside the
        hub's lock: a member applies under its own, and a query holding that one may be
        waiting for the hub's)."""
        with self.lock:
            if fd != self.fileno():
                return
            got = self._read()
        for member in got:
            member.deliver()

    def _after_fork_in_child(self) -> None:
        """A fork child: the instance is the parent's; close our copy (the parent's stays
        open). Members forget theirs (LevelWatch.forget_after_fork); the back-off stays: a
        pool of forked children does not probe all at once after a refusal."""
        watcher, members = self.watcher, self._members
        refusals, next_try, refusal = self._refusals, self._next_try, self._refusal
        if watcher is not None:
            watcher.close()
        if self._epoll is not None:
            self._epoll.close()
        tokens = self._tokens
        self._reset()
        self._members, self._tokens = members, tokens
        self._refusals, self._next_try, self._refusal = refusals, next_try, refusal


class _Reader:
    """The hub's callback on the loop, alive while a member wants the loop (Hub._sync_loop)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def on_readable(self, fd: int, revents: int) -> None:
        self.hub._on_readable(fd, revents)


HUB = Hub()
at_fork_in_child(HUB._after_fork_in_child)


class LevelWatch:
    """One monitor's share of the hub: its targets, its queued changes, and `poke` (the
    monitor's way to make its next query take the slow path)."""

    def __init__(self, poke: Callable[[], None], deliver: Callable[[], None]) -> None:
        # Weak: the monitor holds its LevelWatch, and the hub holds it weakly too.
        self._poke: weakref.WeakMethod[Callable[[], None]] = weakref.WeakMethod(poke)
        self._deliver: weakref.WeakMethod[Callable[[], None]] = weakref.WeakMethod(deliver)
        self.inbox: list[tuple[list[WatchEvent], bool]] = []
        self.active = False  # holds watches on the hub's instance
        self.reader: Optional[_Reader] = None  # held while this member wants the loop
        self.token = HUB.join(self)

    def fileno(self) -> int:
        return HUB.fileno() if self.active else -1

    @property
    def pending(self) -> Optional[Callable[[float], list[tuple[int, int]]]]:
        """epoll.poll: non-empty when inotify has changes queued (None when not watching)."""
        return HUB.pending if self.active else None

    @property
    def queued(self) -> bool:
        """Changes wait for this member, or another thread is reading some."""
        return bool(self.inbox) or HUB.reading

    def poke(self) -> None:
        poke = self._poke()
        if poke is not None:
            poke()

    def deliver(self) -> None:
        deliver = self._deliver()
        if deliver is not None:
            deliver()

    @property
    def watches(self) -> int:
        return HUB.watches(self.token) if self.active else 0

    def start(self) -> None:
        """Make sure the process's instance exists; raises WatchUnavailable, QuotaRefused."""
        HUB.start()

    def replace(self, targets: list[Target]) -> None:
        """Watch exactly `targets` (raises TargetGone, WatchUnavailable)."""
        HUB.replace(self.token, targets)
        self.active = True

    def read(self) -> tuple[list[WatchEvent], bool]:
        if not self.active:
            self.inbox = []
            return [], False
        return HUB.collect(self)

    def want_loop(self, want: bool) -> None:
        HUB.want_loop(self.token, want and self.active)

    def stop(self) -> None:
        self.active = False
        self.inbox = []
        HUB.drop(self.token)

    def release_at_exit(self) -> None:
        """Interpreter shutdown: drop the watches now and stop watching, but leave the
        descriptor open until the shutdown's end (`_released`; the kernel closes it at exit
        if nothing does before)."""
        HUB.at_exit = True
        self.stop()

    def forget_after_fork(self) -> None:
        """A fork child: the watches were the parent's instance's (the hub closed our copy)."""
        self.active = False
        self.inbox = []

    def __del__(self) -> None:
        # A monitor dropped without close(): its watches would stay on the shared instance.
        # No lock may be taken here (a collection can run inside the hub's own critical
        # section): the loop thread drops it on its next turn.
        token = getattr(self, "token", 0)
        if token and self.active:
            HUB.dead.append(token)  # list.append is atomic: no lock needed
            HUB._looped.discard(token)
            self.reader = None
            LOOP.wake()  # lock-free: the loop drops the registration if the reader went


# Every live monitor's release_at_exit, for the one atexit hook (registered with the first).
_at_exit: list[weakref.WeakMethod[Callable[[], None]]] = []


def at_exit(release: Callable[[], None]) -> None:
    """Call `release` (a bound method, held weakly) at interpreter shutdown."""
    if not _at_exit:
        atexit.register(_release_all_at_exit)
    _at_exit[:] = [r for r in _at_exit if r() is not None]
    _at_exit.append(weakref.WeakMethod(release))


def _release_all_at_exit() -> None:
    for ref in list(_at_exit):
        release = ref()
        if release is not None:
            try:
                release()
            except Exception:  # noqa: BLE001 - the shutdown goes on whatever happens
                pass


def _bare(error: WatchUnavailable) -> WatchUnavailable:
    """A copy of a refusal without traceback, cause or context, to keep and to raise again.
    The refusal is kept for the back-off; kept as raised, its traceback held the frames of
    the monitor that asked (its tracker, snapshot and kept descriptors), so a closed
    monitor's descriptors stayed open until the next refusal replaced it (16 of a fake
    tree's, seen in tests/test_lifecycle.py while other processes of the uid held the
    count's lock: QuotaBusy); each raise of the kept one would bind it to new frames."""
    return type(error)(*error.args)

