"""Internal. A run's memory over time in bounded memory, for `cgwatch run --plot` and its JSON
report: series of samples (time, one value per column: a level's usage, working set, limit,
memory.high) and marks (an event, the guard's decision, the end). Pure: times and values are
passed in; table-tested in tests/test_timeline.py.

Bounded however long the run: at `max_points` samples, every two neighbours are merged into
one (the earlier time, each column's larger value: a peak is what meets a limit, and must not
vanish from the picture), and from then on every `stride` incoming samples make one point,
the stride doubling at each merge. So a run keeps between max_points / 2 and max_points
points, evenly spaced in samples. Marks beyond `max_marks` are counted, not kept (the end and
the guard's decision are always kept: the caller records them as `final` marks).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Optional


def _larger(a: Optional[int], b: Optional[int]) -> Optional[int]:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b


class Timeline:
    """Series and marks of one run (module docstring)."""

    def __init__(self, max_points: int = 1024, max_marks: int = 256) -> None:
        if max_points < 2 or max_points % 2 or max_marks < 0:
            raise ValueError("timeline: max_points even and >= 2, max_marks >= 0")
        self.max_points = max_points
        self.max_marks = max_marks
        self.times: list[float] = []
        self.columns: dict[str, list[Optional[int]]] = {}
        self.marks: list[dict[str, Any]] = []
        self.marks_dropped = 0
        self.stride = 1
        self._pending: Optional[tuple[float, dict[str, Optional[int]]]] = None
        self._pending_count = 0

    def add(self, t: float, values: Mapping[str, Optional[int]]) -> None:
        """One sample: `values` by column name (a column first seen now is None before)."""
        if self._pending is None:
            self._pending = (t, dict(values))
        else:
            merged = self._pending[1]
            for name, value in values.items():
                merged[name] = _larger(merged.get(name), value)
        self._pending_count += 1
        if self._pending_count >= self.stride:
            self._append(*self._pending)
            self._pending, self._pending_count = None, 0

    def mark(self, t: float, kind: str, label: str, final: bool = False, **extra: Any) -> None:
        """A moment to show: `kind` ("event", "guard", "exit"), `label` the text. Beyond
        max_marks only `final` ones are kept; the others are counted in marks_dropped."""
        if len(self.marks) >= self.max_marks and not final:
            self.marks_dropped += 1
            return
        self.marks.append({"time": t, "kind": kind, "label": label, **extra})

    def _append(self, t: float, values: dict[str, Optional[int]]) -> None:
        for name in values:
            if name not in self.columns:
                self.columns[name] = [None] * len(self.times)
        self.times.append(t)
        for name, column in self.columns.items():
            column.append(values.get(name))
        if len(self.times) >= self.max_points:
            self.times = self.times[::2]
            for name, column in self.columns.items():
                self.columns[name] = [_larger(a, b) for a, b in zip(column[::2], column[1::2])]
            self.stride *= 2

    def as_dict(self) -> dict[str, Any]:
        """Plain data: times (seconds), columns (name -> values, None where unread), marks,
        marks_dropped, and `stride` (samples per point)."""
        times = list(self.times)
        columns = {name: list(values) for name, values in self.columns.items()}
        if self._pending is not None:  # the samples not yet making a full point
            t, pending = self._pending
            times.append(t)
            for name in set(columns) | set(pending):
                columns.setdefault(name, [None] * len(self.times)).append(pending.get(name))
        return {"times": times, "columns": columns, "marks": list(self.marks),
                "marks_dropped": self.marks_dropped, "stride": self.stride}
