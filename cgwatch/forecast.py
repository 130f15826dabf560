"""Internal. How fast a level's working set grows, and when it reaches a line (the limit, or
memory.high), from samples of (time, working set): pure, no I/O, table-tested in
tests/test_forecast.py.

The model (docs/design.md section 15 says why this one):
1. Samples fall into buckets of `bucket` seconds; each bucket keeps its highest working set
   (its peak). A garbage collector or an allocator's sawtooth climbs and drops within a
   cycle; the peak is the part of it that meets the limit.
2. The envelope at each bucket is the highest peak of the last `span` buckets: a sawtooth
   whose cycle is shorter than `span * bucket` seconds gives a flat envelope, a leak a rising
   one, a step one rise.
3. Growth is the Theil-Sen slope (the median of the slopes between every pair of points) of
   the last `window` envelope points: one burst among them cannot move a median.
4. Growth counts only when it persists: at least `min_points` envelope points, at least
   three rises among the changes from one point to the next, at least twice as many rises
   as falls, and a rise in the later half of the window (it goes on now). A step (or one
   burst) is one rise among flat changes; a steady leak rises at every bucket, and a leak
   under a sawtooth raises the envelope once a cycle.
5. Seconds left = (line - envelope now) / growth: when the next peak meets the line, if the
   growth goes on.

Bounded memory: `span` peaks and `window` envelope points per level, whatever the run time.
The line is not part of the history, so a limit raised while running changes the answer at
once (only the working set's growth is learned).
"""

from __future__ import annotations

from collections import deque

from .frozen import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

MIN_RISES = 3  # envelope rises in the window before growth counts: a step makes one


class Trend(Frozen):
    """A level's working-set trend: `growth` in bytes per second (0.0 when no persistent growth
    is seen), `peak` the envelope now (bytes), `points` the envelope points it rests on."""

    __slots__ = ("growth", "peak", "points")
    _fields = ("growth", "peak", "points")
    growth: float
    peak: int
    points: int

    def __init__(self, growth: float, peak: int, points: int) -> None:
        fill(self, locals())

    def seconds_left(self, line: Optional[int]) -> Optional[float]:
        """Seconds until the envelope reaches `line` (bytes) at this growth: 0.0 when it is
        there already, None without a line or without growth."""
        if line is None:
            return None
        if self.peak >= line:
            return 0.0
        if self.growth <= 0:
            return None
        return (line - self.peak) / self.growth


FLAT = Trend(0.0, 0, 0)


def theil_sen(points: list[tuple[float, int]]) -> float:
    """The median of the slopes between every pair of points with distinct times (0.0 for
    fewer than two). O(n^2) in the point count, which `window` bounds (12: 66 slopes)."""
    slopes = sorted((y2 - y1) / (t2 - t1)
                    for i, (t1, y1) in enumerate(points) for t2, y2 in points[i + 1:]
                    if t2 != t1)
    if not slopes:
        return 0.0
    mid = len(slopes) // 2
    return slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2


def persists(values: list[int]) -> bool:
    """The rise of `values` goes on: at least MIN_RISES rises between consecutive values,
    at least twice as many rises as falls, and a rise among the later half of the changes."""
    changes = [b - a for a, b in zip(values, values[1:])]
    rises = sum(1 for c in changes if c > 0)
    falls = sum(1 for c in changes if c < 0)
    later = changes[len(changes) // 2:]
    return rises >= MIN_RISES and rises >= 2 * falls and any(c > 0 for c in later)


class Forecaster:
    """One level's history (bounded) and its trend. Times are seconds on one monotonic
    clock, sizes bytes."""

    def __init__(self, *, bucket: float = 1.0, span: int = 5, window: int = 12,
                 min_points: int = 4) -> None:
        if bucket <= 0 or span < 1 or window < 3 or not 3 <= min_points <= window:
            raise ValueError("forecast: bucket > 0, span >= 1, 3 <= min_points <= window")
        self.bucket = bucket
        self.min_points = min_points
        self._peaks: deque[int] = deque(maxlen=span)  # closed buckets' peaks
        self._envelope: deque[tuple[float, int]] = deque(maxlen=window)
        self._start: Optional[float] = None  # the open bucket's start
        self._open_peak = 0

    def add(self, now: float, working_set: int) -> None:
        """One sample. A sample after a gap of several buckets closes the open bucket only
        (no invented points in the gap: the slope uses real times)."""
        if self._start is None:
            self._start, self._open_peak = now, working_set
            return
        if now - self._start >= self.bucket:
            self._peaks.append(self._open_peak)
            self._envelope.append((self._start + self.bucket, max(self._peaks)))
            self._start, self._open_peak = now, working_set
        elif working_set > self._open_peak:
            self._open_peak = working_set

    def trend(self) -> Trend:
        """The trend now. `peak` includes the open bucket, so a level that is already over a
        line is seen at once."""
        if self._start is None:
            return FLAT
        peak = max(self._open_peak, self._envelope[-1][1] if self._envelope else 0)
        points = list(self._envelope)
        if len(points) < self.min_points or not persists([y for _, y in points]):
            return Trend(0.0, peak, len(points))
        return Trend(max(0.0, theil_sen(points)), peak, len(points))

    def clear(self) -> None:
        """Forget the history (after the level's cgroup changed, say)."""
        self._peaks.clear()
        self._envelope.clear()
        self._start = None
        self._open_peak = 0
