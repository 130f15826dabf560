"""Internal. One timer on the loop for every monitor of the process, and one read of each
/proc/<pid>/cgroup per tick for all of them.

A move to another cgroup raises no event, so the loop thread looks every
`migration_interval`. With a timer per monitor and a read per monitor, 1000 idle monitors in
one process cost 6.9 % of a core; with one timer, and each file read once per tick and
handed to every member (`Reads`), a member's turn is a comparison of bytes (figures in
bench/README.md, "Idle cost at scale").
"""

from __future__ import annotations

import threading
import time
import weakref

from .logs import log
from .loop import LOOP, at_fork_in_child

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from .loop import Timer


class Reads(dict):  # type: ignore[type-arg]
    """What one tick has read already, by key (a path, or a shared object's id): each member
    asks `once(key, read)` and the first one reads."""

    def once(self, key: Any, read: Callable[[], Any]) -> Any:
        if key not in self:
            self[key] = read()
        return self[key]


class Ticker:
    """Members are objects with `on_tick(now, reads)`, held weakly, each with its own
    interval; the loop has one timer, at the earliest member's next turn."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        # id(member) -> (weak reference, [interval, next turn])
        self._members: dict[int, tuple[weakref.ref[Any], list[float]]] = {}
        self._timer: Optional[Timer] = None
        self._failed: set[int] = set()

    def join(self, member: Any, interval: float) -> str:
        """Be called every `interval` seconds (kept if already a member). "" when the loop
        thread runs, else why not (loop.problem)."""
        with self._lock:
            if id(member) not in self._members:
                turn = time.monotonic() + interval
                timer = self._timer
                if timer is not None and timer.when <= turn:
                    # Join the next tick rather than start a phase of its own: members that
                    # joined at different times would each wake the loop (1000 monitors: 322
                    # wake-ups in 10 s instead of 2).
                    turn = timer.when
                self._members[id(member)] = (weakref.ref(member, self._collected),
                                             [interval, turn])
                if timer is None or turn < timer.when:
                    self._schedule()
        return LOOP.ensure_running()

    def leave(self, member: Any) -> None:
        with self._lock:
            if self._members.pop(id(member), None) is not None and not self._members:
                self._schedule()

    def _collected(self, ref: weakref.ref[Any]) -> None:
        """A member collected without leave(): no lock here (a collection can run inside
        any critical section); with none left, cancel the timer (lock-free), so the loop's
        thread can exit."""
        for key, (found, _) in list(self._members.items()):
            if found is ref:
                self._members.pop(key, None)
        timer = self._timer
        if not self._members and timer is not None:
            timer.cancel()

    def present(self, member: Any) -> bool:
        entry = self._members.get(id(member))
        return entry is not None and entry[0]() is member

    def __len__(self) -> int:
        return len(self._members)

    def _schedule(self) -> None:
        """The one timer at the earliest next turn (none without members)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._members:
            when = min(entry[1] for _, entry in self._members.values())
            self._timer = LOOP.call_at(when, self._fire)

    def _fire(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._timer = None
            due = []
            for ref, entry in list(self._members.values()):
                member = ref()
                if member is not None and entry[1] <= now:
                    entry[1] = now + entry[0]
                    due.append(member)
        reads = Reads()
        for member in due:
            try:
                member.on_tick(now, reads)
            except Exception:  # noqa: BLE001 - one bad member must not stop the others
                if id(type(member)) not in self._failed:
                    self._failed.add(id(type(member)))
                    log.exception("cgwatch: a monitor's timer failed (continuing; logged once)")
        with self._lock:
            if self._timer is None:
                self._schedule()

    def _after_fork_in_child(self) -> None:
        """The loop forgot every timer; members join again when they re-arm."""
        self._reset()


TICKER = Ticker()
at_fork_in_child(TICKER._after_fork_in_child)
