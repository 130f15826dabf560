"""The working-set forecast (cgwatch/forecast.py) as tables of sample series: the shapes a
training job's cgroup shows (a sawtooth from Python's GC and the allocator's arenas, a leak of
pinned batches, a dataset loaded at once, a limit raised while running), with the trend
expected, worked out by hand in each row's note."""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import pytest

from cgwatch.forecast import FLAT, Forecaster, Trend, persists, theil_sen

MiB = 1 << 20
GiB = 1 << 30


def sawtooth(t: float) -> int:
    """1 GiB base, climbing 200 MiB over 2 s and dropping back (a gen-2 collection or an
    arena trim every 2 s), sampled every 0.25 s: period 2 s, within span * bucket (5 s)."""
    return GiB + int(200 * MiB * ((t % 2.0) / 2.0))


def leak(t: float) -> int:
    """1 GiB growing 16 MiB/s (pinned batches kept by a list)."""
    return GiB + int(16 * MiB * t)


def leak_under_sawtooth(t: float) -> int:
    """The sawtooth above plus an 8 MiB/s leak: the envelope rises once a 2 s cycle."""
    return sawtooth(t) + int(8 * MiB * t)


def step(t: float) -> int:
    """Flat 1 GiB, then a 1 GiB dataset loaded at once at t = 6 s, flat after."""
    return GiB + (GiB if t >= 6.0 else 0)


def burst(t: float) -> int:
    """Flat, with one 1.5 GiB burst (an eval batch) lasting 1 s at t = 8 s."""
    return GiB + (3 * GiB // 2 if 8.0 <= t < 9.0 else 0)


def flat(t: float) -> int:
    return 2 * GiB


class Row(NamedTuple):
    series: Callable[[float], int]
    seconds: float  # sampled every 0.25 s from 0 to this
    line: int  # the limit at the end
    growth: tuple[float, float]  # bytes/s, inclusive bounds
    left: Optional[tuple[float, float]]  # seconds_left(line) bounds, None: no forecast


ROWS = [
    # Every bucket's peak is the cycle's top, 1 GiB + ~194 MiB: the envelope never rises.
    pytest.param(Row(sawtooth, 30.0, 2 * GiB, (0.0, 0.0), None), id="sawtooth-no-trigger"),
    # 16 MiB/s from the first sample: the envelope rises at every bucket, so after the 4
    # closed buckets min_points needs (t = 4.25 s) the slope is 16 MiB/s. At t = 6 s the
    # peak is ~1 GiB + 96 MiB (the open bucket's top); 2 GiB - that = 928 MiB -> 58 s.
    pytest.param(Row(leak, 6.0, 2 * GiB, (15.9 * MiB, 16.1 * MiB), (57.0, 59.0)),
                 id="steady-leak-seen-in-6-s"),
    # 20 s: peak ~1 GiB + 320 MiB; (2048 - 1344) MiB / 16 MiB/s = 44 s.
    pytest.param(Row(leak, 20.0, 2 * GiB, (15.9 * MiB, 16.1 * MiB), (43.0, 45.0)),
                 id="steady-leak-20-s"),
    # The envelope steps up every 2 s by 16 MiB (8 MiB/s x 2 s): Theil-Sen over the
    # staircase is 8 MiB/s within a bucket's rounding; at 30 s the top is 1 GiB + 194 MiB +
    # 240 MiB = 1458 MiB; 590 MiB / 8 MiB/s = ~74 s.
    pytest.param(Row(leak_under_sawtooth, 30.0, 2 * GiB, (6 * MiB, 10 * MiB), (55.0, 100.0)),
                 id="leak-under-sawtooth"),
    # One rise among flat changes: no growth, however close the step came to the line.
    pytest.param(Row(step, 12.0, 2 * GiB + 100 * MiB, (0.0, 0.0), None), id="step-change"),
    pytest.param(Row(step, 30.0, 2 * GiB + 100 * MiB, (0.0, 0.0), None), id="step-long-ago"),
    pytest.param(Row(burst, 12.0, 3 * GiB, (0.0, 0.0), None), id="one-burst"),
    pytest.param(Row(flat, 60.0, 4 * GiB, (0.0, 0.0), None), id="flat"),
    # Over the line already: 0 s left whatever the growth.
    pytest.param(Row(flat, 3.0, 2 * GiB, (0.0, 0.0), (0.0, 0.0)), id="at-the-line"),
]


def run(series: Callable[[float], int], seconds: float) -> Trend:
    forecaster = Forecaster()
    t = 0.0
    while t <= seconds + 1e-9:
        forecaster.add(t, series(t))
        t += 0.25
    return forecaster.trend()


@pytest.mark.parametrize("row", ROWS)
def test_trend(row: Row) -> None:
    trend = run(row.series, row.seconds)
    assert row.growth[0] <= trend.growth <= row.growth[1], trend
    left = trend.seconds_left(row.line)
    if row.left is None:
        assert left is None, trend
    else:
        assert left is not None and row.left[0] <= left <= row.left[1], trend


def test_a_leak_is_seen_within_a_few_samples() -> None:
    """No growth before min_points closed buckets (t < 4 s), the leak's rate from then on."""
    forecaster = Forecaster()
    seen_at = None
    for i in range(0, 41):
        t = i * 0.25
        forecaster.add(t, leak(t))
        if seen_at is None and forecaster.trend().growth > 0:
            seen_at = t
    assert seen_at is not None and 4.0 <= seen_at <= 5.0


def test_a_limit_raised_while_running_moves_the_forecast_at_once() -> None:
    """The history is the working set's, not the headroom's: the same trend against the new
    line. 16 MiB/s leak at 20 s (peak 1344 MiB): 2 GiB -> 44 s, raised to 4 GiB -> 172 s."""
    trend = run(leak, 20.0)
    before, after = trend.seconds_left(2 * GiB), trend.seconds_left(4 * GiB)
    assert before is not None and 43.0 <= before <= 45.0
    assert after is not None and 171.0 <= after <= 173.0


def test_the_history_is_bounded() -> None:
    """A week of 4 Hz samples keeps span peaks and window envelope points (asked through
    trend().points, which counts the envelope points)."""
    forecaster = Forecaster(bucket=1.0, span=5, window=12)
    for i in range(200_000):
        forecaster.add(i * 0.25, GiB + (i % 8) * MiB)
    assert forecaster.trend().points == 12


def test_no_samples_no_trend() -> None:
    assert Forecaster().trend() == FLAT
    assert FLAT.seconds_left(GiB) is None
    assert FLAT.seconds_left(None) is None


def test_clear_forgets() -> None:
    forecaster = Forecaster()
    for i in range(40):
        forecaster.add(i * 0.25, leak(i * 0.25))
    forecaster.clear()
    assert forecaster.trend() == FLAT


@pytest.mark.parametrize("kwargs", [{"bucket": 0}, {"span": 0}, {"window": 2},
                                    {"min_points": 2}, {"window": 5, "min_points": 6}])
def test_shape_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Forecaster(**kwargs)  # type: ignore[arg-type]


THEIL_SEN = [
    pytest.param([(0.0, 0), (1.0, 10), (2.0, 20)], 10.0, id="line"),
    # One outlier of five points moves the median slope not at all.
    pytest.param([(0.0, 0), (1.0, 10), (2.0, 1000), (3.0, 30), (4.0, 40)], 10.0, id="outlier"),
    pytest.param([(0.0, 5)], 0.0, id="one-point"),
    pytest.param([(1.0, 5), (1.0, 9)], 0.0, id="same-time"),
]


@pytest.mark.parametrize(("points", "want"), THEIL_SEN)
def test_theil_sen(points: list[tuple[float, int]], want: float) -> None:
    assert theil_sen(points) == want


PERSISTS = [
    pytest.param([1, 2, 3, 4], True, id="three-rises"),
    pytest.param([1, 1, 1, 1, 9, 9, 9, 9], False, id="step"),
    pytest.param([1, 2, 2, 2, 3, 3, 3, 4, 4], True, id="staircase"),
    pytest.param([1, 2, 3, 4, 4, 4, 4, 4, 4], False, id="stopped-rising"),
    pytest.param([1, 2, 1, 2, 1, 2, 1], False, id="jitter"),
    pytest.param([5], False, id="one-value"),
]


@pytest.mark.parametrize(("values", "want"), PERSISTS)
def test_persists(values: list[int], want: bool) -> None:
    assert persists(values) is want
