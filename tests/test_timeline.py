"""The bounded series of a run's picture (cgwatch/timeline.py), as tables: what is kept as
samples come, the merge at the bound (each column's larger value: a peak stays), columns that
appear later, and the marks' bound."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from cgwatch.timeline import Timeline


def fed(values: list[Optional[int]], max_points: int) -> dict[str, Any]:
    tl = Timeline(max_points)
    for i, v in enumerate(values):
        tl.add(float(i), {"x": v})
    return tl.as_dict()


@pytest.mark.parametrize("values, max_points, times, xs, stride", [
    # under the bound: every sample
    ([1, 2, 3], 4, [0.0, 1.0, 2.0], [1, 2, 3], 1),
    # the 4th sample reaches 4 points: pairs merge, each to its earlier time and larger value
    ([1, 5, 3, 2], 4, [0.0, 2.0], [5, 3], 2),
    # then every 2 samples make one point (the pending one is shown as it stands)
    ([1, 5, 3, 2, 7, 1, 0], 4, [0.0, 2.0, 4.0, 6.0], [5, 3, 7, 0], 2),
    # a peak between samples survives every merge
    ([0, 0, 0, 0, 0, 99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 4, [0.0, 8.0], [99, 0], 8),
    # None (unread) yields to a value; two Nones stay None
    ([None, 4, None, None], 4, [0.0, 2.0], [4, None], 2),
])
def test_samples_and_merges(values: list[Optional[int]], max_points: int, times: list[float],
                            xs: list[Optional[int]], stride: int) -> None:
    data = fed(values, max_points)
    assert data["times"] == times
    assert data["columns"]["x"] == xs
    assert data["stride"] == stride


def test_bounded_however_long() -> None:
    tl = Timeline(64)
    for i in range(100_000):
        tl.add(i * 0.25, {"usage:/job": i, "limit:/job": 1 << 30})
        assert len(tl.times) < 64
    data = tl.as_dict()
    assert 32 <= len(data["times"]) <= 64
    assert max(v for v in data["columns"]["usage:/job"] if v is not None) == 99_999
    assert data["times"][0] == 0.0


def test_a_column_that_appears_later_is_none_before() -> None:
    tl = Timeline(8)
    tl.add(0.0, {"a": 1})
    tl.add(1.0, {"a": 2, "b": 7})
    assert tl.as_dict()["columns"] == {"a": [1, 2], "b": [None, 7]}


def test_marks_beyond_the_bound_are_counted_final_ones_kept() -> None:
    tl = Timeline(8, max_marks=2)
    for i in range(5):
        tl.mark(float(i), "event", f"failcnt +{i}")
    tl.mark(9.0, "exit", "killed by SIGKILL", final=True, exit_status=137)
    data = tl.as_dict()
    assert [m["label"] for m in data["marks"]] == ["failcnt +0", "failcnt +1",
                                                   "killed by SIGKILL"]
    assert data["marks"][-1]["exit_status"] == 137
    assert data["marks_dropped"] == 3


@pytest.mark.parametrize("max_points, max_marks", [(1, 0), (3, 0), (8, -1)])
def test_refuses_a_bad_shape(max_points: int, max_marks: int) -> None:
    with pytest.raises(ValueError):
        Timeline(max_points, max_marks)
