"""Internal. Burst coalescing for `cgwatch watch` and `cgwatch run -v`: at most one line per
counter and level per window (1 s), with the number of rises it stands for.

A v2 job living at its memory.max raises ~50 `max` events a second, and v1's failcnt rises
at every poll; one line each would be 937 lines in 25 s. The first rise of a key is passed
on at once (a kill is never delayed); rises of the same key within the window are merged into
one Event (old of the first, new of the last) that is passed on when the window ends.
Headroom alerts are never merged (they have their own hysteresis). Pure: time is given.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..event import Event
from ..events import Item

WINDOW = 1.0

Key = tuple[str, int]  # (counter, level)


@dataclasses.dataclass
class _Pending:
    first: Event
    last: Event
    rises: int


class Coalescer:
    """`offer(item, now)` gives what to print now; `due(now)` what has waited a window."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._shown_at: dict[Key, float] = {}  # when a line for the key was last passed on
        self._pending: dict[Key, _Pending] = {}

    def offer(self, item: Item, now: float) -> list[tuple[Item, int]]:
        """(item, rises) pairs to print now: rises 1 for a single one."""
        if not isinstance(item, Event):
            return [(item, 1)]
        key = (item.counter, item.level)
        out = self.due(now)
        shown = self._shown_at.get(key)
        if key not in self._pending and (shown is None or now - shown >= self.window):
            self._shown_at[key] = now
            return [*out, (item, 1)]
        held = self._pending.get(key)
        if held is None:
            self._pending[key] = _Pending(item, item, 1)
        else:
            held.last = item
            held.rises += 1
        return out

    def due(self, now: float) -> list[tuple[Item, int]]:
        """The merged lines whose window has ended, oldest first."""
        out: list[tuple[Item, int]] = []
        for key, held in list(self._pending.items()):
            if now - self._shown_at.get(key, now) >= self.window:
                del self._pending[key]
                self._shown_at[key] = now
                out.append((merge(held.first, held.last), held.rises))
        # Keys quiet for a window need no memory of when they were shown.
        for key in [k for k, t in self._shown_at.items()
                    if now - t >= self.window and k not in self._pending]:
            del self._shown_at[key]
        return out

    def flush(self) -> list[tuple[Item, int]]:
        """Everything held, now (at the end)."""
        out: list[tuple[Item, int]] = [(merge(h.first, h.last), h.rises)
                                       for h in self._pending.values()]
        self._pending.clear()
        return out

    def next_due(self) -> Optional[float]:
        """When `due` will next have something (monotonic time), None when nothing is held."""
        times = [self._shown_at.get(k, 0.0) + self.window for k in self._pending]
        return min(times) if times else None


def merge(first: Event, last: Event) -> Event:
    """One Event for the rises from `first` to `last` of one counter at one level."""
    if first is last:
        return first
    return dataclasses.replace(last, old=first.old, local_old=first.local_old)


def rises_suffix(rises: int, window: float = WINDOW) -> str:
    return f" [{rises} rises in {window:g}s]" if rises > 1 else ""
