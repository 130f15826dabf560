"""Internal. `cgwatch run --guard --observe`: the guard decides as it would, nothing is sent.
Each would-be stop is one line on stderr when it comes ("would send SIGTERM ...; why: ...")
and a mark on the picture; once CMD ended, each is judged by what followed (wouldstop.py:
false, needed with the lead it had, open) and the counts are one line, and `observe` in
the JSON report. `--record FILE` keeps the guard's inputs for `cgwatch replay`.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any, Optional

from ..wouldstop import Judged, counts, describe, summary_line
from .explain import signal_name

if TYPE_CHECKING:
    from ..guard import Guard, Verdict
    from .plot import Recorder


def observe_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Guard's keywords for --observe and --record (none when not given)."""
    options: dict[str, Any] = {}
    if getattr(args, "observe", False):
        options["observe"] = True
    if getattr(args, "record", None):
        options["record"] = args.record
    return options


def stop_dict(judged: Judged, start: float) -> dict[str, Any]:
    """One judged would-be stop for the JSON report; times in seconds since `start`."""
    stop = judged.stop
    return {"at": round(stop.at - start, 3), "lead": round(stop.lead, 3),
            "trigger": stop.trigger, "level": stop.level, "step": stop.step,
            "cleared": None if stop.cleared is None else round(stop.cleared - start, 3),
            "judged": judged.judged,
            "lead_had": None if judged.lead_had is None else round(judged.lead_had, 3)}


class ObservedRun:
    """What `run --observe` adds around its guard (module docstring)."""

    def __init__(self, guard: Guard, recorder: Optional[Recorder],
                 signum: Optional[int]) -> None:
        self.guard = guard
        self.recorder = recorder
        self.sent = signal_name(signum) if signum is not None else "SIGTERM"
        self.start = time.monotonic()
        self._stopped = False
        guard.subscribe(self._changed)

    def _changed(self, verdict: Verdict) -> None:
        """One line and one mark per would-be stop: at its start, not at each change of
        its trigger (a forecast that becomes a reserve stop is one stop)."""
        stopped, self._stopped = self._stopped, verdict.stop
        if not verdict.stop or stopped:
            return
        _, found, why = verdict.message().partition(": save and stop: ")
        print(f"cgwatch guard (observe): would send {self.sent} now, to save (nothing sent); "
              f"why: {why if found else verdict.message()}", file=sys.stderr, flush=True)
        if self.recorder is not None:
            self.recorder.mark("guard", f"would stop: {verdict.trigger}",
                               cgroup_path=verdict.level or None)

    def outcome(self, name: str, ended_at: float, oom_killed: bool) -> dict[str, Any]:
        """The report's part once CMD ended at `ended_at` (time.monotonic()): `line` (the
        counts), `observe` (the counts and each stop, for JSON); `saved` False: nothing was
        signalled."""
        judged = self.guard.would_stops(ended=ended_at,
                                        killed_at=ended_at if oom_killed else None)
        if self.recorder is not None:  # the picture's marks, made as each came, judged now
            marks = [m for m in self.recorder.timeline.marks
                     if m["kind"] == "guard" and m["label"].startswith("would stop")]
            for mark, j in zip(marks, judged):
                mark["label"] += f" ({describe(j)})"
        line = summary_line(judged).replace("cgwatch guard (observe): ",
                                            f"cgwatch guard (observe): {name}: ", 1)
        return {"line": line, "seconds": None, "saved": False, "checkpoint": None,
                "observe": {"counts": counts(judged),
                            "stops": [stop_dict(j, self.start) for j in judged]}}
