"""The per-level forecast that the table, `watch`, the Prometheus gauges and the picture show
(cgwatch/trends.py), as tables: which levels are forecast, the bands `watch` tells crossings
of, the plain-data fields, and a fed history (a leak at one level, a flat one beside it,
a level that leaves the path). The model itself is tests/test_forecast.py's."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from cgwatch import trends
from cgwatch.cli.show import format_table
from cgwatch.cli.watch import format_forecast
from cgwatch.forecast import Trend
from cgwatch.snapshot import LevelInfo

MiB = 1 << 20
GiB = 1 << 30


def lvl(path: str, limit: Optional[int] = GiB, usage: Optional[int] = 100 * MiB,
        inactive: Optional[int] = 10 * MiB, high: Optional[int] = None,
        hidden: bool = False) -> LevelInfo:
    headroom = None if limit is None or usage is None or inactive is None \
        else limit - (usage - inactive)
    return LevelInfo(path, "/sys/fs/cgroup" + path, limit, usage, inactive, headroom, False,
                     False, None, high, None, None, None, hidden)


@pytest.mark.parametrize("level, expected", [
    (lvl("/job"), True),                                   # limited, read
    (lvl("/job", limit=None), False),                      # no line to reach
    (lvl("/job", limit=None, high=GiB), True),             # v2 memory.high only
    (lvl("/job", usage=None), False),                      # usage unread
    (lvl("/job", inactive=None), False),                   # memory.stat unread
    (lvl("/job", hidden=True), False),                     # v1's level above the top
])
def test_forecastable(level: LevelInfo, expected: bool) -> None:
    assert trends.forecastable(level) is expected


@pytest.mark.parametrize("level, expected", [
    (lvl("/a", usage=100 * MiB, inactive=10 * MiB), 90 * MiB),
    (lvl("/a", usage=5 * MiB, inactive=10 * MiB), 0),      # inactive_file read after usage
    (lvl("/a", usage=None), None),
])
def test_working_set(level: LevelInfo, expected: Optional[int]) -> None:
    assert trends.working_set(level) == expected


@pytest.mark.parametrize("seconds, expected", [
    (None, 0),        # no growth
    (3600.0, 0),      # beyond 10 min
    (600.0, 0),       # at the edge: not under it
    (599.0, 1),
    (119.9, 2),
    (29.0, 3),
    (9.9, 4),
    (0.0, 4),         # there already
])
def test_band(seconds: Optional[float], expected: int) -> None:
    assert trends.band(seconds) == expected


@pytest.mark.parametrize("trend, limit, expected", [
    (Trend(1.0 * MiB, 1000 * MiB, 12), 1020 * MiB, 3),    # 20 s away, growing
    (Trend(0.0, 1100 * MiB, 12), 1024 * MiB, 0),          # over its limit, flat: not told
    (Trend(1.0 * MiB, 1100 * MiB, 12), 1024 * MiB, 4),    # over it and growing
    (Trend(1.0 * MiB, 100 * MiB, 12), None, 0),           # no limit (memory.high only)
    (Trend(0.0, 0, 0), GiB, 0),                           # nothing seen yet
])
def test_heading(trend: Trend, limit: Optional[int], expected: int) -> None:
    assert trends.heading(trend, limit) == expected


@pytest.mark.parametrize("trend, limit, high, expected", [
    (Trend(0.0, 500 * MiB, 12), GiB, None,
     {"growth": 0.0, "seconds_to_limit": None, "seconds_to_high": None, "points": 12}),
    (Trend(1.0 * MiB, 500 * MiB, 12), GiB, 600 * MiB,
     {"growth": 1.0 * MiB, "seconds_to_limit": 524.0, "seconds_to_high": 100.0, "points": 12}),
    (Trend(1.0 * MiB, GiB, 12), GiB, None,   # at the limit already
     {"growth": 1.0 * MiB, "seconds_to_limit": 0.0, "seconds_to_high": None, "points": 12}),
])
def test_fields(trend: Trend, limit: Optional[int], high: Optional[int],
                expected: dict[str, Any]) -> None:
    assert trends.fields(trend, limit, high) == expected


def test_level_trends_leak_flat_and_a_level_that_leaves() -> None:
    """/job leaks 16 MiB/s, /top beside it is flat: after 8 s of 4 samples a second, /job's
    growth is 16 MiB/s; a line 16 MiB above its peak is (line - peak) / 16 MiB/s = 1 s away,
    within what 6 s of evidence licenses (2 s), while its limit (1 GiB, ~50 s away) is beyond
    it (forecast.py point 4); /top has no growth. Then /job leaves the path: its history
    goes with it."""
    found = trends.LevelTrends()
    latest: dict[str, Trend] = {}
    for i in range(33):
        t = i * 0.25
        used = 100 * MiB + int(16 * MiB * t)
        latest = found.add(t, [lvl("/job", usage=used, inactive=0),
                               lvl("/top", limit=4 * GiB, usage=GiB, inactive=0),
                               lvl("/", limit=None)])
    assert set(latest) == {"/job", "/top"}  # "/" has no limit
    job, top = latest["/job"], latest["/top"]
    assert found.ready(job) and found.ready(top)
    assert job.growth == pytest.approx(16 * MiB, rel=0.01)
    line = job.peak + 16 * MiB
    left = job.seconds_left(line)
    assert left is not None and left == pytest.approx((line - job.peak) / (16 * MiB), rel=0.01)
    assert job.seconds_left(GiB) is None
    assert top.growth == 0.0 and top.seconds_left(4 * GiB) is None
    assert len(found) == 2
    assert set(found.add(9.0, [lvl("/top", limit=4 * GiB, usage=GiB, inactive=0)])) == {"/top"}
    assert len(found) == 1
    assert found.trend("/job").points == 0  # forgotten: a new history if it comes back


def test_level_trends_not_ready_before_min_points() -> None:
    found = trends.LevelTrends()
    latest = found.add(0.0, [lvl("/job")])
    assert not found.ready(latest["/job"])


def test_level_trends_refuse_a_bad_shape_at_once() -> None:
    with pytest.raises(ValueError):
        trends.LevelTrends(bucket=0.0)


def rec(band: int, seconds: Optional[float], growth: float = 12 * MiB) -> dict[str, Any]:
    return {"type": "forecast", "cgroup_path": "/job", "band": band, "growth": growth,
            "seconds_to_limit": seconds, "seconds_to_high": None, "points": 12,
            "limit": GiB, "high": None, "headroom": 300 * MiB, "time": 0.0,
            "wall_time": 0.0}


@pytest.mark.parametrize("record, before, level, text", [
    (rec(3, 25.0), 2, "WARNING",
     "/job: working set growing 12.0 MiB/s: its limit (1.0 GiB) in ~25 s at this rate, "
     "headroom 300.0 MiB"),
    (rec(1, 400.0), 2, "INFO   ",
     "/job: working set growing 12.0 MiB/s: its limit (1.0 GiB) in ~400 s at this rate, "
     "headroom 300.0 MiB"),
    (rec(4, 0.0), 3, "WARNING",
     "/job: working set growing 12.0 MiB/s: its limit (1.0 GiB) reached, headroom 300.0 MiB"),
    (rec(0, None, 0.0), 1, "INFO   ",
     "/job: its limit is no longer in sight within 600 s (working set growing 0 B/s)"),
])
def test_format_forecast(record: dict[str, Any], before: int, level: str, text: str) -> None:
    line = format_forecast(record, before)
    stamp, _, rest = line.partition(" ")
    assert len(stamp) == 8 and stamp.count(":") == 2
    assert rest == f"{level} {text}"


def test_table_shows_the_forecast_only_when_sampled() -> None:
    data: dict[str, Any] = {
        "total_memory": GiB, "available_memory": 500 * MiB, "dev_shm": None,
        "host": {"mem_total": 8 * GiB, "mem_available": 4 * GiB, "source": "/proc/meminfo"},
        "status": {"mode": "watching", "reason": "", "version": 1, "cgroup_path": "/job",
                   "directory": "/sys/fs/cgroup/memory/job"},
        "levels": [{"binds_total": True, "binds_available": True, "cgroup_path": "/job",
                    "limit": GiB, "usage": 600 * MiB, "inactive_file": 100 * MiB,
                    "headroom": 524 * MiB}],
        "forecast": None,
    }
    assert "growth/s" not in format_table(data)
    data["forecast"] = {"sampled_seconds": 10.0, "bucket": 10 / 12, "levels": {
        "/job": {"growth": 2.0 * MiB, "seconds_to_limit": 262.0, "seconds_to_high": None,
                 "points": 11}}}
    table = format_table(data).splitlines()
    assert table[1].split()[-3:] == ["growth/s", "limit", "in"]
    assert table[2].split()[-3:] == ["MiB", "~262", "s"]
    assert "2.0 MiB" in table[2]
    assert any(line.startswith("growth/s, limit in: ") and "over 10 s" in line
               and "shorter than 10.0 s" in line for line in table)  # 12 buckets of 10/12 s
