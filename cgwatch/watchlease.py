"""Internal. One monitor's use of the process's inotify instance (watchhub.py): whether it
watches, why not (`problem`, shown in status.reason), when it tries again, and when it gives
its watches back for want of use. The tracker decides what to watch and what a change means;
this decides whether to hold watches at all (docs/design.md, "Sharing the uid's inotify
quota")."""

from __future__ import annotations

import os
import time

from . import quota
from .inotify import Target, WatchEvent, WatchUnavailable
from .watchhub import HUB, LevelWatch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

# A monitor served by the thread, not queried for this long and with no subscriber, gives its
# watches back (and the process's instance with the last of them); its next query watches
# again.
IDLE_RELEASE = 60.0


class WatchLease:
    """`poke` and `deliver` are the monitor's (watchhub.LevelWatch says when they run)."""

    def __init__(self, wanted: bool, poke: Callable[[], None],
                 deliver: Callable[[], None]) -> None:
        self.enabled = wanted and quota.inotify_allowed(os.environ)
        self.problem = "" if self.enabled or not wanted \
            else "inotify turned off (CGWATCH_INOTIFY)"
        self.watch = LevelWatch(poke, deliver)
        self.idle = False  # gave its watches back for want of use (IDLE_RELEASE)
        self._failures = 0  # watches refused in a row (quota.backoff)
        self._used_at = time.monotonic()

    @property
    def active(self) -> bool:
        return self.watch.active

    def watch_now(self, targets: Callable[[], list[Target]]) -> Optional[tuple[str, bool]]:
        """Watch `targets()` if this monitor may: None when it watches (or is not meant to),
        else (why not, whether that is a choice rather than a problem); the caller falls back
        to polling. Raises inotify.TargetGone (a path vanished: resolve again)."""
        if not self.enabled:
            self.problem = self.problem or "inotify disabled by the caller"
            return None
        if self.idle:
            return None
        try:
            self.watch.start()
        except WatchUnavailable as e:
            # No instance (the quota rule, or EMFILE: none left) is a choice, and polling is
            # exact: INFO, once per process (logs.Reporter says why not WARNING).
            return str(e), True
        try:
            self.watch.replace(targets())
        except WatchUnavailable as e:  # a watch refused (ENOSPC: the uid's watch limit)
            self._failures += 1
            return str(e), False
        self.problem = ""
        self._failures = 0
        return None

    def fall_back(self, reason: str) -> None:
        self.problem = reason
        self.watch.stop()

    def wants(self) -> bool:
        """Whether it should watch and does not (the caller retries)."""
        return self.enabled and not self.idle and not self.watch.active

    def next_try(self, now: float) -> float:
        """When to try again after a failed watch_now(): not before the hub's back-off after
        a refused instance, nor before this monitor's own after refused watches."""
        return max(HUB.next_try(), now + quota.backoff(self._failures) if self._failures
                   else now)

    def used(self, now: float) -> bool:
        """A query came: True if it ends an idle spell (watch again)."""
        self._used_at = now
        if self.idle:
            self.idle = False
            return True
        return False

    def release_if_idle(self, now: float, subscribed: bool, fresh: bool) -> bool:
        """Give the watches back when nothing used them for IDLE_RELEASE (a fresh=False
        monitor's queries never say they were used: it is never idle)."""
        if not self.watch.active or subscribed or not fresh \
                or now - self._used_at <= IDLE_RELEASE:
            return False
        self.idle = True
        self.problem = f"idle: no query for {IDLE_RELEASE:g} s, inotify given back"
        self.watch.stop()
        return True

    def read(self) -> tuple[list[WatchEvent], bool]:
        return self.watch.read()

    def release_at_exit(self) -> None:
        """Interpreter shutdown: drop the watches, never watch again (Tracker says why)."""
        self.enabled = False
        self.problem = "interpreter shutting down"
        self.watch.release_at_exit()
