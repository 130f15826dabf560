"""Internal. The default log records for memory events and headroom alerts, on the `cgwatch` logger.

ERROR for `oom`, `oom_kill`, `oom_group_kill`, `under_oom`; WARNING for `high`, `max`, v1
`failcnt` and a headroom drop; INFO otherwise. Each record names the cgroup, the counter and
the limit in human units. Two rules keep the log readable:
- a rise that is only the echo of one already logged for the level below (v2 hierarchical
  counters, `Event.propagated`) is not logged again;
- records repeat at most once per `interval` seconds per cgroup and counter (a job living at
  its limit raises `max` many times a second, and one OOM kill raises `oom` several times as
  the allocating task retries); the next record after a quiet spell says how many rises it
  stood for. A kill (`oom_kill`, `oom_group_kill`) is never held back.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Union

from . import counters
from .alerts import HeadroomAlert
from .event import Event, event_message

log = logging.getLogger("cgwatch")

_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO}
_NEVER_HELD = frozenset({"oom_kill", "oom_group_kill"})


class RateLimiter:
    """At most one pass per key per `interval` seconds; counts what it held back."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], int] = {}

    def allow(self, key: tuple[str, str], weight: int = 1) -> tuple[bool, int]:
        """(pass or not, how many were held back before this one)."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + weight
            return False, 0
        self._last[key] = now
        return True, self._held.pop(key, 0)


class EventLog:
    """Writes the default records (events.py calls `emit` for every item it delivers)."""

    def __init__(self, interval: float = 10.0, logger: logging.Logger = log) -> None:
        self.logger = logger
        self.limiter = RateLimiter(interval)

    def emit(self, item: Union[Event, HeadroomAlert]) -> None:
        if isinstance(item, HeadroomAlert):
            self.logger.log(logging.WARNING if item.below else logging.INFO,
                            "cgwatch: %s", item.message())
            return
        if item.propagated:
            return
        level = _LEVELS[counters.severity(item.counter)]
        folded = 0
        if item.counter not in _NEVER_HELD:
            allowed, folded = self.limiter.allow((item.directory, item.counter),
                                                 item.new - item.old)
            if not allowed:
                return
        if self.logger.isEnabledFor(level):
            self.logger.log(level, "cgwatch: %s", event_message(item, folded))
