"""Internal. `cgwatch run -v`: each memory event as a line on stderr while CMD runs, bursts
coalesced (coalesce.py: at most one line per counter and level a second); a thread prints
what waited out its window, so a burst's summary comes when the burst ends, not at the next
event. (run.py's own job is CMD; this printer is its optional witness.)"""

from __future__ import annotations

import sys
import threading
import time

from ..events import Events, Item
from .coalesce import Coalescer, rises_suffix
from .format import format_item


class VerbosePrinter:
    """`-v`: coalesced event lines to stderr; a thread prints what waited out its window."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.coalescer = Coalescer()
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._flush_when_due, name="cgwatch-run-v",
                                       daemon=True)
        self.thread.start()

    def offer(self, item: Item) -> None:
        with self.cond:
            self._print(self.coalescer.offer(item, time.monotonic()))
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self._print(self.coalescer.flush())
            self.cond.notify()
        self.thread.join(timeout=5)

    def _flush_when_due(self) -> None:
        with self.cond:
            while not self.closed:
                due = self.coalescer.next_due()
                self.cond.wait(None if due is None else max(0.0, due - time.monotonic()))
                self._print(self.coalescer.due(time.monotonic()))

    def _print(self, lines: list[tuple[Item, int]]) -> None:
        for item, rises in lines:
            print(f"cgwatch: {format_item(item)}"
                  f"{rises_suffix(rises)}", file=sys.stderr, flush=True)
