"""Internal. The guard's record: the file format of every input its decision took, so that a
decision fed the file again (`cgwatch replay`) reproduces the live verdicts exactly. Pure:
lines made from numbers (`RecordEncoder`) and numbers parsed from lines (`parse_record`);
recordfile.py writes them, guard.py says what to write. Tested in tests/test_guardrecord.py.

One JSON value a line (UTF-8, "\\n"):
- the header, an object: {"cgwatch_guard_record": VERSION, "options": the decision's
  options (a reserve as {"bytes": n} or {"fraction": f}), "start_us": the guard's clock at
  its start (integer microseconds), "start_wall": time.time() then, "observe": bool, and
  what the writer adds: "live" (written by a guard as it decided: every sample and every
  change of its verdict is in it, so a replay can check them), "pid", "command";
- a check, an array [dt, da] or [dt, da, {...}]: the microseconds since the previous check
  (the first: since start_us) and the bytes `available_memory()` moved since it (null: the
  read failed), then only what changed or happened: "k" the OOM kills counted, "s" the
  step (given to a sample: the decision takes it there only), "l" the levels read at a
  sample (each [cgroup_path, limit, headroom, working_set, high, pressure_total,
  high_rises]; the path as its index once it was given, the last three left out when none,
  none, 0), "f" 1 when the sample
  failed, "v" the live verdict (its fields) when it changed (stop, trigger or level);
- between checks, objects: {"saved": seconds} (a save reported), {"estimate": bytes} (a
  checkpoint's size from an adapter), {"state": {...}} (a previous life's state_dict()
  loaded), {"end": us, ...} (the job's end, and how: "status",
  "oom_killed"), {"cut": us, "bytes": n} (the size cap was reached: nothing after it).

Why integer microseconds: the guard's clock, when it records, is `monotonic_ns() // 1000`
over 1e6, so the replay's `us / 1e6` is the very float the live decision was given (both
are the float nearest to the same rational), where a float written as a difference would
not add back exactly. Why deltas: a check between samples is then ~15 bytes (`[100012,
-4096]`): at `run --guard`'s 10 checks a second, ~13 MB a day; at one check per 10 ms step,
~130 MB a day; a sample adds ~60 bytes plus ~70 per level (docs/guard.md gives a week's).
"""

from __future__ import annotations

import json

from .alerts import Threshold
from .frozen import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any, Optional, Union

VERSION = 1
MAGIC = "cgwatch_guard_record"
# cgroup_path, limit, headroom, working_set, high, pressure_total (PSI total= us), high_rises
LEVEL_FIELDS = ("cgroup_path", "limit", "headroom", "working_set", "high", "pressure_total",
                "high_rises")
LEVEL_DEFAULTS = (None, None, None, None, None, None, 0)  # high, pressure_total, high_rises


def clock_us(us: int) -> float:
    """The guard's time (seconds) of a check at `us` microseconds: what live and replay use."""
    return us / 1e6


class Check(Frozen):
    """One check's inputs: its time (`us`, and `now` = us / 1e6), `available` (None: the
    read failed), the OOM kills counted, the step; at a sample the `levels` read (tuples in
    LEVEL_FIELDS' order) or `failed`; `verdict`: the live verdict's fields when it changed."""

    __slots__ = _fields = ("us", "available", "killed", "step", "levels", "failed", "verdict")
    us: int
    available: Optional[int]
    killed: int
    step: Optional[int]
    levels: Optional[list[tuple[Any, ...]]]
    failed: bool
    verdict: Optional[dict[str, Any]]

    def __init__(self, us: int, available: Optional[int], killed: int = 0,
                 step: Optional[int] = None, levels: Optional[list[tuple[Any, ...]]] = None,
                 failed: bool = False, verdict: Optional[dict[str, Any]] = None) -> None:
        fill(self, locals())

    @property
    def now(self) -> float:
        return clock_us(self.us)


class Note(Frozen):
    """A line between checks: `kind` "saved", "estimate", "end" or "cut", its `value`
    (seconds, bytes, microseconds) and the rest of its fields (`extra`)."""

    __slots__ = _fields = ("kind", "value", "extra")
    kind: str
    value: Any
    extra: dict[str, Any]

    def __init__(self, kind: str, value: Any, extra: Optional[dict[str, Any]] = None) -> None:
        extra = extra or {}
        fill(self, locals())


NOTES = ("saved", "estimate", "state", "end", "cut")


class Record(Frozen):
    """A parsed record: its header's fields and its entries, in order."""

    __slots__ = _fields = ("header", "options", "entries")
    header: dict[str, Any]
    options: dict[str, Any]
    entries: list[Union[Check, Note]]

    def __init__(self, header: dict[str, Any], options: dict[str, Any],
                 entries: list[Union[Check, Note]]) -> None:
        fill(self, locals())

    def checks(self) -> list[Check]:
        return [e for e in self.entries if isinstance(e, Check)]

    def note(self, kind: str) -> Optional[Note]:
        """The last note of `kind`, if any."""
        found = None
        for e in self.entries:
            if isinstance(e, Note) and e.kind == kind:
                found = e
        return found


def encode_options(options: dict[str, Any]) -> dict[str, Any]:
    """The decision's options as JSON values: a Threshold as {"bytes"} or {"fraction"}."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if isinstance(value, Threshold):
            value = {"bytes": value.bytes} if value.bytes is not None \
                else {"fraction": value.fraction}
        out[name] = value
    return out


def decode_options(options: dict[str, Any]) -> dict[str, Any]:
    """encode_options undone: a {"bytes"} / {"fraction"} object is a Threshold again."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if isinstance(value, dict) and set(value) in ({"bytes"}, {"fraction"}):
            value = Threshold(**value)
        out[name] = value
    return out


def header_line(options: dict[str, Any], start_us: int, start_wall: float,
                observe: bool, **extra: Any) -> str:
    """The first line (module docstring)."""
    return json.dumps({MAGIC: VERSION, "options": encode_options(options),
                       "start_us": start_us, "start_wall": start_wall, "observe": observe,
                       **extra}, separators=(",", ":")) + "\n"


def note_line(kind: str, value: Any, **extra: Any) -> str:
    """A line between checks: {"saved": s}, {"estimate": n}, {"end": us, ...}, {"cut": ...}."""
    return json.dumps({kind: value, **extra}, separators=(",", ":")) + "\n"


class RecordEncoder:
    """Makes the check lines, each relative to the previous check (module docstring)."""

    def __init__(self, start_us: int) -> None:
        self._us = start_us
        self._available = 0
        self._killed = 0
        self._paths: dict[str, int] = {}

    def check(self, us: int, available: Optional[int], killed: int, step: Optional[int],
              levels: Optional[Sequence[Sequence[Any]]] = None, failed: bool = False,
              verdict: Optional[dict[str, Any]] = None) -> str:
        """The line of one check (module docstring)."""
        dt, self._us = us - self._us, us
        if available is None:
            da: Optional[int] = None
        else:
            da, self._available = available - self._available, available
        extra: dict[str, Any] = {}
        if killed != self._killed:
            extra["k"] = self._killed = killed
        if step is not None:
            extra["s"] = step
        if levels is not None:
            extra["l"] = [self._level(lvl) for lvl in levels]
        if failed:
            extra["f"] = 1
        if verdict is not None:
            extra["v"] = verdict
        if not extra:
            return f"[{dt},{'null' if da is None else da}]\n"
        return json.dumps([dt, da, extra], separators=(",", ":")) + "\n"

    def _level(self, level: Sequence[Any]) -> list[Any]:
        """A level's fields, its path as its index in the order paths were first seen (the
        path itself the first time), trailing defaults (no high, no PSI, 0 rises) left out."""
        path = level[0]
        index = self._paths.get(path)
        if index is None:
            self._paths[path] = len(self._paths)
            out = list(level)
        else:
            out = [index, *level[1:]]
        while len(out) > 4 and out[-1] == LEVEL_DEFAULTS[len(out) - 1]:
            out.pop()
        return out


def parse_record(lines: Iterable[str]) -> Record:
    """A record from its lines; raises ValueError naming the line for one that is not one.
    A last line cut short (the writer killed mid-line) is left out."""
    header: Optional[dict[str, Any]] = None
    entries: list[Union[Check, Note]] = []
    us = available = killed = 0
    pending: Optional[tuple[int, str]] = None  # a line that did not parse: fine if the last
    paths: list[str] = []  # the levels' paths in the order first seen
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if pending is not None:
            raise ValueError(f"record line {pending[0]}: not JSON: {pending[1][:60]!r}")
        try:
            value = json.loads(line)
        except ValueError:
            pending = (number, line)
            continue
        if header is None:
            if not isinstance(value, dict) or value.get(MAGIC) != VERSION:
                raise ValueError(f"not a cgwatch guard record (version {VERSION}): "
                                 f"line 1 is {line[:60]!r}")
            header = value
            us = int(value["start_us"])
            continue
        if isinstance(value, list) and len(value) in (2, 3):
            extra = value[2] if len(value) == 3 else {}
            us += int(value[0])
            now_available: Optional[int] = None
            if value[1] is not None:
                available += int(value[1])
                now_available = available
            killed = int(extra.get("k", killed))
            step = extra.get("s")
            levels = [_level(lvl, paths) for lvl in extra["l"]] if "l" in extra else None
            entries.append(Check(us, now_available, killed, step, levels,
                                 bool(extra.get("f")), extra.get("v")))
            continue
        kind = next((k for k in NOTES if isinstance(value, dict) and k in value), None)
        if kind is None:
            raise ValueError(f"record line {number}: not a check or a note: {line[:60]!r}")
        entries.append(Note(kind, value[kind], {k: v for k, v in value.items() if k != kind}))
    if header is None:
        raise ValueError("an empty record: no header line")
    return Record(header, decode_options(header.get("options", {})), entries)


def _level(fields: list[Any], paths: list[str]) -> tuple[Any, ...]:
    """A level's tuple (LEVEL_FIELDS) from its line's list (RecordEncoder._level)."""
    if isinstance(fields[0], str):
        paths.append(fields[0])
        path = fields[0]
    else:
        path = paths[fields[0]]
    return (path, *fields[1:], *LEVEL_DEFAULTS[len(fields):])
