"""Internal. What `cgwatch run` keeps of the events while CMD runs: per counter and level, the
number of rises, their total, and the first and last event; and the highest usage seen. A
job living at its limit raises ~50 v2 `max` events a second for hours; keeping each (about
300 B) grew the watcher, which is charged to the job's own cgroup, by ~1.3 GB a day.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Optional

from ..event import Event
from ..events import Item

# (counter, level, propagated, own rise in memory.events.local): the culprit search
# (explain.find_culprit) looks for own / non-propagated rises, so they are kept apart.
Key = tuple[str, int, bool, Optional[bool]]


@dataclasses.dataclass
class Summary:
    first: Event
    last: Event
    rises: int
    total: int  # the sum of every rise (a counter can restart at 0 if its level is remade)

    def merged(self) -> Event:
        """One Event standing for all of them: first.old -> first.old + total."""
        return dataclasses.replace(self.last, old=self.first.old,
                                   new=self.first.old + self.total,
                                   local_old=self.first.local_old)

    def as_dict(self) -> dict[str, Any]:
        e = self.first
        return {"counter": e.counter, "cgroup_path": e.cgroup_path, "level": e.level,
                "propagated": e.propagated, "rises": self.rises, "total": self.total,
                "first": {"old": e.old, "new": e.new, "time": e.time},
                "last": {"old": self.last.old, "new": self.last.new, "time": self.last.time}}


class RunLog:
    """Thread-safe: `add` is called on the background thread, the rest after CMD exited."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._summaries: dict[Key, Summary] = {}
        self.alerts = 0
        self.peak_usage: Optional[int] = None  # the highest level usage an event carried

    def add(self, item: Item) -> None:
        with self._lock:
            if not isinstance(item, Event):
                self.alerts += 1
                return
            own = (item.local_new > item.local_old
                   if item.local_new is not None and item.local_old is not None else None)
            key = (item.counter, item.level, item.propagated, own)
            held = self._summaries.get(key)
            if held is None:
                self._summaries[key] = Summary(item, item, 1, item.delta)
            else:
                held.last = item
                held.rises += 1
                held.total += item.delta
            if item.usage is not None and (self.peak_usage is None
                                           or item.usage > self.peak_usage):
                self.peak_usage = item.usage

    def events(self) -> list[Event]:
        """One merged Event per key, in the order first seen."""
        with self._lock:
            return [s.merged() for s in self._summaries.values()]

    def summaries(self) -> list[Summary]:
        with self._lock:
            return list(self._summaries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._summaries)
