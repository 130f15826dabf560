"""Internal. The process-wide background loop: one daemon thread that serves every Monitor
and Events of the process, and the one at-fork registry.

It knows neither class. Owners register descriptors (POLLIN, or POLLPRI for PSI triggers)
and timers with a callback; callbacks that are bound methods are held weakly, so an owner
dropped without close() is collected, and its registrations die with it. The thread starts
on the first registration and exits when nothing is registered (so N monitors cost one
thread, and closing them all leaves none). When a pipe or the thread cannot be made (EMFILE,
"can't start new thread"), registering still records the wish, `problem` says why, and
`ensure_running()` (which owners call again later) retries.

Callbacks run one at a time on the loop thread and must not raise (an exception is logged
once per callback and the loop goes on); a slow one delays the others, never a query, since
queries keep the cache exact themselves (monitor.py).
"""

from __future__ import annotations

import heapq
import os
import select
import threading
import time
import weakref
from collections import deque

from .files import close_quietly
from .logs import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Union

    FdCallback = Callable[[int, int], None]  # (fd, poll events)
    Callback = Callable[[], None]
    _Ref = Union["weakref.WeakMethod[Any]", Callable[[], Any]]


def _weak(callback: Callable[..., Any]) -> _Ref:
    """A bound method is held weakly (its owner may be collected); a plain function strongly,
    behind a zero-argument getter either way."""
    if hasattr(callback, "__self__") and hasattr(callback, "__func__"):
        return weakref.WeakMethod(callback)
    return lambda: callback


class Timer:
    """A pending call_at(); cancel() drops it."""

    __slots__ = ("when", "ref", "cancelled", "_wake")

    def __init__(self, when: float, ref: _Ref, on_cancel: Callable[[Timer], None]) -> None:
        self.when = when
        self.ref = ref
        self.cancelled = False
        self._wake = on_cancel

    def cancel(self) -> None:
        """Drop it. If the loop sleeps until this deadline it is woken: it may have nothing
        left to wait for (then it exits now, not at the cancelled deadline). Takes no lock:
        safe in __del__."""
        if not self.cancelled:
            self.cancelled = True
            self._wake(self)

    def __lt__(self, other: Timer) -> bool:
        return self.when < other.when


class Loop:
    """The loop; use the module's `LOOP`."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._fds: dict[int, tuple[int, _Ref]] = {}
        self._timers: list[Timer] = []
        self._soon: deque[Callable[[], Any]] = deque()
        self._thread: Optional[threading.Thread] = None
        self._wake_r = self._wake_w = -1
        # A wake-up byte is in the pipe and the thread has not read it yet: a second one is
        # not written (each write makes the thread run, and take the GIL, once more).
        self._wake_pending = False
        self._failed: set[int] = set()  # id() of callbacks whose failure was logged
        self.problem = ""  # why the thread is not running although work is registered

    # ---- registration (any thread) ---------------------------------------------------------

    def register(self, fd: int, events: int, callback: FdCallback) -> None:
        with self._lock:
            self._fds[fd] = (events, _weak(callback))
        self.ensure_running()
        self.wake()

    def unregister(self, fd: int) -> None:
        with self._lock:
            found = self._fds.pop(fd, None)
        if found is not None:
            self.wake()

    def call_at(self, when: float, callback: Callback) -> Timer:
        timer = Timer(when, _weak(callback), self._timer_cancelled)
        with self._lock:
            heapq.heappush(self._timers, timer)
            earliest = self._timers[0] is timer
        if self.ensure_running() == "" and earliest:
            self.wake()  # the thread sleeps until a later deadline: make it look again
        return timer

    def _timer_cancelled(self, timer: Timer) -> None:
        # Read without the lock (cancel() may run in __del__): at worst one wake too many, or
        # the thread wakes at the cancelled deadline and finds nothing to do.
        timers = self._timers
        if timers and timers[0] is timer:
            self.wake()

    def call_soon(self, callback: Callable[[], Any]) -> None:
        """Run `callback` (held strongly: it is short-lived) on the loop thread."""
        with self._lock:
            self._soon.append(callback)
        self.ensure_running()
        self.wake()

    def on_loop_thread(self) -> bool:
        return self._thread is not None and self._thread is threading.current_thread()

    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def ensure_running(self) -> str:
        """Start the thread if work is registered and it is not running: "" when it runs (or
        nothing needs it), else why it cannot (kept in `problem` too)."""
        with self._lock:
            if self._thread is not None or not (self._fds or self._timers or self._soon):
                return ""
            try:
                self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK) \
                    if hasattr(os, "pipe2") else _pipe()
            except OSError as e:
                self.problem = f"cannot create the loop's wake pipe: {e.strerror or e}"
                return self.problem
            thread = threading.Thread(target=self._run, args=(self._wake_r,),
                                      name="cgwatch", daemon=True)
            try:
                thread.start()
            except RuntimeError as e:
                close_quietly(self._wake_r, self._wake_w)
                self._wake_r = self._wake_w = -1
                self.problem = f"cannot start the background thread: {e}"
                return self.problem
            self._thread = thread
            self._wake_pending = False  # a new, empty pipe
            self.problem = ""
            return ""

    def wake(self) -> None:
        """Make the thread look at its registrations again (lock-free: safe in __del__)."""
        fd = self._wake_w
        if fd >= 0 and not self._wake_pending:
            self._wake_pending = True
            try:
                os.write(fd, b"x")
            except OSError:
                pass  # full (a wake-up is pending anyway) or closed by an exiting thread

    # ---- the thread ------------------------------------------------------------------------

    def _run(self, wake_r: int) -> None:
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        polled: dict[int, int] = {}
        while True:
            with self._lock:
                me = threading.current_thread()
                if self._thread is not me:
                    return  # a fork child's stale copy, or replaced
                # Owners collected without unregistering (their __del__ may not take this
                # lock: it can run inside it, from a garbage collection) are dropped here.
                for fd in [fd for fd, (_, ref) in self._fds.items() if ref() is None]:
                    del self._fds[fd]
                while self._timers and self._timers[0].cancelled:
                    heapq.heappop(self._timers)
                if self._timers and all(t.cancelled for t in self._timers):
                    self._timers = []
                if not (self._fds or self._timers or self._soon):
                    # Nothing left to serve: exit, so closing every owner leaves no thread.
                    self._thread = None
                    close_quietly(self._wake_r, self._wake_w)
                    self._wake_r = self._wake_w = -1
                    return
                wanted = {fd: ev for fd, (ev, _) in self._fds.items()}
                soon = list(self._soon)
                self._soon.clear()
                first = self._timers[0].when if self._timers else None
            for fd in [fd for fd in polled if wanted.get(fd) != polled[fd]]:
                poller.unregister(fd)
                del polled[fd]
            for fd, ev in wanted.items():
                if fd not in polled:
                    try:
                        poller.register(fd, ev)
                        polled[fd] = ev
                    except (OSError, ValueError):
                        pass
            for callback in soon:
                self._call(callback)
            # After queued calls, look at the descriptors without waiting (they may have
            # registered or scheduled more), but always look: an owner that keeps queueing
            # calls must not starve the descriptors and timers of the others.
            timeout = None if first is None else max(0.0, first - time.monotonic()) * 1000
            if soon or self._soon:
                timeout = 0.0
            try:
                ready = poller.poll(timeout)
            except OSError:
                ready = []
            for fd, revents in ready:
                if fd == wake_r:
                    try:
                        os.read(wake_r, 4096)
                    except OSError:
                        pass
                    # Cleared after the read: a waker that saw it set changed the state
                    # before it looked, and the next turn reads the state anew.
                    self._wake_pending = False
                    continue
                with self._lock:
                    entry = self._fds.get(fd)
                if entry is None:
                    continue  # unregistered meanwhile
                target = entry[1]()
                if target is None:
                    self.unregister(fd)  # its owner was collected
                    continue
                self._call(target, fd, revents)
            self._run_due_timers()

    def _run_due_timers(self) -> None:
        now = time.monotonic()
        due: list[Timer] = []
        with self._lock:
            while self._timers and (self._timers[0].cancelled or self._timers[0].when <= now):
                timer = heapq.heappop(self._timers)
                if not timer.cancelled:
                    due.append(timer)
        for timer in due:
            target = timer.ref()
            if target is not None:
                self._call(target)

    def _call(self, callback: Callable[..., Any], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:  # noqa: BLE001 - the loop must outlive any one bad callback
            key = id(getattr(callback, "__func__", callback))
            if key not in self._failed:
                self._failed.add(key)
                log.exception("cgwatch: background callback %r failed (continuing; "
                              "logged once)", callback)

    # ---- fork ------------------------------------------------------------------------------

    def after_fork_in_child(self) -> None:
        """The thread did not survive the fork, and the wake pipe is the parent's: forget both
        (closing our copies only) and every registration (their owners re-register)."""
        close_quietly(self._wake_r, self._wake_w)
        self._reset()


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    for fd in (r, w):
        os.set_inheritable(fd, False)
        os.set_blocking(fd, False)
    return r, w


LOOP = Loop()

# The one at-fork registry: owners' handlers (held weakly) run after the loop has reset.
_fork_handlers: list[weakref.WeakMethod[Any]] = []
_fork_lock = threading.Lock()


def at_fork_in_child(handler: Callable[[], None]) -> None:
    """Call `handler` (a bound method, held weakly) in every fork child, after the loop reset."""
    with _fork_lock:
        _fork_handlers[:] = [h for h in _fork_handlers if h() is not None]
        _fork_handlers.append(weakref.WeakMethod(handler))


def _after_fork_in_child() -> None:
    global _fork_lock
    _fork_lock = threading.Lock()  # the parent's may have been held by another thread
    LOOP.after_fork_in_child()
    from . import kept  # the shared descriptors: a child re-opens what is per-process

    kept.after_fork_in_child()
    for ref in list(_fork_handlers):
        handler = ref()
        if handler is not None:
            try:
                handler()
            except Exception:  # noqa: BLE001 - a fork child must come up whatever happens
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
