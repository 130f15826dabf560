"""Internal. A guard's record (guardrecord.py) replayed through the decision (decision.py):
the same calls in the same order, so with the options it was recorded with the verdicts are
the live ones, checked at every sample (`mismatches`); with other options (`overrides`),
where the guard would have stopped instead. Pure: a parsed record in, a `Replayed` out;
cli/replay.py reads the file and prints. Tested in tests/test_guardreplay.py.

With other options the samples can fall elsewhere: the decision's `due()` may ask for one at
a check where the live guard read no levels. The replay then samples at the next check that
has them (the live guard's next sample: at most `interval`, 0.05 s near the reserve, later),
so a replayed stop may come that much after the one such a guard would have made.
"""

from __future__ import annotations

from .decision import Decision, LevelSample
from .frozen import Frozen, fill
from .guardrecord import Check, Note, Record, clock_us
from .wouldstop import Judged, Observer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    from .policy import Verdict


class Replayed(Frozen):
    """What a replay found. `exact`: a live guard's record run with its own options (then
    `mismatches` lists each check where it did not answer as live, expected empty).
    `changes`: (time, verdict) at each change of the decision; `judged`: the would-be
    stops, judged (wouldstop.py); `series`: per level, [(time, working set, limit,
    headroom)] at each sample; `start`, `end`: the record's first and last time (s);
    `ended`: when the job ended, if the record says (`oom_killed` then how); `cut`: the
    record was cut at its size cap; `live`: (time, fields) of each change of the live
    verdict written in the record."""

    __slots__ = _fields = ("options", "exact", "checks", "samples", "mismatches", "changes",
                           "judged", "series", "start", "end", "ended", "oom_killed", "cut",
                           "live")
    options: dict[str, Any]
    exact: bool
    checks: int
    samples: int
    mismatches: list[str]
    changes: list[tuple[float, Verdict]]
    judged: list[Judged]
    series: dict[str, list[tuple[float, Optional[int], Optional[int], Optional[int]]]]
    start: float
    end: float
    ended: Optional[float]
    oom_killed: bool
    cut: bool
    live: list[tuple[float, dict[str, Any]]]  # the live verdict's changes the record holds

    def __init__(self, options: dict[str, Any], exact: bool, checks: int, samples: int,
                 mismatches: list[str], changes: list[tuple[float, Verdict]],
                 judged: list[Judged],
                 series: dict[str, list[tuple[float, Optional[int], Optional[int],
                                              Optional[int]]]],
                 start: float, end: float, ended: Optional[float], oom_killed: bool,
                 cut: bool, live: list[tuple[float, dict[str, Any]]]) -> None:
        fill(self, locals())

    @property
    def first_stop(self) -> Optional[Verdict]:
        """The first stop (where an acting guard would have stopped the job), if any."""
        return next((v for _, v in self.changes if v.stop), None)


def replay(record: Record, overrides: Optional[dict[str, Any]] = None,
           mismatches_kept: int = 20) -> Replayed:
    """Feed `record` to a Decision made with its options, `overrides` replacing some
    (module docstring)."""
    overrides = overrides or {}
    options = {**record.options, **overrides}
    # Checked against the live decisions: a live guard's record (not one made by hand, in
    # which a sample or a verdict may be left out) replayed with its own options.
    exact = bool(record.header.get("live")) and all(
        record.options.get(k) == v for k, v in overrides.items())
    decision = Decision(**options)
    observer = Observer()
    start = clock_us(int(record.header.get("start_us", 0)))
    mismatches: list[str] = []
    changes: list[tuple[float, Verdict]] = []
    series: dict[str, list[tuple[float, Optional[int], Optional[int], Optional[int]]]] = {}
    live: list[tuple[float, dict[str, Any]]] = []
    checks = samples = 0
    ended: Optional[float] = None
    oom_killed = cut = False
    now = start
    key = decision.verdict.key()

    def differs(text: str) -> None:
        if len(mismatches) < mismatches_kept:
            mismatches.append(f"{now - start:.6f} s: {text}")

    for entry in record.entries:
        if isinstance(entry, Note):
            if entry.kind == "saved":
                decision.saved(float(entry.value))
            elif entry.kind == "estimate":
                decision.estimate_checkpoint(int(entry.value))
            elif entry.kind == "state":
                decision.load_state_dict(entry.value)
            elif entry.kind == "end":
                ended = clock_us(int(entry.value))
                oom_killed = bool(entry.extra.get("oom_killed"))
            elif entry.kind == "cut":
                cut = True
            continue
        checks += 1
        now = entry.now
        verdict = _check(decision, entry, exact, differs)
        if entry.verdict is not None:
            live.append((now, entry.verdict))
        if entry.levels is not None:
            samples += 1
            for lvl in entry.levels:
                series.setdefault(str(lvl[0]), []).append((now, lvl[3], lvl[1], lvl[2]))
        if verdict.key() != key:
            key = verdict.key()
            changes.append((now, verdict))
            if exact and entry.verdict is not None and entry.verdict != verdict.as_dict():
                differs(f"verdict {verdict.as_dict()} where live was {entry.verdict}")
            elif exact and entry.verdict is None:
                differs(f"verdict changed to {verdict.key()}; live it did not")
        elif exact and entry.verdict is not None:
            differs(f"verdict stayed {key}; live it changed to {entry.verdict}")
        observer.seen(now, verdict, entry.killed)
    judged = observer.judged(ended, killed_at=ended if oom_killed else None)
    return Replayed(options, exact, checks, samples, mismatches, changes, judged, series,
                    start, now, ended, oom_killed, cut, live)


def _check(decision: Decision, entry: Check, exact: bool,
           differs: Any) -> Verdict:
    """One recorded check, as the guard made its calls: due(), then sample() with the levels
    it read, or sampling_failed(); a failed read of available_memory() is sampling_failed()
    alone."""
    now = entry.now
    if entry.failed and entry.available is None:
        decision.sampling_failed(now, entry.killed)
        return decision.verdict
    due = decision.due(now, entry.available, entry.killed)
    live = entry.levels is not None or entry.failed
    if exact and due != live:
        differs(f"due() said {due}; live it said {live}")
    if not due:
        return decision.verdict
    if entry.levels is not None:
        levels = [LevelSample(*lvl) for lvl in entry.levels]
        return decision.sample(now, entry.available, levels, entry.killed, entry.step)
    if entry.failed:
        decision.sampling_failed(now, entry.killed)
    return decision.verdict  # other options: due where live read no levels (module doc)
