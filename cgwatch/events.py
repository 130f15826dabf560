"""Memory events: rises of the kernel's memory counters at every level of the process's path,
as values delivered to callbacks, a queue and the log; plus headroom alerts (alerts.py).

    with cgwatch.Events() as events:          # watches the default monitor's levels
        events.subscribe(print)               # runs on the events thread, never on queries
        events.alert_below("512M")            # or "10%" of total_memory()
        for item in events:                   # Event or HeadroomAlert, until close()
            ...

What is watched (counters.py has the file list), and how each case is noticed:
- v2: `memory.events` and `memory.events.local` of every level, through the monitor's own
  inotify fd and thread (the kernel raises IN_MODIFY on them, at most ~100 times a second
  per file, deferring rather than dropping). The monitor's thread only wakes this one; the
  reading happens here. Without inotify (the monitor polls) they are re-read every
  `poll_interval` seconds.
- v1: no v1 counter file raises inotify events (checked on 6.18), so on each limited level
  an eventfd is registered through `cgroup.event_control` for `memory.oom_control`: the kernel
  signals it the moment that level's OOM killer is invoked. The counters are then re-read a
  few times over the next half second (the kill's `oom_kill` rise lands a few ms after the
  notification). Everything without a notification (`failcnt`, a kill by the host-wide OOM
  killer) is polled every `poll_interval` seconds (default 1). v1's `oom_kill` counts only
  in the victim's own cgroup: a process killed in a cgroup *below* the path is not seen as
  `oom_kill` (its OOM still shows as `oom` and `failcnt` at the limited level on the path).

A baseline of every counter is read when the Events object is made (and for a level first
seen later, when it is first seen): only rises after that are reported, never old values.
An `Event` carries its level, counter, old and new value, the level's limit and usage at
that moment and a monotonic timestamp.

Threads: one "cgwatch-events" thread per Events object reads, checks alerts and runs the
callbacks one at a time. A callback that raises is logged and the thread goes on; a slow one
delays later deliveries but loses nothing, because counters are compared as totals. Events
objects are not inherited by fork children (the child's copy is closed).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from . import counters, discovery, names, notify, values
from .alerts import HeadroomAlert, Threshold, crossing, usage_thresholds
from .event import Event
from .eventlog import EventLog
from .files import close_quietly, read_fd
from .monitor import WATCHING
from .names import FileNames
from .watcher import Change, Target

if TYPE_CHECKING:
    from .monitor import Monitor

log = logging.getLogger("cgwatch")

# How long a lower level's rise may wait to show at its parent (the kernel raises them
# microseconds apart; scans are milliseconds apart). Past it, a parent's rise is its own: on a
# `memory_localevents` mount the parent never shows it.
_CARRY_SECONDS = 1.0

# After a v1 OOM notification: when to read the counters again (seconds after it).
_OOM_RESCANS = (0.002, 0.02, 0.1, 0.5)
DEFAULT_PSI_TRIGGER = "some 100000 1000000"


Item = Union[Event, HeadroomAlert]
Callback = Callable[[Any], None]


class _Level:
    """One level being watched: kept descriptors for its counter and usage files, and its
    notification descriptors (v1 eventfds, v2 PSI trigger)."""

    def __init__(self, index: int, cgroup_path: str, directory: str, limit: Optional[int],
                 version: int) -> None:
        self.index = index
        self.cgroup_path = cgroup_path
        self.directory = directory
        self.limit = limit
        self.fds: dict[str, int] = {}
        for source in counters.counter_files(version):
            try:
                self.fds[source] = os.open(os.path.join(directory, source),
                                           os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass  # v2 levels without the memory controller, the v2 root, old kernels
        try:
            self.usage_fd: Optional[int] = os.open(
                os.path.join(directory, FileNames.for_version(version).usage),
                os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.usage_fd = None
        self.oom_efd: Optional[int] = None
        self.threshold_efds: list[int] = []
        self.psi_fd: Optional[int] = None

    def read(self) -> dict[str, dict[str, int]]:
        """The counters of each file that can be read now (a removed cgroup gives ENODEV)."""
        result = {}
        for source, fd in self.fds.items():
            try:
                found = counters.parse_counters(source, read_fd(fd))
            except (OSError, ValueError):
                continue
            if found:  # an empty read (a file being rewritten) must not become a baseline
                result[source] = found
        return result

    def usage(self) -> Optional[int]:
        if self.usage_fd is None:
            return None
        try:
            return values.parse_counter(os.pread(self.usage_fd, 64, 0))
        except (OSError, ValueError):
            return None

    def close_thresholds(self) -> None:
        close_quietly(*self.threshold_efds)
        self.threshold_efds = []

    def close(self) -> None:
        close_quietly(*self.fds.values(), *(fd for fd in (self.usage_fd, self.oom_efd,
                                                                 self.psi_fd) if fd is not None))
        self.close_thresholds()
        self.fds = {}
        self.usage_fd = self.oom_efd = self.psi_fd = None


class _Alert:
    def __init__(self, spec: Threshold, callback: Optional[Callback]) -> None:
        self.spec = spec
        self.callback = callback
        self.bytes: Optional[int] = None
        self.below: Optional[bool] = None


_all_events: weakref.WeakSet[Events] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for events in list(_all_events):
        events._forget_thread_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Events:
    """Memory events and headroom alerts for the levels of a Monitor (default: the
    process-wide one), with their own thread. Close it (or use `with`) to stop.

    `poll_interval`: seconds between reads of counters that have no notification (v1
    `failcnt`, v1 `oom_kill` from a host-wide OOM; everything when inotify is unavailable).
    `check_interval`: seconds between headroom checks besides the event-driven ones.
    `log`: write the default records (eventlog.py), repeating one (kills aside) at most every
    `log_interval` s. `queue_size`: items kept for `get()` / iteration (oldest dropped first,
    counted in `dropped`; 0 keeps none). `use_eventfd`: v1 eventfd notifications (off: poll).
    `psi_trigger`: the v2 memory.pressure trigger that wakes headroom checks ("" for none).
    """

    def __init__(
        self,
        monitor: Optional[Monitor] = None,
        *,
        poll_interval: float = 1.0,
        check_interval: float = 1.0,
        log: bool = True,
        log_interval: float = 10.0,
        queue_size: int = 1024,
        use_eventfd: bool = True,
        psi_trigger: str = DEFAULT_PSI_TRIGGER,
    ) -> None:
        if monitor is None:
            from . import default_monitor

            monitor = default_monitor()
        self.monitor = monitor
        self.poll_interval = poll_interval
        self.check_interval = check_interval
        self.use_eventfd = use_eventfd
        self.psi_trigger = psi_trigger
        self.dropped = 0
        self._log = EventLog(log_interval) if log else None
        self._lock = threading.RLock()  # this object's state; never taken by the monitor
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[Item] = deque(maxlen=queue_size) if queue_size > 0 else deque()
        self._queue_size = queue_size
        self._callbacks: list[Callback] = []
        self._alerts: list[_Alert] = []
        self._alert_callbacks: dict[int, Callback] = {}  # id(HeadroomAlert) -> its callback
        self._closed = False
        self._levels: list[_Level] = []
        self._version: Optional[int] = None
        self._seen_snap: object = None
        self._last: dict[tuple[str, str], dict[str, int]] = {}
        self._local_seen: dict[tuple[str, str], int] = {}
        # v2: per counter, rises of lower levels not yet seen at the level above, and since when
        self._carry: dict[str, tuple[list[int], float]] = {}
        self._oom_own: dict[str, int] = {}
        self._notes: dict[str, int] = {}  # v1 OOM notifications drained but not yet scanned
        self._problems: dict[str, str] = {}  # mechanism -> why it is not in use
        # Set from other threads (the monitor's, callers'); read by ours after a wake.
        self._scan_requested = False
        self._check_requested = False
        self._rearm = False
        self._rescans: list[float] = []
        now = time.monotonic()
        self._next_poll = now + poll_interval
        self._next_check = now
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_inheritable(fd, False)
            os.set_blocking(fd, False)
        with self._lock:
            self._resync()  # the baseline: read now, before anything is reported
            self._arm()
        monitor._add_change_hook(self._on_changes)
        with monitor._lock:
            monitor._reload_hooks.append(self._on_reload)
        monitor._add_target_hook(self._targets)
        # A change between the baseline and the first watch raised no event: look once more.
        self._scan_requested = True
        _all_events.add(self)
        self._thread = threading.Thread(target=self._run, name="cgwatch-events", daemon=True)
        self._thread.start()

    # ---- receiving -----------------------------------------------------------------------

    def subscribe(self, callback: Callback) -> None:
        """Call `callback(item)` for every Event and HeadroomAlert, on the events thread."""
        with self._lock:
            self._callbacks = [*self._callbacks, callback]

    def unsubscribe(self, callback: Callback) -> None:
        with self._lock:
            self._callbacks = [c for c in self._callbacks if c != callback]

    def alert_below(self, threshold: Union[int, str, Threshold], *,
                    callback: Optional[Callback] = None) -> Threshold:
        """Report a HeadroomAlert when available_memory() drops below `threshold` (bytes, a
        size like "512M", a percentage like "10%" of total_memory(), or a Threshold), and
        again when it climbs back above it. Already below now: reported at once. `callback`
        gets this threshold's alerts only (subscribers get them too)."""
        if isinstance(threshold, Threshold):
            spec = threshold
        elif isinstance(threshold, int):
            spec = Threshold(bytes=threshold)
        else:
            spec = Threshold.parse(threshold)
        with self._lock:
            self._alerts.append(_Alert(spec, callback))
            self._rearm = True
            self._check_requested = True
        self._wake()
        return spec

    def get(self, timeout: Optional[float] = None) -> Optional[Item]:
        """The next item, waiting up to `timeout` seconds (None: until one comes or close());
        None on timeout or when closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._queue.popleft()

    def __iter__(self) -> Iterator[Item]:
        while True:
            item = self.get()
            if item is None:
                return
            yield item

    def scan_now(self) -> list[Item]:
        """Read every counter now, on the calling thread, and deliver what rose (for a caller
        that must not miss a rise that happened just now, e.g. after its child exited)."""
        with self._lock:
            if self._closed:
                return []
            self._drain_ooms()
            self._scan_requested = False  # this scan answers any request pending
            items: list[Item] = list(self._scan(time.monotonic()))
        self._deliver(items)
        return items

    def mechanisms(self) -> dict[str, str]:
        """How events and headroom alerts are noticed right now, in words."""
        with self._lock:
            return {"events": self._events_mechanism(), "alerts": self._alerts_mechanism()}

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed and not self._levels:
                return
            self._closed = True
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.monitor._remove_hooks(self._on_changes, self._on_reload, self._targets)
        with self._lock:
            for lvl in self._levels:
                lvl.close()
            self._levels = []
        with self._cond:
            self._cond.notify_all()
        # The wake pipe stays open until the object is collected: the monitor's thread may be
        # calling a hook of ours right now, and must not write into a reused descriptor.

    def __del__(self) -> None:
        try:
            close_quietly(self._wake_r, self._wake_w)
        except AttributeError:
            pass  # __init__ did not get that far

    def __enter__(self) -> Events:
        return self

    def _forget_thread_after_fork(self) -> None:
        """In a fork child: no thread, and the parent's thread may have held our locks."""
        self._lock = threading.RLock()
        self._cond = threading.Condition(threading.Lock())
        self._closed = True  # the parent keeps the registrations; the child's copy is closed

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- hooks called by the monitor (its thread, maybe under its lock): flag and wake -------

    def _on_changes(self, changes: list[Change]) -> None:
        if any(c.target.kind == "events" for c in changes):
            self._scan_requested = True
            self._check_requested = True
        self._wake()

    def _on_reload(self) -> None:
        self._wake()

    def _targets(self) -> list[Target]:
        """inotify targets for the monitor: v2 memory.events(.local) of every level. Reads the
        monitor's snapshot, not our state, so it never waits for our lock."""
        try:
            snap = self.monitor._snap
            res = snap.resolution
            if not isinstance(res, discovery.Resolved) or res.version != 2:
                return []
            return [Target(path, "events", index)
                    for index, lvl in enumerate(snap.levels)
                    for source in counters.counter_files(2)
                    for path in [os.path.join(lvl.directory, source)]
                    if os.path.exists(path)]
        except Exception:  # noqa: BLE001 - runs inside the monitor's re-watch
            return []

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (OSError, ValueError):
            pass

    # ---- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            try:
                items = self._turn()
            except Exception:  # noqa: BLE001 - the thread must outlive any one bad reading
                log.exception("cgwatch: events thread error (continuing)")
                time.sleep(0.1)
                continue
            self._deliver(items)

    def _turn(self) -> list[Item]:
        """Block until something is due or ready, then read and check: what to deliver."""
        with self._lock:
            if self._closed:
                return []
            watched = self._poll_fds()
            timeout = self._timeout(time.monotonic())
            wake_r = self._wake_r
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        for fd, (what, _) in watched.items():
            poller.register(fd, select.POLLPRI if what == "psi" else select.POLLIN)
        try:
            ready = poller.poll(None if timeout is None else timeout * 1000)
        except OSError:
            ready = []
        with self._lock:
            if self._closed:
                return []
            self._handle_ready(ready, watched)
            return self._step(time.monotonic())

    def _poll_fds(self) -> dict[int, tuple[str, _Level]]:
        fds: dict[int, tuple[str, _Level]] = {}
        for lvl in self._levels:
            if lvl.oom_efd is not None:
                fds[lvl.oom_efd] = ("oom", lvl)
            for fd in lvl.threshold_efds:
                fds[fd] = ("threshold", lvl)
            if lvl.psi_fd is not None:
                fds[lvl.psi_fd] = ("psi", lvl)
        return fds

    def _timeout(self, now: float) -> Optional[float]:
        if self._scan_requested or self._rearm or self._check_requested:
            return 0.0
        deadlines = list(self._rescans)
        if self._needs_poll():
            deadlines.append(self._next_poll)
        if self._alerts:
            deadlines.append(self._next_check)
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _needs_poll(self) -> bool:
        if not self._levels:
            return False
        return self._version == 1 or self.monitor.status.mode != WATCHING

    def _handle_ready(self, ready: list[tuple[int, int]],
                      watched: dict[int, tuple[str, _Level]]) -> None:
        now = time.monotonic()
        for fd, mask in ready:
            if fd == self._wake_r:
                try:
                    os.read(fd, 4096)
                except OSError:
                    pass
                continue
            what, lvl = watched[fd]
            if what == "oom" and lvl.oom_efd == fd:
                self._notes[lvl.directory] = (self._notes.get(lvl.directory, 0)
                                              + notify.drain_eventfd(fd))
                # Scan now, so the `oom` event goes out at once; the kernel notifies before it
                # kills, so read again while the kill lands.
                self._scan_requested = True
                self._rescans = sorted(self._rescans + [now + d for d in _OOM_RESCANS])
                self._check_requested = True
            elif what == "threshold" and fd in lvl.threshold_efds:
                notify.drain_eventfd(fd)
                self._check_requested = True
            elif what == "psi" and lvl.psi_fd == fd:
                if mask & (select.POLLERR | select.POLLNVAL):
                    close_quietly(fd)  # the cgroup went away; re-armed on resync
                    lvl.psi_fd = None
                self._check_requested = True

    def _step(self, now: float) -> list[Item]:
        if self._resync():
            self._rearm = True
        if self._rearm:
            self._rearm = False
            self._arm()
            self._check_requested = True
        items: list[Item] = []
        due = [t for t in self._rescans if t <= now]
        poll_due = self._needs_poll() and now >= self._next_poll
        if self._scan_requested or due or poll_due:
            self._scan_requested = False
            self._rescans = [t for t in self._rescans if t > now]
            if poll_due:
                self._next_poll = now + self.poll_interval
            found = self._scan(now)
            items.extend(found)
            if found:
                self._check_requested = True
        if self._alerts and (self._check_requested or now >= self._next_check):
            self._check_requested = False
            self._next_check = now + self.check_interval
            items.extend(self._check_alerts(now))
        return items

    # ---- levels, baselines and notification descriptors (under self._lock) -------------------

    def _resync(self) -> bool:
        """Follow the monitor's levels (moved, limits changed, cgroup removed); True if they
        changed. A level seen for the first time gets a baseline, never events."""
        snap = self.monitor._snap
        if snap is self._seen_snap:
            return False
        self._seen_snap = snap
        res = snap.resolution
        version = res.version if isinstance(res, discovery.Resolved) else None
        wanted = [(lvl.cgroup_path, lvl.directory, lvl.limit) for lvl in snap.levels] \
            if version is not None else []
        if version == self._version and wanted == [
                (lvl.cgroup_path, lvl.directory, lvl.limit) for lvl in self._levels]:
            return False
        old = {lvl.directory: lvl for lvl in self._levels} if version == self._version else {}
        for lvl in self._levels:
            if lvl.directory not in old:
                lvl.close()
        fresh: list[_Level] = []
        for index, (cgroup_path, directory, limit) in enumerate(wanted):
            lvl_or_none = old.pop(directory, None)
            if lvl_or_none is None:
                assert version is not None
                lvl = _Level(index, cgroup_path, directory, limit, version)
                self._take_baseline(lvl)
            else:
                lvl = lvl_or_none
                lvl.index, lvl.cgroup_path, lvl.limit = index, cgroup_path, limit
            fresh.append(lvl)
        for lvl in old.values():
            lvl.close()
            self._forget(lvl.directory)
        self._levels = fresh
        self._version = version
        return True

    def _take_baseline(self, lvl: _Level) -> None:
        self._forget(lvl.directory)
        for source, current in lvl.read().items():
            self._last[(lvl.directory, source)] = current
            if source == names.EVENTS_LOCAL:
                for counter, value in current.items():
                    self._local_seen[(lvl.directory, counter)] = value

    def _forget(self, directory: str) -> None:
        for table in (self._last, self._local_seen):
            for key in [k for k in table if k[0] == directory]:
                del table[key]
        self._oom_own.pop(directory, None)
        self._notes.pop(directory, None)

    def _arm(self) -> None:
        """(Re)register the notification descriptors the current levels and alerts need."""
        if self._version == 1:
            self._arm_v1()
        elif self._version == 2:
            self._arm_v2()

    def _arm_v1(self) -> None:
        self._problems.pop("eventfd", None)
        limits = [lvl.limit for lvl in self._levels]
        # Two per alert and level: the drop below, and the climb back above the re-arm line.
        thresholds = [usage_thresholds(limits, line) for a in self._alerts
                      if a.bytes is not None
                      for line in (a.bytes, a.bytes + a.spec.rearm_margin(a.bytes))]
        for lvl in self._levels:
            lvl.close_thresholds()
            if lvl.limit is None or not self.use_eventfd:
                if lvl.oom_efd is not None:
                    close_quietly(lvl.oom_efd)
                    lvl.oom_efd = None
                continue
            try:
                if lvl.oom_efd is None:
                    lvl.oom_efd = notify.register_v1(lvl.directory, "memory.oom_control")
                for per_level in thresholds:
                    usage = per_level[lvl.index]
                    if usage is not None:
                        lvl.threshold_efds.append(notify.register_v1(
                            lvl.directory, "memory.usage_in_bytes", str(usage)))
            except OSError as e:
                self._problems["eventfd"] = (f"eventfd registration at {lvl.cgroup_path} "
                                             f"failed: {e.strerror or e}")
        if not self.use_eventfd:
            self._problems["eventfd"] = "eventfd notifications disabled by the caller"

    def _arm_v2(self) -> None:
        self._problems.pop("psi", None)
        for lvl in self._levels:
            wanted = bool(self._alerts and self.psi_trigger and lvl.limit is not None)
            if not wanted and lvl.psi_fd is not None:
                close_quietly(lvl.psi_fd)
                lvl.psi_fd = None
            if wanted and lvl.psi_fd is None:
                try:
                    lvl.psi_fd = notify.psi_trigger(lvl.directory, self.psi_trigger)
                except OSError as e:
                    self._problems["psi"] = (f"PSI trigger at {lvl.cgroup_path} failed: "
                                             f"{e.strerror or e}")

    def _drain_ooms(self) -> None:
        for lvl in self._levels:
            if lvl.oom_efd is not None:
                self._notes[lvl.directory] = (self._notes.get(lvl.directory, 0)
                                              + notify.drain_eventfd(lvl.oom_efd))

    # ---- reading counters and checking alerts (under self._lock) --------------------------------

    def _scan(self, now: float) -> list[Event]:
        version = self._version
        if version is None or not self._levels:
            return []
        reads = [lvl.read() for lvl in self._levels]
        rose: list[tuple[int, str, str, int, int]] = []
        if version == 1:
            # First, so an OOM reads in its order: the OOM, then the kill it led to.
            counts = [self._notes.pop(lvl.directory, 0) if lvl.oom_efd is not None else None
                      for lvl in self._levels]
            for lvl, own in zip(self._levels, counters.attribute_notifications(counts)):
                if own:
                    old = self._oom_own.get(lvl.directory, 0)
                    self._oom_own[lvl.directory] = old + own
                    rose.append((lvl.index, counters.EVENTFD, "oom", old, old + own))
        for lvl, read in zip(self._levels, reads):
            for source, current in read.items():
                key = (lvl.directory, source)
                before = self._last.get(key)
                self._last[key] = current
                if before is None:
                    continue  # the file was unreadable until now: this is its baseline
                rose.extend((lvl.index, source, c, old, new)
                            for c, old, new in counters.rises(before, current))
        propagated: dict[str, list[bool]] = {}
        if version == 2:
            deltas: dict[str, list[int]] = {}
            for index, source, counter, old, new in rose:
                if source == names.EVENTS:
                    deltas.setdefault(counter, [0] * len(self._levels))[index] = new - old
            # The kernel raises a counter level by level, so one kill can be split over two
            # scans: what a lower level rose by is carried to the next scan for a while.
            for counter in set(deltas) | set(self._carry):
                carried, since = self._carry.pop(counter, ([], now))
                if now - since > _CARRY_SECONDS or len(carried) != len(self._levels):
                    carried = []
                marks, carry = counters.propagated_across_scans(
                    deltas.get(counter, [0] * len(self._levels)), carried)
                propagated[counter] = marks
                if any(carry):
                    self._carry[counter] = (carry, since if carried else now)
        usages: dict[int, Optional[int]] = {}
        found = []
        for index, source, counter, old, new in rose:
            if source == names.EVENTS_LOCAL:
                continue  # folded into the memory.events event of the same level and counter
            lvl = self._levels[index]
            if index not in usages:
                usages[index] = lvl.usage()
            local_old = local_new = None
            local = reads[index].get(names.EVENTS_LOCAL)
            if local is not None and counter in local:
                local_old = self._local_seen.get((lvl.directory, counter), local[counter])
                local_new = local[counter]
                self._local_seen[(lvl.directory, counter)] = local_new
            flags = propagated.get(counter)
            found.append(Event(lvl.cgroup_path, lvl.directory, index, counter, old, new,
                               lvl.limit, usages[index], now, source, version, local_old,
                               local_new, bool(flags and flags[index])))
        return found

    def _check_alerts(self, now: float) -> list[HeadroomAlert]:
        available = self.monitor.available_memory()
        total = self.monitor.total_memory()
        found = []
        for alert in self._alerts:
            threshold = alert.spec.bytes_for(total)
            if threshold != alert.bytes:
                alert.bytes = threshold
                self._rearm = True  # v1 usage thresholds sit at limit - threshold
            below, report = crossing(alert.below, available, threshold,
                                     alert.spec.rearm_margin(threshold))
            alert.below = below
            if report:
                path, limit, usage = self._least_headroom(available)
                item = HeadroomAlert(below, threshold, alert.spec.describe(), available, total,
                                     path, limit, usage, now)
                if alert.callback is not None:
                    self._alert_callbacks[id(item)] = alert.callback
                found.append(item)
        return found

    def _least_headroom(self, available: int) -> tuple[Optional[str], Optional[int],
                                                       Optional[int]]:
        """The level whose headroom is `available` (None when the host binds)."""
        infos = [i for i in self.monitor.levels() if i.headroom is not None]
        if not infos:
            return None, None, None
        best = min(infos, key=lambda i: i.headroom if i.headroom is not None else 0)
        if best.headroom is not None and best.headroom > available + (1 << 20):
            return None, None, None  # the host's MemAvailable is lower than every level's
        return best.cgroup_path, best.limit, best.usage

    # ---- delivering -------------------------------------------------------------------------

    def limit_above(self, item: Item) -> Optional[tuple[int, str]]:
        """The smallest limit at or above an event's level, and the path where it is."""
        if not isinstance(item, Event):
            return None
        limited = [(lvl.limit, lvl.cgroup_path) for lvl in self._levels[item.level:]
                   if lvl.limit is not None]
        return min(limited) if limited else None

    def _deliver(self, items: list[Item]) -> None:
        for item in items:
            if self._log is not None:
                try:
                    self._log.emit(item, self.limit_above(item))
                except Exception:  # noqa: BLE001 - a logging handler must not stop events
                    pass
            with self._cond:
                if self._queue_size > 0:
                    if len(self._queue) == self._queue_size:
                        self.dropped += 1
                    self._queue.append(item)
                    self._cond.notify_all()
            callbacks = list(self._callbacks)
            own = self._alert_callbacks.pop(id(item), None)
            if own is not None:
                callbacks.append(own)
            for callback in callbacks:
                try:
                    callback(item)
                except Exception:  # noqa: BLE001 - one bad callback must not stop the others
                    log.exception("cgwatch: event callback %r failed (continuing)", callback)

    # ---- descriptions ----------------------------------------------------------------------------

    def _events_mechanism(self) -> str:
        if self._version is None:
            return "none: no memory cgroup (host values only)"
        if self._version == 2:
            if self.monitor.status.mode == WATCHING:
                return "inotify on memory.events and memory.events.local of every level"
            return (f"memory.events polled every {self.poll_interval:g}s (no inotify: "
                    f"{self.monitor.status.reason})")
        limited = sum(1 for lvl in self._levels if lvl.oom_efd is not None)
        polled = f"memory.oom_control and memory.failcnt polled every {self.poll_interval:g}s"
        if "eventfd" in self._problems:
            return f"{polled} ({self._problems['eventfd']})"
        return f"memory.oom_control OOM eventfd on {limited} limited level(s); {polled}"

    def _alerts_mechanism(self) -> str:
        every = f"checked every {self.check_interval:g}s"
        if self._version == 1 and "eventfd" not in self._problems:
            return f"usage threshold eventfds on the limited levels, and {every}"
        if self._version == 2 and self.psi_trigger and "psi" not in self._problems:
            return (f"PSI trigger '{self.psi_trigger}' on memory.pressure of the limited "
                    f"levels and memory.events changes wake a check, and {every}")
        problem = "; ".join(self._problems.values())
        return every + (f" ({problem})" if problem else "")
