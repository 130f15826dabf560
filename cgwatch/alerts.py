"""Headroom alerts: "tell me when available_memory() drops below N bytes (or a fraction of
total_memory())", as values, with the pure rules for when one fires.

The timing lives in events.py. How a drop is noticed, per case:
- v1: a usage threshold eventfd (`cgroup.event_control` on `memory.usage_in_bytes`) at
  `limit - N` on every limited level. Headroom can only be below N when usage is above that,
  so the kernel wakes the check the moment usage gets there (usage includes page cache, so the
  check then decides with `available_memory()` itself).
- v2: a PSI trigger on each limited level's `memory.pressure` (default `some 100000 1000000`:
  100 ms of memory stall within 1 s) and any `memory.events` change (`high`, `max`) wake the
  check at once; v2 has no usage thresholds, so a drop with no pressure at all is seen by the
  periodic check.
- Always: a periodic check every `check_interval` seconds (default 1 s), because the host's
  MemAvailable and reclaimable page cache change without any notification.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Optional, Protocol

from .units import human_bytes

# Powers of 1024 for every spelling: `512M`, `512MB`, `512Mi` and `512MiB` are all 512 MiB, as
# for `docker run --memory` / `--shm-size`. Kubernetes' decimal `M` (10**6) is not followed:
# the existing `512M` / `512mb` meant 512 MiB here before Kubernetes' `Mi` was accepted.
_UNIT_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
# re.ASCII: only 0-9 are digits (`\d` alone also matches `²` or Arabic-Indic digits).
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b?)?|b)?\s*$",
                   re.IGNORECASE | re.ASCII)
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$", re.ASCII)
# No machine has 2**62 bytes (4 EiB); longer text is refused before any arithmetic on it.
MAX_BYTES = 1 << 62
_MAX_TEXT = 40


@dataclass(frozen=True)
class Threshold:
    """An alert level: `bytes`, or `fraction` of total_memory() (exactly one is set).

    `hysteresis`: how far above the threshold available memory must climb before the alert
    re-arms and reports "above" (default 5% of the threshold), so headroom hovering at the
    line does not flood the log.
    """

    bytes: Optional[int] = None
    fraction: Optional[float] = None
    hysteresis: Optional[int] = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.fraction is None):
            raise ValueError("give exactly one of bytes or fraction")
        if self.bytes is not None and self.bytes <= 0:
            raise ValueError("threshold bytes must be positive")
        if self.fraction is not None and not 0 < self.fraction < 1:
            raise ValueError("threshold fraction must be between 0 and 1")

    def bytes_for(self, total: int) -> int:
        """The threshold in bytes, given total_memory()."""
        if self.bytes is not None:
            return self.bytes
        assert self.fraction is not None
        return int(total * self.fraction)

    def rearm_margin(self, threshold: int) -> int:
        return self.hysteresis if self.hysteresis is not None else threshold // 20

    def describe(self) -> str:
        if self.bytes is not None:
            return human_bytes(self.bytes)
        assert self.fraction is not None
        return f"{self.fraction * 100:g}% of total"

    @staticmethod
    def parse(text: str) -> Threshold:
        """`512M`, `512Mi`, `512MiB`, `512MB`, `1.5G`, `1048576` (bytes) or `10%` (of
        total_memory()). K/M/G/T are powers of 1024 however written (with or without `i`
        and `B`, any case). Raises ValueError, with the reason, for anything else: no
        number, a fraction of a byte, zero, 100% or more, more than 4 EiB."""
        if len(text) > _MAX_TEXT:
            raise ValueError(f"not a size or percentage (too long): {text[:_MAX_TEXT]!r}...")
        match = _PERCENT.match(text)
        if match:
            return Threshold(fraction=float(match.group(1)) / 100)
        match = _SIZE.match(text)
        if not match:
            raise ValueError(f"not a size or percentage: {text!r} (give e.g. 512Mi, 2G, "
                             "1048576 or 10%)")
        number, unit = match.group(1), (match.group(2) or "").lower()
        if not unit and "." in number:
            raise ValueError(f"a byte count must be whole: {text!r}")
        # Exact (Fraction, not float): a float overflows on a long number, and rounds.
        value = int(Fraction(number) * (1 << _UNIT_SHIFT[unit]))
        if value > MAX_BYTES:
            raise ValueError(f"larger than any memory (over 4 EiB): {text!r}")
        return Threshold(bytes=value)


@dataclass(frozen=True)
class HeadroomAlert:
    """available_memory() crossed a threshold: `below` True when it dropped under it, False
    when it climbed back above (threshold + hysteresis)."""

    below: bool
    threshold: int  # bytes, at the time of the crossing
    spec: str  # the threshold as the caller gave it, for messages
    available: int
    total: int
    cgroup_path: Optional[str]  # the level with the least headroom; None when it is the host
    limit: Optional[int]  # that level's limit and usage (None for the host)
    usage: Optional[int]
    time: float  # time.monotonic() when it was seen

    kind = "headroom"

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "state": "below" if self.below else "above",
                **self.__dict__}

    def message(self) -> str:
        where = (f"least headroom at {self.cgroup_path} (limit {human_bytes(self.limit)}, "
                 f"usage {human_bytes(self.usage)})" if self.cgroup_path is not None
                 else "the host's MemAvailable is the binding value")
        if self.below:
            return (f"available memory {human_bytes(self.available)} is below "
                    f"{human_bytes(self.threshold)} ({self.spec}); {where}")
        return (f"available memory {human_bytes(self.available)} is back above "
                f"{human_bytes(self.threshold)} ({self.spec})")


def crossing(below: Optional[bool], available: int, threshold: int,
             margin: int) -> tuple[bool, bool]:
    """(new state, whether to report it) for one check. `below` is the state after the last
    check (None before the first). Already below at the first check is reported; starting
    above is not."""
    if not below and available < threshold:
        return True, True
    if below and available >= threshold + margin:
        return False, True
    if below is None:
        return False, False
    return below, False


def usage_thresholds(limits: Sequence[Optional[int]], threshold: int) -> list[Optional[int]]:
    """v1: the usage at which to arm an eventfd on each level, leaf first. Headroom at a level
    is limit - usage + inactive_file >= limit - usage, so it can only be under `threshold`
    once usage is above limit - threshold. None where there is no limit, or where the limit
    itself is at most the threshold (then the periodic check is all there is)."""
    return [limit - threshold if limit is not None and limit > threshold else None
            for limit in limits]


class AlertState:
    """One `Events.alert_below()` threshold and where it stands."""

    def __init__(self, spec: Threshold, callback: Optional[Callable[[Any], None]]) -> None:
        self.spec = spec
        self.callback = callback
        self.bytes: Optional[int] = None  # the threshold in bytes at the last check
        self.below: Optional[bool] = None  # the state after the last check


class _LevelLike(Protocol):
    """What a check needs of a level (Monitor.levels() gives LevelInfo)."""

    @property
    def cgroup_path(self) -> str: ...
    @property
    def limit(self) -> Optional[int]: ...
    @property
    def usage(self) -> Optional[int]: ...
    @property
    def headroom(self) -> Optional[int]: ...


def check_alerts(alerts: Sequence[AlertState], available: int, total: int, now: float,
                 levels: Callable[[], Sequence[_LevelLike]],
                 ) -> tuple[list[tuple[AlertState, HeadroomAlert]], bool]:
    """One check of every alert against available_memory() and total_memory(): the alerts
    that fired, and whether a threshold in bytes moved (v1 usage eventfds sit at
    limit - threshold, so they must be re-armed). `levels` (Monitor.levels) is read only
    when an alert fires, to name the level with the least headroom."""
    fired = []
    rearm = False
    for alert in alerts:
        threshold = alert.spec.bytes_for(total)
        if threshold != alert.bytes:
            alert.bytes = threshold
            rearm = True
        below, report = crossing(alert.below, available, threshold,
                                 alert.spec.rearm_margin(threshold))
        alert.below = below
        if report:
            path, limit, usage = least_headroom(levels(), available)
            fired.append((alert, HeadroomAlert(below, threshold, alert.spec.describe(),
                                               available, total, path, limit, usage, now)))
    return fired, rearm


def least_headroom(levels: Sequence[_LevelLike], available: int,
                   ) -> tuple[Optional[str], Optional[int], Optional[int]]:
    """(path, limit, usage) of the level whose headroom is `available`; Nones when the host's
    MemAvailable is what binds (lower than every level's headroom by over 1 MiB)."""
    infos = [i for i in levels if i.headroom is not None]
    if not infos:
        return None, None, None
    best = min(infos, key=lambda i: i.headroom if i.headroom is not None else 0)
    if best.headroom is not None and best.headroom > available + (1 << 20):
        return None, None, None
    return best.cgroup_path, best.limit, best.usage
