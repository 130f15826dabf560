"""Internal. How fast a level's working set grows, and when it reaches a line (the limit, or
memory.high), from samples of (time, working set): pure, no I/O, table-tested in
tests/test_forecast.py (a table of shapes, each a series of samples, growth or none).

The model (docs/design.md section 15 says why this one):
1. Samples fall into buckets at several time scales (`bucket` seconds, then 8, 64 and 512
   times that); each bucket keeps its lowest and highest working set, its *trough* and
   *peak*. Each scale keeps its last `window` closed buckets.
2. At each scale, the buckets kept (at least `min_points`) are cut into three equal thirds
   in time order. Growth is seen there only when both the trough and the peak climb from the
   first third to the second and from the second to the third, each time by more than
   `noise` bytes and evenly (the smaller climb at least EVEN of the larger). A leak (alone
   or under a sawtooth of a period shorter than a third) climbs at both; a sawtooth whose
   period is shorter than the window drops in some third (its lowest point lies after its
   highest point there, or a later third holds a trough); a step or a start-up ramp climbs
   once, then its plateau fills the later thirds; a spike lifts one third's peak but no
   trough.
3. The growth at a scale is the smaller of the troughs' and the peaks' climb from the first
   third to the last, over the time between those thirds' middles.
4. Evidence limits the extrapolation: growth seen over `s` seconds licenses a forecast of at
   most `horizon` x `s` seconds (1/3: a 12 s climb can predict the limit 4 s ahead, never
   90 s). A ramp that stops (a sawtooth's rising edge longer than the window, a model
   loading) was seen over at most its own length, so it can stop the job only if its peak
   leaves less headroom than `horizon` times its height.
5. Seconds left = (line - the peak of the last `span` fine buckets) / growth, the least of
   the scales' that their evidence licenses; None when none does.

Bounded memory: `window` buckets per scale (4 x 24) and `span` fine peaks, whatever the run
time. The line is not part of the history, so a limit raised while running changes the
answer at once (only the working set's growth is learned).
"""

from __future__ import annotations

from collections import deque

from .frozen import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

SCALE_FACTOR = 8  # each scale's bucket is this many of the one below
SCALES = 4  # 1 s, 8 s, 64 s, 512 s buckets with the default bucket: windows up to ~1.7 h
HORIZON = 1 / 3  # a forecast reaches at most this times the seconds its growth was seen over
EVEN = 0.25  # the smaller of a series' two climbs is at least this share of the larger
NOISE = 1 << 20  # bytes a third must climb by to count (an allocator's arena, a GC's jitter)


class Trend(Frozen):
    """A level's working-set trend: `growth` in bytes per second (0.0 when none is seen),
    `peak` the highest working set of the last few seconds (bytes), `points` the closed
    buckets of the finest scale it rests on, `horizon` the farthest (seconds) its evidence
    licenses a forecast (None: no bound, for a trend given by hand), `rates` every scale's
    (growth, horizon) that saw growth (`growth`/`horizon` are the longest-seen one's)."""

    __slots__ = ("growth", "peak", "points", "horizon", "rates")
    _fields = ("growth", "peak", "points", "horizon", "rates")
    growth: float
    peak: int
    points: int
    horizon: Optional[float]
    rates: tuple[tuple[float, float], ...]

    def __init__(self, growth: float, peak: int, points: int,
                 horizon: Optional[float] = None,
                 rates: tuple[tuple[float, float], ...] = ()) -> None:
        fill(self, locals())

    def seconds_left(self, line: Optional[int]) -> Optional[float]:
        """Seconds until the peak reaches `line` (bytes) at this growth: 0.0 when it is there
        already, None without a line, without growth, or beyond what the evidence licenses."""
        reach = self.reach(line)
        return None if reach is None else reach[0]

    def reach(self, line: Optional[int]) -> Optional[tuple[float, float]]:
        """`seconds_left(line)` and the growth that gave it (bytes/s), so that
        (line - peak) / growth = seconds: the rate of the scale whose licensed answer is the
        soonest (0.0 when the peak is at the line already); None as seconds_left."""
        if line is None:
            return None
        if self.peak >= line:
            return 0.0, 0.0
        rates = self.rates or ((self.growth, self.horizon),)
        best: Optional[tuple[float, float]] = None
        for growth, horizon in rates:
            if growth <= 0:
                continue
            left = (line - self.peak) / growth
            if (horizon is None or left <= horizon) and (best is None or left < best[0]):
                best = (left, growth)
        return best


FLAT = Trend(0.0, 0, 0)


def climbs(troughs: list[int], peaks: list[int], noise: int = NOISE) -> bool:
    """Both the troughs and the peaks of three consecutive thirds climb, each step by more
    than `noise` bytes, and evenly: the smaller climb of each series is at least EVEN of its
    larger one (a leak climbs about as much in each third; one jump between two plateaus,
    with noise on them, climbs once)."""
    for a, b, c in (troughs, peaks):
        first, second = b - a, c - b
        if first <= noise or second <= noise or min(first, second) < EVEN * max(first, second):
            return False
    return True


class _Scale:
    """One time scale: its open bucket and its last `window` closed ones, each
    (start, trough, peak)."""

    __slots__ = ("seconds", "closed", "start", "low", "high", "seen")

    def __init__(self, seconds: float, window: int) -> None:
        self.seconds = seconds
        self.closed: deque[tuple[float, int, int]] = deque(maxlen=window)
        self.start: Optional[float] = None
        self.low = self.high = 0
        self.seen: Optional[tuple[float, float]] = None  # growth(): redone when a bucket closes

    def add(self, now: float, value: int) -> bool:
        """One sample; True when it closed a bucket. A sample after a gap closes the open
        bucket only (no invented buckets: the rates use real times)."""
        if self.start is None:
            self.start, self.low, self.high = now, value, value
            return False
        if now - self.start >= self.seconds:
            self.closed.append((self.start, self.low, self.high))
            self.start, self.low, self.high = now, value, value
            return True
        if value < self.low:
            self.low = value
        elif value > self.high:
            self.high = value
        return False

    def growth(self, min_points: int, noise: int) -> Optional[tuple[float, float]]:
        """(bytes/s, seconds seen over) when the thirds climb (module docstring), else None.
        Only closed buckets count: call it when one closed, keep the answer (`seen`)."""
        n = len(self.closed) // 3 * 3
        if n < min_points:
            return None
        buckets = list(self.closed)[-n:]
        k = n // 3
        thirds = [buckets[i * k:(i + 1) * k] for i in range(3)]
        troughs = [min(b[1] for b in third) for third in thirds]
        peaks = [max(b[2] for b in third) for third in thirds]
        if not climbs(troughs, peaks, noise):
            return None
        first = (thirds[0][0][0] + thirds[0][-1][0] + self.seconds) / 2
        last = (thirds[2][0][0] + thirds[2][-1][0] + self.seconds) / 2
        if last <= first:
            return None
        rise = min(troughs[2] - troughs[0], peaks[2] - peaks[0])
        seen = buckets[-1][0] + self.seconds - buckets[0][0]
        return rise / (last - first), seen


class Forecaster:
    """One level's history (bounded) and its trend. Times are seconds on one monotonic
    clock, sizes bytes. `bucket`: the finest scale's bucket; `span`: fine buckets whose
    highest peak is the peak now; `window`: buckets kept per scale; `min_points`: buckets a
    scale needs before it can see growth (at least 3, one per third); `horizon`, `noise`,
    `scales`: the module docstring's."""

    def __init__(self, *, bucket: float = 1.0, span: int = 12, window: int = 24,
                 min_points: int = 6, horizon: float = HORIZON, noise: int = NOISE,
                 scales: int = SCALES) -> None:
        if bucket <= 0 or span < 1 or window < 3 or not 3 <= min_points <= window \
                or horizon <= 0 or noise < 0 or scales < 1:
            raise ValueError("forecast: bucket > 0, span >= 1, 3 <= min_points <= window, "
                             "horizon > 0, noise >= 0, scales >= 1")
        self.bucket = bucket
        self.min_points = min_points
        self.horizon = horizon
        self.noise = noise
        self._window = window
        self._scales = [_Scale(bucket * SCALE_FACTOR ** i, window) for i in range(scales)]
        self._peaks: deque[int] = deque(maxlen=span)  # the finest scale's closed peaks

    def add(self, now: float, working_set: int) -> None:
        """One sample."""
        for i, scale in enumerate(self._scales):
            if scale.add(now, working_set):
                scale.seen = scale.growth(self.min_points, self.noise)
                if i == 0:
                    self._peaks.append(scale.closed[-1][2])

    def trend(self) -> Trend:
        """The trend now. `peak` includes the open bucket, so a level that is already over a
        line is seen at once."""
        fine = self._scales[0]
        if fine.start is None:
            return FLAT
        peak = max(fine.high, max(self._peaks, default=0))
        rates: list[tuple[float, float]] = []
        for scale in self._scales:
            seen = scale.seen
            if seen is not None and seen[0] > 0:
                rates.append((seen[0], self.horizon * seen[1]))
        if not rates:
            return Trend(0.0, peak, len(fine.closed))
        growth, horizon = rates[-1]  # the coarsest scale that saw it: the longest evidence
        return Trend(growth, peak, len(fine.closed), horizon, tuple(rates))

    def clear(self) -> None:
        """Forget the history (after the level's cgroup changed, say)."""
        window = self._window
        self._scales = [_Scale(s.seconds, window) for s in self._scales]
        self._peaks.clear()
