"""Memory events: rises of the kernel's memory counters at every level of the process's path,
as values delivered to callbacks, a queue and the log; plus headroom alerts (alerts.py).
Every item is also a log record on logger `cgwatch` unless `Events(log=False)`, with or
without callbacks.

    with cgwatch.Events() as events:          # watches the default monitor's levels
        events.subscribe(print)               # runs on the background thread, never on queries
        events.alert_below("512M")            # or "10%" of total_memory()
        for item in events:                   # Event or HeadroomAlert, until close()
            ...

What is watched (counters.py has the file list), and how each case is noticed:
- v2: `memory.events` and `memory.events.local` of every level, through the monitor's
  inotify descriptor (`Monitor.subscribe(files=...)`; the kernel raises IN_MODIFY on them, at
  most ~100 times a second per file, deferring rather than dropping). Without inotify (the
  monitor polls) they are re-read every `poll_interval` seconds.
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

Threads: none of its own. The process-wide "cgwatch" thread (loop.py) that serves the
monitors reads, checks alerts and runs the callbacks, one at a time. A callback that raises
is logged and the thread goes on; a slow one delays later deliveries (and other monitors'
subscribers) but loses nothing, because counters are compared as totals, and delays no
query, because queries keep their cache exact themselves. The counting itself is scanner.py.
Events objects are not inherited by fork children: the child's copy is closed, its
subscription detached and its notification descriptors (the parent's registrations) left to
the parent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from . import names
from .alerts import AlertState, HeadroomAlert, Threshold, check_alerts
from .event import Event
from .eventlog import EventLog
from .loop import LOOP, Timer, at_fork_in_child
from .scanner import OOM_RESCANS, Scanner
from .seam import Change, Layout
from .snapshot import WATCHING

if TYPE_CHECKING:
    from .monitor import Monitor

log = logging.getLogger("cgwatch")

DEFAULT_PSI_TRIGGER = "some 100000 1000000"

Item = Union[Event, HeadroomAlert]
Callback = Callable[[Any], None]

__all__ = ["DEFAULT_PSI_TRIGGER", "Callback", "Event", "Events", "HeadroomAlert", "Item",
           "Threshold"]


class Events:
    """Memory events and headroom alerts for the levels of a Monitor (default: the
    process-wide one), served by the process's background thread. Close it (or use `with`)
    to stop.

    `poll_interval`: seconds between reads of counters that have no notification (v1
    `failcnt`, v1 `oom_kill` from a host-wide OOM; everything when inotify is unavailable).
    `check_interval`: seconds between headroom checks besides the event-driven ones.
    `log`: write the default records (eventlog.py) on logger `cgwatch`, whether callbacks
    are subscribed or not (default True: like any library's records, they are the audit
    trail the application routes or silences through its logging configuration, and a
    callback added for metrics or cleanup does not take them away); `log=False` writes none.
    A record repeats (kills aside) at most every `log_interval` s. `queue_size`: items kept
    for `get()` / iteration (oldest dropped first, counted in `dropped`; 0 keeps none).
    `use_eventfd`: v1 eventfd notifications (off: poll).
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
            from .default import default_monitor

            monitor = default_monitor()
        self.monitor = monitor
        self.poll_interval = poll_interval
        self.check_interval = check_interval
        self.use_eventfd = use_eventfd
        self.psi_trigger = psi_trigger
        self.dropped = 0
        self._log = EventLog(log_interval) if log else None
        self._lock = threading.RLock()  # this object's state; never held while calling out
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[Item] = deque(maxlen=queue_size) if queue_size > 0 else deque()
        self._queue_size = queue_size
        self._callbacks: list[Callback] = []
        self._alerts: list[AlertState] = []
        self._alert_callbacks: dict[int, Callback] = {}  # id(HeadroomAlert) -> its callback
        self._closed = False
        self._scanner = Scanner(use_eventfd, psi_trigger)
        self._registered: set[int] = set()  # notification descriptors registered with LOOP
        self._timer: Optional[Timer] = None
        self._timer_at: Optional[float] = None
        # Set from other threads (callers'); read on the loop thread.
        self._scan_requested = False
        self._check_requested = False
        self._rearm = False
        self._rescans: list[float] = []
        now = time.monotonic()
        self._next_poll = now + poll_interval
        self._next_check = now
        with self._lock:
            self._scanner.resync(monitor.layout())  # the baseline: before anything is reported
            self._arm_notifications()
        self._subscription = monitor.subscribe(self._on_change, files=self._watch_files)
        at_fork_in_child(self._after_fork_in_child)
        # A change between the baseline and the first watch raised no event: look once more.
        self._scan_requested = True
        self._kick()

    # ---- receiving -----------------------------------------------------------------------

    def subscribe(self, callback: Callback) -> None:
        """Call `callback(item)` for every Event and HeadroomAlert, on the background thread."""
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
            self._alerts.append(AlertState(spec, callback))
            self._rearm = True
            self._check_requested = True
        self._kick()
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
            self._scanner.drain_ooms()
            self._scan_requested = False  # this scan answers any request pending
            items: list[Item] = list(self._scanner.scan(time.monotonic()))
        self._deliver(items)
        return items

    def mechanisms(self) -> dict[str, str]:
        """How events and headroom alerts are noticed right now, in words."""
        with self._lock:
            status = self.monitor.status
            return {"events": self._scanner.describe_events(status.mode == WATCHING,
                                                            status.reason, self.poll_interval),
                    "alerts": self._scanner.describe_alerts(self.check_interval)}

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop: release the notification descriptors and the subscription; iteration ends."""
        with self._lock:
            if self._closed and not self._scanner.levels:
                return
            self._closed = True
            self._release()
        self._subscription.close()
        with self._cond:
            self._cond.notify_all()

    def _release(self) -> None:
        for fd in self._registered:
            LOOP.unregister(fd)
        self._registered = set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._scanner.close()

    def __enter__(self) -> Events:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # No lock here (a collection can run this inside any critical section): close our
        # descriptors and wake the loop, which drops the dead registrations itself.
        try:
            if self._timer is not None:
                self._timer.cancel()
            self._scanner.close()
            LOOP.wake()
        except Exception:  # noqa: BLE001 - interpreter shutdown, or __init__ did not finish
            pass

    def _after_fork_in_child(self) -> None:
        """In a fork child: the copy is closed; its descriptors are the parent's registrations
        (only our copies are closed) and its subscription is detached."""
        self._lock = threading.RLock()
        self._cond = threading.Condition(threading.Lock())
        self._closed = True
        self._registered = set()
        self._timer = None
        self._scanner.forget_descriptors()
        self._subscription.detach()

    # ---- what the monitor and the loop call (the loop thread) ------------------------------

    def _watch_files(self, layout: Layout) -> list[str]:
        """inotify targets for the monitor: v2 memory.events(.local) of every level."""
        if layout.version != 2:
            return []
        return [f"{lvl.directory}/{source}" for lvl in layout.levels
                for source in (names.EVENTS, names.EVENTS_LOCAL)]

    def _on_change(self, change: Change) -> None:
        if change.kind == "files":
            self._scan_requested = True
            self._check_requested = True
        self._turn()

    def _on_ready(self, fd: int, revents: int) -> None:
        with self._lock:
            if self._closed:
                return
            what = self._scanner.on_ready(fd, revents)
            if what == "oom":
                # Scan now, so the `oom` event goes out at once; the kernel notifies before it
                # kills, so read again while the kill lands.
                now = time.monotonic()
                self._scan_requested = True
                self._rescans = sorted(self._rescans + [now + d for d in OOM_RESCANS])
            if what:
                self._check_requested = True
        self._turn()

    def _kick(self) -> None:
        LOOP.call_soon(self._turn)

    def _turn(self) -> None:
        """Read and check what is due, deliver it, and schedule the next turn."""
        with self._lock:
            if self._closed:
                return
            now = time.monotonic()
            items = self._step(now)
            self._sync_registrations()
            self._schedule(time.monotonic())
        self._deliver(items)

    def _step(self, now: float) -> list[Item]:
        if self._scanner.resync(self.monitor.layout()):
            self._rearm = True
        if self._rearm:
            self._rearm = False
            self._arm_notifications()
            self._check_requested = True
        items: list[Item] = []
        due = [t for t in self._rescans if t <= now]
        poll_due = self._needs_poll() and now >= self._next_poll
        if self._scan_requested or due or poll_due:
            self._scan_requested = False
            self._rescans = [t for t in self._rescans if t > now]
            if poll_due:
                self._next_poll = now + self.poll_interval
            found = self._scanner.scan(now)
            items.extend(found)
            if found:
                self._check_requested = True
        if not self._alerts:
            # Nothing to check: a request must not stay pending, or _schedule would queue a
            # turn forever (found by the bench: a spinning loop thread, 100% of a core).
            self._check_requested = False
        elif self._check_requested or now >= self._next_check:
            self._check_requested = False
            self._next_check = now + self.check_interval
            fired, rearm = check_alerts(self._alerts, self.monitor.available_memory(),
                                        self.monitor.total_memory(), now,
                                        self.monitor.levels)
            self._rearm = self._rearm or rearm  # v1 usage thresholds sit at limit - threshold
            for alert, item in fired:
                if alert.callback is not None:
                    self._alert_callbacks[id(item)] = alert.callback
                items.append(item)
        return items

    def _arm_notifications(self) -> None:
        # Two lines per alert: the drop below, and the climb back above the re-arm line.
        lines = [line for a in self._alerts if a.bytes is not None
                 for line in (a.bytes, a.bytes + a.spec.rearm_margin(a.bytes))]
        self._scanner.arm(lines, want_psi=bool(self._alerts))

    def _sync_registrations(self) -> None:
        wanted = self._scanner.descriptors()
        for fd in self._registered - set(wanted):
            LOOP.unregister(fd)
        for fd, (_, events) in wanted.items():
            if fd not in self._registered:
                LOOP.register(fd, events, self._on_ready)
        self._registered = set(wanted)

    def _schedule(self, now: float) -> None:
        if self._scan_requested or self._rearm or self._check_requested:
            self._kick()
            return
        deadlines = list(self._rescans)
        if self._needs_poll():
            deadlines.append(self._next_poll)
        if self._alerts:
            deadlines.append(self._next_check)
        when = min(deadlines) if deadlines else None
        if when == self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = when
        if when is not None:
            self._timer = LOOP.call_at(when, self._turn)

    def _needs_poll(self) -> bool:
        if not self._scanner.levels:
            return False
        return self._scanner.version == 1 or self.monitor.status.mode != WATCHING

    # ---- alerts ------------------------------------------------------------------------------

    # ---- delivering -------------------------------------------------------------------------

    def limit_above(self, item: Item) -> Optional[tuple[int, str]]:
        """The smallest limit at or above an event's level, and the path where it is (the
        event's own `path_limit`, as the scanner saw the levels)."""
        return item.path_limit if isinstance(item, Event) else None

    def _deliver(self, items: list[Item]) -> None:
        for item in items:
            if self._log is not None:
                try:
                    self._log.emit(item)
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
