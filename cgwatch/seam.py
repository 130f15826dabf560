"""Internal. The public seam of a monitor: what layers built on it (the events layer, an exporter)
get from `Monitor.layout()` and `Monitor.subscribe()`."""

from __future__ import annotations

import functools
import weakref
from collections import namedtuple

from .loop import LOOP
from .tree import Level

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Callable, NamedTuple, Optional

_LAYOUT_DOC = """The resolved levels, read-only: what the events layer and the exporter build on.

`version` (None: no memory cgroup, host values), `levels` (leaf first; Level.read(name)
reads a file of that level), `generation` (rises with every re-resolve)."""

_CHANGE_DOC = """What a subscriber is told: `kind` is "layout" (re-resolved: levels may differ),
"limits" (a limit changed) or "files" (a file it asked to watch changed: `paths`)."""

if TYPE_CHECKING:
    class Layout(NamedTuple):
        version: Optional[int]
        levels: tuple[Level, ...]
        generation: int

    class Change(NamedTuple):
        kind: str
        layout: Layout
        paths: tuple[str, ...] = ()
else:
    # The same named tuples as typing.NamedTuple makes (mypy reads the classes above), from
    # collections: `typing` costs ~4 ms of `import cgwatch` on 3.11 (re with it), and psutil,
    # the start-up yardstick, does not import it.
    Layout = namedtuple("Layout", ("version", "levels", "generation"))
    Change = namedtuple("Change", ("kind", "layout", "paths"), defaults=((),))
Layout.__doc__ = _LAYOUT_DOC
Change.__doc__ = _CHANGE_DOC


class Subscription:
    """A subscriber's hold on a monitor; close() detaches it (also done in a fork child)."""

    def __init__(self, unsubscribe: Callable[[Subscription], None],
                 callback: Callable[[Change], None],
                 files: Optional[Callable[[Layout], list[str]]]) -> None:
        # `unsubscribe` is a bound method of the monitor's tracker, held weakly: the tracker
        # holds its subscriptions, and a cycle would outlive a dropped monitor.
        self._unsubscribe: Optional[weakref.WeakMethod[Callable[[Subscription], None]]] = \
            weakref.WeakMethod(unsubscribe)
        self.callback = callback
        self.files = files

    @property
    def active(self) -> bool:
        return self._unsubscribe is not None and self._unsubscribe() is not None

    def close(self) -> None:
        ref, self._unsubscribe = self._unsubscribe, None
        unsubscribe = ref() if ref is not None else None
        if unsubscribe is not None:
            unsubscribe(self)

    def detach(self) -> None:
        self._unsubscribe = None

    def deliver(self, change: Change) -> None:
        if self._unsubscribe is not None:
            self.callback(change)


class Subscribers:
    """A monitor's subscriptions. The list is replaced, never changed in place, so the loop
    thread may iterate over it while a caller subscribes."""

    def __init__(self) -> None:
        self._subs: list[Subscription] = []

    def __len__(self) -> int:
        return len(self._subs)

    def __iter__(self) -> Iterator[Subscription]:
        return iter(self._subs)

    def add(self, sub: Subscription) -> None:
        self._subs = [*self._subs, sub]

    def remove(self, sub: Subscription) -> None:
        self._subs = [s for s in self._subs if s is not sub]

    def notify(self, change: Change) -> None:
        """Deliver `change` to each subscriber on the loop thread."""
        for sub in self._subs:
            LOOP.call_soon(functools.partial(sub.deliver, change))

    def detach_all(self) -> None:
        for sub in self._subs:
            sub.detach()
        self._subs = []
