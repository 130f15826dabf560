"""Internal. The working-set forecast of every limited level, for what shows it (the `cgwatch`
table with `--sample`, `cgwatch watch`, the Prometheus gauges, the picture of a run): one
forecast.py `Forecaster` per level fed from `levels()` samples the caller takes; pure (times
are passed in), table-tested in tests/test_trends.py.

The history is the caller's, never the monitor's: `levels()` stays a read (docs/design.md
section 15 says why). Memory is bounded: a Forecaster's few points per level, and a level no
longer on the path is forgotten at the next sample.
"""

from __future__ import annotations

from .forecast import FLAT, Forecaster, Trend

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any, Optional

    from .snapshot import LevelInfo

# Seconds-to-limit bands `cgwatch watch` tells crossings of (band 0: no line within 10 min).
BANDS = (600.0, 120.0, 30.0, 10.0)


def working_set(level: LevelInfo) -> Optional[int]:
    """usage - inactive_file (what the limit is met by), None when either is unread."""
    if level.usage is None or level.inactive_file is None:
        return None
    return max(0, level.usage - level.inactive_file)


def forecastable(level: LevelInfo) -> bool:
    """A level with a line to reach (a limit or memory.high) whose working set was read; not
    v1's hidden level above the top (its usage is the top's, counted there already)."""
    return not level.hidden and (level.limit is not None or level.high is not None) \
        and working_set(level) is not None


def fields(trend: Trend, limit: Optional[int], high: Optional[int]) -> dict[str, Any]:
    """The forecast as plain data: growth (bytes/s, 0.0 when none persists), the seconds until
    the limit and until memory.high (None: no line, no growth, or beyond what the evidence
    licenses), the closed buckets it rests on."""
    return {"growth": trend.growth, "seconds_to_limit": trend.seconds_left(limit),
            "seconds_to_high": trend.seconds_left(high), "points": trend.points}


def band(seconds_left: Optional[float]) -> int:
    """How close the limit is: 0 (none in sight, or beyond BANDS[0] seconds) up to
    len(BANDS) (under BANDS[-1] seconds)."""
    if seconds_left is None:
        return 0
    return sum(1 for edge in BANDS if seconds_left < edge)


def heading(trend: Trend, limit: Optional[int]) -> int:
    """The band of a level *growing* toward its limit: 0 without growth. A level at or over
    its limit with a flat working set is the headroom's and the events' to tell (a fake or
    a real v1 level can read usage over its limit: the page cache it reclaims), not a
    forecast's."""
    return band(trend.seconds_left(limit)) if trend.growth > 0 else 0


class LevelTrends:
    """The Forecasters of the levels seen, by cgroup path. `bucket`, `span`, `window`:
    forecast.py's (a short `--sample` uses short buckets)."""

    def __init__(self, *, bucket: float = 1.0, span: int = 12, window: int = 24,
                 min_points: int = 6) -> None:
        self._shape = (bucket, span, window, min_points)
        self._new()  # refuses a bad shape here, not at the first sample
        self._forecasters: dict[str, Forecaster] = {}

    def add(self, now: float, levels: Iterable[LevelInfo]) -> dict[str, Trend]:
        """One sample of every level; the trend of each forecastable one, by cgroup path.
        Levels not in this sample are forgotten."""
        sizes: dict[str, int] = {}
        for level in levels:
            if forecastable(level):
                ws = working_set(level)
                assert ws is not None  # forecastable() says so
                sizes[level.cgroup_path] = ws
        return self.add_sizes(now, sizes)

    def add_sizes(self, now: float, sizes: Mapping[str, int]) -> dict[str, Trend]:
        """One sample given as the working set of each forecastable level, by cgroup path
        (the guard's decision.py, which is handed the figures, not the levels); the trend of
        each, by path. Levels not in it are forgotten."""
        trends: dict[str, Trend] = {}
        for path, ws in sizes.items():
            forecaster = self._forecasters.get(path)
            if forecaster is None:
                forecaster = self._forecasters[path] = self._new()
            forecaster.add(now, ws)
            trends[path] = forecaster.trend()
        for gone in [p for p in self._forecasters if p not in trends]:
            del self._forecasters[gone]
        return trends

    def ready(self, trend: Trend) -> bool:
        """The trend rests on enough points for its growth to mean something (before that,
        growth 0.0 says "not seen yet", not "flat")."""
        return trend.points >= self._shape[3]

    def _new(self) -> Forecaster:
        bucket, span, window, min_points = self._shape
        return Forecaster(bucket=bucket, span=span, window=window, min_points=min_points)

    def trend(self, path: str) -> Trend:
        """The last trend of one level (FLAT when it was never sampled)."""
        forecaster = self._forecasters.get(path)
        return forecaster.trend() if forecaster is not None else FLAT

    def __len__(self) -> int:
        return len(self._forecasters)
