"""Internal. The memory guard's policy: from one sample's numbers, *go on* or *save and stop*,
and which trigger said so. Pure (no I/O, no clock: times are passed in); table-tested in
tests/test_policy.py. The public object that samples and delivers is guard.py.

`decide()` stops when any of these holds, and names the first in this order:
1. RESERVE: a limited level's headroom, limit - (usage - inactive_file), is below the
   reserve (bytes, or a share of that level's limit) plus the room the job's largest rise
   needs (`rise`: the largest piece it took twice, one climb of the working set over
   checks in a row, the same size again; times a margin; `LargestRise`): the next piece
   of that size could not fit a save, or would be the kill.
2. OOM_KILL: the OOM killer killed a process on the path since the guard started, and the
   job lives on (a pool that replaces its workers, a helper process): the next victim may be
   the job itself. Not a torch DataLoader's worker: its death makes the main process raise at
   the next batch, before any check (docs/guard.md, "Workers"); RESERVE and FORECAST, which
   see every process of the cgroup, stop such a job before the kernel picks a worker.
3. FORECAST: a level's working set is predicted (forecast.py) to reach its limit sooner than
   `lead` seconds, the time a checkpoint takes times the guard's margin.
4. THROTTLE: a level over its v2 memory.high has been throttled for `throttle_seconds` in a
   row: PSI (memory.pressure) stall share at or over the threshold in every sample, or,
   where PSI cannot be read, the `high` counter rising in every sample. No kill comes, but
   such a job can crawl for hours.

A job that stops because of the guard exits with EXIT_STATUS, 75 (EX_TEMPFAIL in
sysexits.h: "a temporary failure; the user is invited to retry"): it saved and can resume,
which neither 0 (done), 1 (failed) nor 137 (killed) says, and schedulers can requeue on it
(Slurm's RequeueExit=75, a Kubernetes podFailurePolicy onExitCodes rule).
"""

from __future__ import annotations

from .frozen import Frozen, fill
from .units import human_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Optional

    from .forecast import Trend

OK = ""
RESERVE = "reserve"
OOM_KILL = "oom_kill"
FORECAST = "forecast"
THROTTLE = "throttle"
TRIGGERS = (RESERVE, OOM_KILL, FORECAST, THROTTLE)

EXIT_STATUS = 75  # EX_TEMPFAIL: saved, stopped, may be resumed (module docstring)
MIN_SAVE_SECONDS = 1.0  # the least a save is assumed to take: two samples at the 0.5 s clock


class Reading(Frozen):
    """One limited level at one sample: its limit and headroom (bytes), the working set's
    trend, its v2 memory.high (None: none), and for how long (seconds) it has been
    throttled above it without a break (0.0: not now)."""

    __slots__ = ("cgroup_path", "limit", "headroom", "trend", "high", "throttled_for",
                 "pressure")
    _fields = __slots__
    cgroup_path: str
    limit: Optional[int]
    headroom: Optional[int]
    trend: Trend
    high: Optional[int]
    throttled_for: float
    pressure: Optional[float]  # PSI stall share (0..1) over the last sample, None: unread

    def __init__(self, cgroup_path: str, limit: Optional[int], headroom: Optional[int],
                 trend: Trend, high: Optional[int] = None, throttled_for: float = 0.0,
                 pressure: Optional[float] = None) -> None:
        fill(self, locals())


class Verdict(Frozen):
    """The guard's decision: `stop` (save and stop) and its `trigger` (OK, RESERVE, OOM_KILL,
    FORECAST, THROTTLE), the `level` (cgroup path) it is about, and the figures behind it.
    `rank`: set when ranks agreed (ranks.py) and another rank's guard decided; that rank's
    verdict holds the figures. `message()` is the line to print; `as_dict()` the fields for
    JSON."""

    __slots__ = ("stop", "trigger", "level", "limit", "headroom", "reserve", "growth",
                 "seconds_left", "lead", "pressure", "throttled_for", "killed", "step", "rank",
                 "rise", "peak", "rate", "save_seconds", "margin", "check_gap")
    _fields = __slots__
    stop: bool
    trigger: str
    level: str
    limit: Optional[int]
    headroom: Optional[int]
    reserve: Optional[int]  # bytes, at this level
    growth: float  # bytes per second of the working set (0.0: none seen; forecast.py)
    seconds_left: Optional[float]  # until the limit at that growth (None: no growth)
    lead: float  # seconds a save needs (checkpoint time x margin)
    pressure: Optional[float]  # PSI stall share over the last sample
    throttled_for: float
    killed: int  # OOM kills counted on the path since the guard started
    step: Optional[int]
    rank: Optional[int]  # the deciding rank, when not this process (ranks agreed)
    rise: int  # bytes of `reserve` kept for the job's largest rise (its margin included)
    # The figures `seconds_left` and `lead` were worked out from (None: not known, a verdict
    # made by hand): seconds_left = (limit - peak) / rate, and
    # lead = save_seconds x margin + check_gap.
    peak: Optional[int]  # the working set's peak the forecast starts from (forecast.Trend)
    rate: float  # bytes/s: the growth of the time scale whose answer is seconds_left
    save_seconds: Optional[float]  # what a save takes (policy.save_seconds)
    margin: Optional[float]
    check_gap: Optional[float]  # seconds: the longest between two checks, lately

    def __init__(self, stop: bool, trigger: str, level: str = "",
                 limit: Optional[int] = None, headroom: Optional[int] = None,
                 reserve: Optional[int] = None, growth: float = 0.0,
                 seconds_left: Optional[float] = None, lead: float = 0.0,
                 pressure: Optional[float] = None, throttled_for: float = 0.0,
                 killed: int = 0, step: Optional[int] = None,
                 rank: Optional[int] = None, rise: int = 0, peak: Optional[int] = None,
                 rate: float = 0.0, save_seconds: Optional[float] = None,
                 margin: Optional[float] = None, check_gap: Optional[float] = None) -> None:
        fill(self, locals())

    def __bool__(self) -> bool:
        """True when the job should save and stop (`if guard.check(step): ...`)."""
        return self.stop

    def key(self) -> tuple[Any, ...]:
        """What makes a change worth one log record and one callback: the decision and where,
        not the figures that move every sample."""
        return (self.stop, self.trigger, self.level)

    def message(self) -> str:
        """One line naming the trigger, the level and the figures the decision used, so that
        a reader's arithmetic with them gives the line's time: RESERVE's reserve is the sum
        of its parts; FORECAST's seconds are (limit - peak) / rate (said as the headroom over
        the growth when those are the figures), its lead a save's seconds x margin plus the
        gap between checks (tests/test_decision.py parses them back)."""
        where = f"cgroup {self.level}" if self.level else "the job"
        at = f" at step {self.step}" if self.step is not None else ""
        room = (f"headroom {human_bytes(self.headroom)} of {human_bytes(self.limit)}"
                if self.headroom is not None else "")
        if self.rank is not None and self.stop:
            return (f"cgwatch guard: save and stop{at}: rank {self.rank}'s guard decided "
                    f"({self.trigger}; that rank's message gives the level and figures)")
        if self.trigger == RESERVE:
            why = f"{room}, below the reserve of {human_bytes(self.reserve)}"
            if self.rise and self.reserve is not None:
                why += (f" ({human_bytes(self.reserve - self.rise)}, plus room for the job's "
                        f"largest rise, {human_bytes(self.rise)})")
        elif self.trigger == OOM_KILL:
            why = f"the OOM killer killed {self.killed} process(es) on the path"
        elif self.trigger == FORECAST:
            # "within the lead", not "a save needs": the lead is a save's time times the
            # margin (or the configured guess), and "in ~51 s; a save needs ~90 s" read as
            # a stop that came too late.
            why = (f"predicted to reach its limit in ~{_seconds(self.seconds_left)} "
                   f"({self._forecast_figures(room)}), "
                   f"within the guard's lead of ~{_seconds(self.lead)}{self._lead_figures()}")
        elif self.trigger == THROTTLE:
            share = f"{self.pressure * 100:.0f}% stalled" if self.pressure is not None \
                else "memory.high exceeded"
            why = f"throttled above memory.high for {_seconds(self.throttled_for)} ({share})"
        else:
            return f"cgwatch guard: memory is fine{at}"
        return f"cgwatch guard: save and stop{at}: {where}: {why}"


    def _forecast_figures(self, room: str) -> str:
        """The figures of a forecast: the headroom and the growth when they are the ones
        used (the peak is the working set now, the rate the growth shown), else the distance
        from the peak to the limit and the rate of the scale that answered."""
        peak, limit = self.peak, self.limit
        if peak is None or limit is None or (limit - peak == self.headroom
                                             and self.rate == self.growth):
            return f"working set growing {human_bytes(int(self.growth))}/s, {room}"
        return (f"{human_bytes(limit - peak)} from the working set's recent peak, "
                f"{human_bytes(peak)}, to the limit of {human_bytes(limit)}, at "
                f"{human_bytes(int(self.rate))}/s; headroom now {human_bytes(self.headroom)}")

    def _lead_figures(self) -> str:
        """The lead's parts, when known: a save's seconds x margin + the check gap."""
        if self.save_seconds is None or self.margin is None or self.check_gap is None:
            return ""
        return (f" (a save's {self.save_seconds:.1f} s x {self.margin:g} + "
                f"{self.check_gap:.1f} s between checks)")


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


_UNKNOWN = (None, None, None)  # decide()'s lead_from when not given: a verdict by hand


def reserve_bytes(limit: int, reserve: int, share: Optional[float]) -> int:
    """The reserve at a level: `share` of its limit when given, else `reserve` bytes."""
    return int(limit * share) if share is not None else reserve


def floor(limit: int, reserve: int, share: Optional[float], rise: int) -> int:
    """The headroom a level must keep, the one formula of the reserve: `reserve_bytes` plus
    `rise`, the room kept for the job's largest rise (its margin included)."""
    return reserve_bytes(limit, reserve, share) + rise


def decide(readings: Sequence[Reading], *, reserve: int = 0, share: Optional[float] = None,
           lead: float, throttle_seconds: float, killed: int = 0,
           step: Optional[int] = None, rise: int = 0,
           lead_from: tuple[Optional[float], Optional[float], Optional[float]] = _UNKNOWN,
           trusted: bool = False) -> Verdict:
    """Save and stop, or go on (module docstring). `reserve` bytes or `share` of each level's
    limit, plus `rise` bytes (the job's largest rise times a margin); `lead` seconds (a
    checkpoint's time x margin); `killed`: OOM kills on the path since the guard started;
    `lead_from`: (a save's seconds, margin, check gap) the lead was worked out from, for
    the verdict's message (decision.py gives them); `trusted`: the job is no deeper than a
    depth it came back from (LargestRise.came_back): no forecast then."""
    for r in readings:
        if r.limit is not None and r.headroom is not None:
            kept = floor(r.limit, reserve, share, rise)
            if r.headroom < kept:
                return _about(r, RESERVE, kept, lead, killed, step, lead_from, rise)
    if killed:
        tight = min(readings, key=lambda r: r.headroom if r.headroom is not None else 1 << 62,
                    default=None)
        if tight is None:
            return Verdict(True, OOM_KILL, lead=lead, killed=killed, step=step,
                           save_seconds=lead_from[0], margin=lead_from[1],
                           check_gap=lead_from[2])
        return _about(tight, OOM_KILL, None, lead, killed, step, lead_from)
    soonest: Optional[tuple[float, Reading]] = None
    for r in readings if not trusted else ():
        left = r.trend.seconds_left(r.limit)
        if left is not None and left < lead and (soonest is None or left < soonest[0]):
            soonest = (left, r)
    if soonest is not None:
        return _about(soonest[1], FORECAST, None, lead, killed, step, lead_from)
    for r in readings:
        if r.high is not None and r.throttled_for >= throttle_seconds > 0:
            return _about(r, THROTTLE, None, lead, killed, step, lead_from)
    return Verdict(False, OK, lead=lead, killed=killed, step=step, save_seconds=lead_from[0],
                   margin=lead_from[1], check_gap=lead_from[2])


def _about(r: Reading, trigger: str, floor: Optional[int], lead: float, killed: int,
           step: Optional[int], lead_from: tuple[Optional[float], Optional[float],
                                                  Optional[float]], rise: int = 0) -> Verdict:
    trend = r.trend
    reach = trend.reach(r.limit)
    left, rate = (None, 0.0) if reach is None else reach
    return Verdict(True, trigger, r.cgroup_path, r.limit, r.headroom, floor, trend.growth,
                   left, lead, r.pressure, r.throttled_for, killed, step, None, rise,
                   trend.peak if r.limit is not None and reach is not None else None, rate,
                   *lead_from)


def save_seconds(saves: Sequence[float], configured: Optional[float],
                 checkpoint_bytes: Optional[int], write_rate: int) -> float:
    """What a save takes, from the most real figure there is: the longest of the job's
    timed saves; else `configured` (the user's); else the checkpoint's size
    `checkpoint_bytes` (the user's, or an adapter's count of the model and optimizer) over
    the disk's `write_rate` (bytes/s); never under MIN_SAVE_SECONDS, and that floor when no
    size is known. Not the working set: it grows with batches, activations and caches, which
    no checkpoint holds, and a lead grown with it stopped healthy jobs near their limit
    (~117 s at 8 GiB); the reserve, a share of the limit, is what grows with the job (the
    simulated campaign, docs/design.md section 15)."""
    if saves:
        return max(saves)
    if configured is not None:
        return configured
    if checkpoint_bytes is None:
        return MIN_SAVE_SECONDS
    return max(MIN_SAVE_SECONDS, checkpoint_bytes / write_rate)


_NOISE = 1 << 20  # a fall of the headroom up to this between two checks: no piece
# A climb ends at a check that gives back more than the noise, or at one that does not fall
# this long (s) after the last that fell: a pause shorter than this inside one allocation (a
# step that allocated nothing, the job descheduled for a check) does not cut it in two.
_HOLD = 0.3
# A climb that has lasted `d` s ends only at a pause of at least d / 2 (at most _HOLD_MOST):
# a job descheduled for 0.02-1.5 s on a loaded 2-core machine pauses a long climb without
# ending it (LargestRise's docstring).
_HOLD_MOST = 2.0
_SAME = 8  # two pieces are the same piece when they differ by at most 1/_SAME of the larger
_KEPT = 32  # the pieces remembered to find a repeat among (bounded, whatever the run time)


class LargestRise:
    """The largest piece the job has taken twice. A *piece* is what the job takes in one
    climb: the fall of `available_memory()` over checks that fell (by more than 1 MiB of
    noise), known once a check gives back, or does not fall for `_HOLD` (0.3 s) after the
    last that fell, or for half as long as the climb has lasted, up to `_HOLD_MOST` (2 s)
    (a fall of the headroom is a rise of the working set; a step that allocated nothing
    inside one allocation is a pause, not its end). *Twice* is the same piece
    again: two pieces within 1/8 of each other in size; `largest` is the largest such
    repeat (the smaller of the pair). A job that allocates in pieces (stairs, a batch, a
    cache shard, an evaluation's buffers) takes the same allocation again, the same size up
    to what else it did meanwhile: the reserve must hold the next one and still leave the
    save its room.

    Why a climb and not one check's fall: a check's fall is the job's rate times the
    checking period, not a size the job takes (`cgwatch run --guard` checks every 0.1 s
    from its own thread: a start-up allocation at ~1 GB/s read as three or four falls of
    ~100 MiB, a "piece taken twice" inside one allocation, and the first evaluation spike
    after it was stopped: the campaign's healthy round, 2 stops); a climb is what the job
    took whatever the period, and with one check a step (`Guard.check` in the loop) it is
    that step's allocation, or the steps' in a row that each took more than the noise.
    Why a pause as long as half the climb: a job descheduled on a loaded machine pauses for
    0.02-1.5 s; with a fixed 0.3 s hold, a long climb (a warm-up, a sawtooth's 20 s ramp
    read by `run --guard`'s 0.1 s checks) paused twice fell into pieces of about one size,
    "a piece taken twice" that was no piece at all (issue 32's 8 GiB sawtooth to 90 %,
    stopped at its first peak by "the job's largest rise, 1023.9 MiB"; in the simulated
    campaign, 65 healthy jobs stopped by the reserve with such a rise, 36 with the relative
    hold up to 1 s, 27 with 2 s). A stair's flat is long against its climb and still ends it;
    at most 2 s, so that a framework's start-up climb of 10 s does not swallow the first
    stair after it (the simulation's stairs under `run --guard`, unbounded: 5 of 66 lost).
    Why the same size and not the second largest: two different pieces taken once each
    are no pattern (the imports and a model load, a model and a dataset, a start-up
    allocation and an evaluation's buffers: the second largest of those made a start-up's
    size the piece, and an evaluation spike was stopped at its top, 3 of 3 in the campaign);
    a repeated allocation has one size. A piece still being taken never counts: a climb
    that goes on is the forecast's.

    Only a guarded level's figure teaches it: `limit` is the limit of the level that bounded
    `available_memory()` at the last sample, None when none did (no limited level on the
    path yet, or the host's MemAvailable was lower). Else the host's swings (another job's
    sawtooth) or the drop from the host's figure to a cgroup's when the job enters its
    limited cgroup were learned as the job's pieces (the campaign's 0.2 s sawtooth, stopped
    by "reserve" with 90 % of its 512 MiB free: bench.campaign). Such a figure is skipped,
    not a reason to forget: the next guarded figure is compared with the last one.

    `room(available)`: the headroom the next piece needs. 0 while the job is within a piece
    of a depth it came back from (`turns`): a depth after which it gave back at least half
    the climb that reached it (the climb of the check that reached the least headroom, or
    of a later climb that stopped short of it: a sawtooth's later peaks), and at least half
    the largest piece. A sawtooth's peaks, a batch's, an evaluation's, which it has survived
    and left (half of the climb that reached it, not of the largest climb: a 60 % model load
    then a 20 % evaluation spike gives back 20 %, and its depth is one it came back from);
    the whole piece once the job goes beyond that (stairs, a leak in pieces, which never
    give back; a jitter of a few MiB on a stair gives back less than half a stair). The
    price: a job that turned at a depth is trusted to that depth plus one piece."""

    def __init__(self) -> None:
        self.largest = 0  # the largest piece taken twice (the same size, within 1/_SAME)
        # the depths the job came back from: (headroom, how far it came back), the last _KEPT
        self.turns: list[tuple[int, int]] = []
        self._reached = 0  # the climb that reached the depth watched (`_low`)
        self._pieces: list[int] = []  # the last _KEPT pieces, oldest first
        self._climb = 0  # the fall of the piece still being taken (checks falling in a row)
        self._climb_low = 0  # the least headroom of that climb
        self._fell_at = 0.0  # when a check last fell
        self._climb_began = 0.0  # when the climb's first check fell
        self._last: Optional[int] = None
        self._low: Optional[int] = None  # the least headroom since the job last gave back
        self._limit: Optional[int] = None

    def update(self, available: int, limit: Optional[int], now: float) -> int:
        """One check's `available_memory()`, the limit of the level that bounded it at the
        last sample (None: none did), and the check's time (s, any monotonic clock); the
        largest piece taken twice so far (bytes)."""
        if limit is None or available > limit:
            # Not a guarded level's figure: not looked at, and nothing known forgotten. The
            # guard's sample can find no level bounding the figure just because the job
            # freed between its two reads (a sawtooth's drop); forgetting the depth then lost
            # the turn at that very top (the campaign's Lightning sawtooth, 2 of 8 stopped).
            return self.largest
        if limit != self._limit:  # another level, or its limit changed: its depths are new
            self._limit, self._last, self._low, self.turns = limit, None, None, []
            self._climb = self._reached = 0
        last, self._last = self._last, available
        if last is not None:
            fall = last - available
            if fall > _NOISE:
                if not self._climb:  # the climb's first fall
                    self._climb_began, self._climb_low = now, available
                self._climb += fall  # a piece goes on while checks fall
                self._climb_low = min(self._climb_low, available)
                self._fell_at = now
            elif self._climb and (fall < -_NOISE or now - self._fell_at >= self._hold()):
                self._learn(self._climb)  # a give-back, or a pause long enough, ends it
                if self._low is not None and self._climb_low > self._low:
                    # A climb that stopped short of the depth watched: its own top is the
                    # depth to come back from (a sawtooth whose first peak, reached by the
                    # start-up and the first ramp as one climb, was its deepest, so that the
                    # ramps after it were never "half the climb" that reached that peak).
                    self._low, self._reached = self._climb_low, self._climb
                self._climb = 0
        if self.turns and available - self.turns[-1][0] > self.turns[-1][1]:
            self.turns[-1] = (self.turns[-1][0], available - self.turns[-1][0])  # further back
        if self._low is None or available < self._low:
            self._low = available
            if self._climb:  # the climb going on reached it; a drift within the noise
                self._reached = self._climb  # keeps the climb that reached the depth
        elif available - self._low >= max(self._reached // 2, _NOISE):
            self.turns.append((self._low, available - self._low))
            del self.turns[:-_KEPT]
            self._low = available
        return self.largest

    def _hold(self) -> float:
        """How long a check must not fall after the last that fell to end the climb: _HOLD,
        or half the time the climb has lasted, up to _HOLD_MOST (seconds)."""
        return max(_HOLD, min(_HOLD_MOST, (self._fell_at - self._climb_began) / 2))

    def _learn(self, piece: int) -> None:
        for other in self._pieces:
            small, big = min(piece, other), max(piece, other)
            if small * _SAME >= big * (_SAME - 1) and small > self.largest:
                self.largest = small
        self._pieces.append(piece)
        del self._pieces[:-_KEPT]

    def state_dict(self) -> dict[str, Any]:
        """What a restarted job keeps (JSON-able): the pieces and the largest taken twice.
        Not the depths: they are of this life's levels and headroom."""
        return {"largest": self.largest, "pieces": list(self._pieces)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start from `state_dict()`'s (values of the wrong type are skipped)."""
        largest = state.get("largest")
        if isinstance(largest, int) and not isinstance(largest, bool) and largest >= 0:
            self.largest = max(self.largest, largest)
        pieces = state.get("pieces")
        if isinstance(pieces, list):
            self._pieces = [p for p in pieces
                            if isinstance(p, int) and not isinstance(p, bool) and p > 0][-_KEPT:]

    def came_back(self, available: Optional[int]) -> bool:
        """Whether `available` is no deeper than a depth the job came back from (by at
        least half the climb that reached it)."""
        return available is not None and any(available >= depth for depth, _ in self.turns)

    def room(self, available: Optional[int]) -> int:
        """The headroom the next piece needs beyond the reserve (bytes): the largest piece,
        or 0 while `available` is within a piece of a depth the job came back from by at
        least half that piece (a jitter on a stair gives back a few MiB, never half a stair)."""
        if available is not None:
            for depth, back in self.turns:
                if 2 * back >= self.largest and available >= depth - self.largest:
                    return 0
        return self.largest


def stall_share(before: Optional[tuple[float, int]], after: tuple[float, int]) -> Optional[float]:
    """The share of wall time stalled between two PSI readings (time s, total= us), 0..1;
    None without a previous reading or with the clock not moved. A total that went down (a
    new cgroup at the same path) counts as no reading."""
    if before is None or after[0] <= before[0] or after[1] < before[1]:
        return None
    return min(1.0, (after[1] - before[1]) / 1e6 / (after[0] - before[0]))


class Throttling:
    """For how long each level has been throttled without a break: a sample counts as
    throttled when its stall share is at least `threshold`, or, with no share, when the
    `high` counter rose since the previous sample. Bounded: one entry per level seen in the
    last sample."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self._since: dict[str, float] = {}

    def update(self, now: float, path: str, share: Optional[float], high_rose: bool) -> float:
        throttled = share >= self.threshold if share is not None else high_rose
        if not throttled:
            self._since.pop(path, None)
            return 0.0
        return now - self._since.setdefault(path, now)

    def keep_only(self, paths: set[str]) -> None:
        for path in [p for p in self._since if p not in paths]:
            del self._since[path]
