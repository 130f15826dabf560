"""Internal. The guard's would-be stops (observe mode: everything decided, nothing done) and
how each is judged by what followed. Pure: times are the guard's clock, passed in;
table-tested in tests/test_wouldstop.py. guard.py feeds an `Episodes` its verdicts; `cgwatch
run --guard --observe` and `cgwatch replay` judge what it kept.

A would-be stop is an episode: from a check whose verdict says stop (where an acting guard
would have stopped the job) until the first verdict that says go on again (`cleared`). It is
judged by what came after its start (`judge`):
- NEEDED: the job reached its limit (an OOM kill counted on the path, or the job itself
  OOM-killed) while the stop stood, or within the stop's lead of it whatever the verdict did
  meanwhile. `lead_had`: the seconds from the stop to that kill, what a save would have had.
  A kill long after a stop that never cleared is still needed: the guard kept saying the
  job was in danger until it died (a slow leak met by the reserve hours before the kill).
- FALSE: the job ended without reaching its limit (it went on and finished, or failed of
  something else), or the stop cleared and the job stayed under its limit for longer than
  the lead after it (a kill later than that is another episode's to judge).
- OPEN: not yet known: the job runs on and the stop stands, or it cleared less than a lead
  ago (a live exporter's count; a finished run has none unless its end is unknown, e.g. a
  record cut short).
"""

from __future__ import annotations

from .frozen import Frozen, fill, replace
from .policy import OK, Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Optional

FALSE = "false"
NEEDED = "needed"
OPEN = "open"
JUDGEMENTS = (FALSE, NEEDED, OPEN)


class WouldStop(Frozen):
    """One would-be stop: when the verdict turned to stop (`at`, seconds on the guard's
    clock), the lead it kept, its trigger and level, the step of that check, and when the
    verdict said go on again (`cleared`; None: it stood until the end)."""

    __slots__ = _fields = ("at", "lead", "trigger", "level", "step", "cleared")
    at: float
    lead: float
    trigger: str
    level: str
    step: Optional[int]
    cleared: Optional[float]

    def __init__(self, at: float, lead: float, trigger: str, level: str = "",
                 step: Optional[int] = None, cleared: Optional[float] = None) -> None:
        fill(self, locals())


class Judged(Frozen):
    """A would-be stop and its judgement (FALSE, NEEDED, OPEN); `lead_had`: for a needed
    stop, the seconds from it to the kill."""

    __slots__ = _fields = ("stop", "judged", "lead_had")
    stop: WouldStop
    judged: str
    lead_had: Optional[float]

    def __init__(self, stop: WouldStop, judged: str, lead_had: Optional[float] = None) -> None:
        fill(self, locals())


def judge(stop: WouldStop, kills: Sequence[float], ended: Optional[float],
          now: float) -> Judged:
    """Judge `stop` (module docstring) from the times the job reached its limit (`kills`:
    OOM kills on the path, the job's own included, any order), when it ended (None: it
    runs on) and the time of judging (`now`: the end, or the last check seen)."""
    later = [k for k in kills if k >= stop.at]
    kill = min(later) if later else None
    if kill is not None and (kill - stop.at <= stop.lead or stop.cleared is None
                             or kill <= stop.cleared):
        return Judged(stop, NEEDED, kill - stop.at)
    if ended is not None:
        return Judged(stop, FALSE)  # ended without reaching its limit while it mattered
    if stop.cleared is not None and now - stop.at > stop.lead:
        return Judged(stop, FALSE)  # cleared, and under the limit for longer than the lead
    return Judged(stop, OPEN)


def judge_all(stops: Sequence[WouldStop], kills: Sequence[float], ended: Optional[float],
              now: float) -> list[Judged]:
    """`judge` of each stop, in order."""
    return [judge(stop, kills, ended, now) for stop in stops]


def counts(judged: Sequence[Judged]) -> dict[str, int]:
    """How many were judged FALSE, NEEDED and OPEN (every key present)."""
    out = {name: 0 for name in JUDGEMENTS}
    for j in judged:
        out[j.judged] += 1
    return out


def describe(judged: Judged) -> str:
    """A judgement in a few words: "false", "open", "needed, 3.2 s before the kill"."""
    if judged.lead_had is None:
        return judged.judged
    return f"{judged.judged}, {judged.lead_had:.1f} s before the kill"


def summary_line(judged: Sequence[Judged]) -> str:
    """One line for a report: the counts, and the least lead a needed stop had."""
    n = counts(judged)
    if not judged:
        return "cgwatch guard (observe): no would-be stop"
    line = (f"cgwatch guard (observe): {len(judged)} would-be stop(s): {n[FALSE]} false, "
            f"{n[NEEDED]} needed, {n[OPEN]} open")
    leads = [j.lead_had for j in judged if j.lead_had is not None]
    if leads:
        line += f"; the needed had {min(leads):.1f} s before the kill"
        if len(leads) > 1:
            line += " at least"
    return line


class Episodes:
    """The would-be stops of one guard, fed its verdicts as they are decided (`add`). Bounded:
    the first `kept` episodes are kept whole, later ones only counted (`dropped`); the one
    going on is always `current`."""

    def __init__(self, kept: int = 1000) -> None:
        self.kept = kept
        self.stops: list[WouldStop] = []
        self.current: Optional[WouldStop] = None
        self.dropped = 0

    def add(self, now: float, verdict: Verdict) -> bool:
        """One verdict at time `now`; True when it starts a would-be stop."""
        current = self.current
        if verdict.stop:
            if current is not None:
                return False
            self.current = WouldStop(now, verdict.lead, verdict.trigger, verdict.level,
                                     verdict.step)
            if len(self.stops) < self.kept:
                self.stops.append(self.current)
            else:
                self.dropped += 1
            return True
        if current is not None:
            if self.stops and self.stops[-1] is current:
                self.stops[-1] = replace(current, cleared=now)
            self.current = None
        return False


class Observer:
    """Observe mode for one guard (`Guard(observe=True)`): fed each check's time, verdict and
    the OOM kills counted so far (`seen`), it keeps the would-be stops (`episodes`) and when
    kills were first counted (`kills`, the first `kept`), and answers the verdict the job is
    given: the same, or *go on* in place of a stop (its lead, kills and step kept)."""

    def __init__(self, kept: int = 1000) -> None:
        self.kept = kept
        self.episodes = Episodes(kept)
        self.kills: list[float] = []
        self.last: Optional[float] = None  # the time of the last check seen
        self._killed = 0
        self._source: Optional[Verdict] = None  # the last stop masked, and its mask
        self._masked: Optional[Verdict] = None

    def seen(self, now: float, verdict: Verdict, killed: int) -> Verdict:
        """One check: its time, the guard's verdict, the OOM kills counted; the verdict to
        give the job (never a stop)."""
        if killed > self._killed:
            self._killed = killed
            if len(self.kills) < self.kept:
                self.kills.append(now)
        self.last = now
        self.episodes.add(now, verdict)
        if not verdict.stop:
            return verdict
        if verdict is not self._source:  # a stop stands for many checks: one mask for it
            self._source = verdict
            self._masked = Verdict(False, OK, lead=verdict.lead, killed=verdict.killed,
                                    step=verdict.step)
        assert self._masked is not None
        return self._masked

    def judged(self, ended: Optional[float] = None,
               killed_at: Optional[float] = None) -> list[Judged]:
        """Each would-be stop judged (`judge`): `ended` when the job ended (None: it runs
        on), `killed_at` when it was itself OOM-killed (its own kill, which the guard
        cannot count: the job's process is gone)."""
        kills = [*self.kills, *([killed_at] if killed_at is not None else [])]
        now = ended if ended is not None else (self.last if self.last is not None else 0.0)
        return judge_all(self.episodes.stops, kills, ended, now)


def would_stop_line(message: str) -> str:
    """A stop's line (`Verdict.message()`) as observe mode logs it: nothing is done."""
    return message.replace("cgwatch guard: save and stop",
                           "cgwatch guard (observe): would save and stop", 1)
