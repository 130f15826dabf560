"""Internal. The memory guard's whole decision, as one pure object: fed the time and what a
check read, it answers *go on* or *save and stop*. No I/O, no clock, no logging, no thread:
guard.py reads (through the monitor and its Events), agrees across ranks and delivers;
`Decision` decides. Table-tested in tests/test_decision.py, rows of (time, readings) ->
verdict.

A check at time `now` gives `due(now, available, killed)`: `available` is
`available_memory()` then, `killed` the OOM kills counted on the path since the guard began.
It notes the time since the last check (the check gap) and feeds `available` to the largest
rise (policy.LargestRise), then says whether this check samples (sampling.py: every
`interval` s at spread phases; every `near_interval` s while `available` is within the
reserve plus the growth expected meanwhile; at once under the least reserve or after a new
kill). A check that does not sample answers the last verdict. A sampling check hands
`sample()` one `LevelSample` per limited level (or level with memory.high), and the verdict
comes from these, in this order (policy.decide):

1. RESERVE: a level's headroom < reserve + rise, where reserve = `reserve` bytes or its
   share of that level's limit (5 % by default), and rise = the largest piece the job took
   twice x `rise_margin` (1.25), 0 while the job is within a piece of a depth it came back
   from (policy.LargestRise.room).
2. OOM_KILL: `killed` > 0.
3. FORECAST (not while `available` is no deeper than a depth the job came back from:
   policy.LargestRise.came_back): a level's working set reaches its limit in fewer seconds
   than the lead, where seconds = (limit - the peak of the last `span` buckets) / the
   growth of the scale that gives the soonest licensed answer (forecast.Trend.seconds_left),
   and lead = a save's seconds x `margin` (1.5) + the longest gap between two checks over
   the last 5 samples.
   A save's seconds: the longest of the last 5 timed (`saved()`), else `checkpoint_seconds`,
   else `checkpoint_bytes` (or an adapter's estimate) / `write_rate`, at least 1 s, and
   1 s when no size is known (policy.save_seconds: not the working set, design §15).
4. THROTTLE: a level over memory.high throttled without a break for `throttle_seconds`:
   its PSI stall share since the last sample >= `pressure_threshold` at every sample, or,
   with PSI unread, its `high` counter rising at every sample.

A stop stands until the next sample. `state_dict()` is what the job learned that a restart
should keep (timed saves, the checkpoint's estimated size, the pieces it took), in the
manner of Lightning's `EarlyStopping.state_dict`; the trends are of one life and not kept.
"""

from __future__ import annotations

from collections import deque

from . import policy, sampling
from .alerts import Threshold
from .frozen import Frozen, fill
from .policy import LargestRise, Reading, Throttling, Verdict
from .trends import LevelTrends

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Optional, Union

SAVES_KEPT = 5  # the longest of the last few saves is the checkpoint time
GAPS_KEPT = 5  # samples over which the longest time between two checks is kept in the lead
STATE_VERSION = 1  # state_dict()'s "version"; load_state_dict reads any, keys it knows


class LevelSample(Frozen):
    """One limited level (or one with memory.high) as one sample read it: the decision's
    input, a record's row. Sizes in bytes: its `limit`, `headroom` (limit - working set,
    as `available_memory()` counts it), `working_set` (usage - inactive_file; None: unread,
    the level is skipped), `high` (v2 memory.high, None: none), `pressure_total` (the
    `total=` microseconds of the chosen PSI line of its memory.pressure; None: unread) and
    `high_rises` (the `high` counter's rises counted on this path since the guard began)."""

    __slots__ = _fields = ("cgroup_path", "limit", "headroom", "working_set", "high",
                           "pressure_total", "high_rises")
    cgroup_path: str
    limit: Optional[int]
    headroom: Optional[int]
    working_set: Optional[int]
    high: Optional[int]
    pressure_total: Optional[int]
    high_rises: int

    def __init__(self, cgroup_path: str, limit: Optional[int], headroom: Optional[int],
                 working_set: Optional[int], high: Optional[int] = None,
                 pressure_total: Optional[int] = None, high_rises: int = 0) -> None:
        fill(self, locals())


def parse_size(value: Union[int, str]) -> int:
    """Bytes from an int or a size ("100M"), as `reserve` takes them (alerts.Threshold)."""
    if isinstance(value, int):
        return value
    parsed = Threshold.parse(value)
    if parsed.bytes is None:
        raise ValueError(f"guard: a size in bytes, not a share: {value!r}")
    return parsed.bytes


class Decision:
    """The guard's decision (module docstring); the arguments mean what `cgwatch.Guard`'s
    do, and are refused (ValueError) as there."""

    def __init__(self, *, reserve: Union[int, str, Threshold] = "5%", rise_margin: float = 1.25,
                 checkpoint_seconds: Optional[float] = None,
                 checkpoint_bytes: Union[int, str, None] = None,
                 write_rate: Union[int, str] = "100M", margin: float = 1.5,
                 interval: float = 0.5, jitter: float = 0.5, near_interval: float = 0.05,
                 pressure_threshold: float = 0.10, throttle_seconds: float = 30.0,
                 bucket: float = 1.0, span: int = 12, window: int = 24,
                 save_delay: float = 0.0) -> None:
        rate = parse_size(write_rate)
        size = None if checkpoint_bytes is None else parse_size(checkpoint_bytes)
        if (checkpoint_seconds is not None and checkpoint_seconds < 0) or margin < 1 \
                or interval < 0 or near_interval < 0 or not 0 <= jitter < 1 \
                or throttle_seconds < 0 or rise_margin < 0 or rate <= 0 \
                or (size is not None and size < 0) or save_delay < 0:
            raise ValueError("guard: checkpoint_seconds >= 0, margin >= 1, intervals >= 0, "
                             "0 <= jitter < 1, throttle_seconds >= 0, "
                             "rise_margin >= 0, write_rate > 0, checkpoint_bytes >= 0, "
                             "save_delay >= 0")
        self.reserve = reserve if isinstance(reserve, Threshold) else (
            Threshold(bytes=reserve) if isinstance(reserve, int) else Threshold.parse(reserve))
        self.rise_margin, self.throttle_seconds = rise_margin, throttle_seconds
        self.interval, self.jitter, self.near_interval = interval, jitter, near_interval
        # what a save takes, until one is timed: checkpoint_bytes / write_rate x margin
        self.margin, self.write_rate, self.checkpoint_bytes = margin, rate, size
        self._configured = None if checkpoint_seconds is None else float(checkpoint_seconds)
        # A job that begins its save this long after the stop (HF's enable_jit_checkpoint
        # waits 3 s for its timer: cli/savedelay.py): part of every save's time, so the
        # margin covers it as it covers the save.
        self.save_delay = float(save_delay)
        # The user said what a save takes (its time or its size): no estimate replaces it.
        self._checkpoint_given = checkpoint_seconds is not None or size is not None
        self._saves: deque[float] = deque(maxlen=SAVES_KEPT)
        self._last_check: Optional[float] = None  # when the last check came
        self._gap_now = 0.0  # the longest time between two checks since the last sample
        self._gaps: deque[float] = deque(maxlen=GAPS_KEPT)  # that, at the last samples
        self._rise = LargestRise()
        self._bound: Optional[int] = None  # the limit of the level that bounded the last sample
        # One forecast per level (trends.py); refuses a bad shape here, not at the first sample.
        self._trends = LevelTrends(bucket=bucket, span=span, window=window)
        self._throttling = Throttling(pressure_threshold)
        self._psi: dict[str, tuple[float, int]] = {}  # path -> (time, total= us)
        self._high_seen: dict[str, int] = {}  # path -> `high` rises at the last sample
        self._plan = sampling.FIRST  # when the next sample comes (sampling.py)
        self._samples = 0  # samples taken: the next one's phase
        # The last sample's verdict: read it, never set it (an attribute, not a property: a
        # check between samples answers it, and a property's call is ~50 ns of its ~1 us).
        self.verdict = Verdict(False, policy.OK, lead=self.lead)

    # ---- a check ------------------------------------------------------------------------

    def due(self, now: float, available: Optional[int], killed: int) -> bool:
        """One check at `now` that read `available` (None: unread) with `killed` OOM kills
        counted: notes the gap since the last check, feeds the largest rise; True when this
        check samples (read the levels, then `sample()`)."""
        last = self._last_check  # self._note(now), inlined: this runs at every check
        if last is not None and now - last > self._gap_now:
            self._gap_now = now - last
        self._last_check = now
        if available is None:
            return killed != self._plan.killed or now >= self._plan.due
        self._rise.update(available, self._bound, now)
        return sampling.due(self._plan, now, available, near_interval=self.near_interval,
                            stopped=self.verdict.stop, killed=killed)

    def sampling_failed(self, now: float, killed: int) -> None:
        """The check at `now` could not read what it needed: the last verdict stands and the
        next sample waits (sampling.after_failure)."""
        self._note(now)
        self._plan = sampling.after_failure(self._plan, now, interval=self.interval,
                                            killed=killed)

    def sample(self, now: float, available: Optional[int], levels: Sequence[LevelSample],
               killed: int, step: Optional[int] = None) -> Verdict:
        """The verdict from one sample (module docstring): `levels` as read at the check that
        `due()` said samples, `available` and `killed` that check's."""
        readings = self._readings(now, levels)
        limited = [r for r in readings if r.limit is not None and r.headroom is not None]
        bound, self._bound = self._bound, None
        if limited:  # the tightest level: what bounds available_memory() (the rise learns)
            tight = min(limited, key=lambda r: r.headroom or 0)
            self._bound = bound_limit(available, tight)
        if available is not None and self._bound is not None and self._bound != bound:
            # due() fed this check's figure under the level the last sample found. This one
            # found another: the figure is taken under it. A new limit starts its depths here
            # and learns nothing yet; a figure due() skipped (no level bounded it) is learned
            # from now. Either way each check's figure is learned from once.
            self._rise.update(available, self._bound, now)
        self._gaps.append(self._gap_now)
        self._gap_now = 0.0
        save, gap = self.checkpoint_seconds, self.check_gap
        lead = save * self.margin + gap  # self.lead, its parts kept for the message
        reserve, share = self.reserve.bytes or 0, self.reserve.fraction
        rise = int(self._rise.room(available) * self.rise_margin)
        verdict = policy.decide(readings, reserve=reserve, share=share, lead=lead,
                                throttle_seconds=self.throttle_seconds, killed=killed,
                                step=step, rise=rise, lead_from=(save, self.margin, gap),
                                trusted=self._rise.came_back(available))
        floors = [policy.floor(r.limit, reserve, share, rise)
                  for r in readings if r.limit is not None]
        self._plan = sampling.plan(
            now, interval=self.interval, jitter=self.jitter, k=self._samples, floors=floors,
            growth=max([r.trend.growth for r in readings], default=0.0), lead=lead,
            available=available, stopped=verdict.stop, killed=killed)
        self._samples += 1
        self.verdict = verdict
        return verdict

    def _note(self, now: float) -> None:
        last = self._last_check
        if last is not None and now - last > self._gap_now:
            self._gap_now = now - last
        self._last_check = now

    def _readings(self, now: float, levels: Sequence[LevelSample]) -> list[Reading]:
        """Each level with a line (a limit or memory.high) and a working set, with its trend
        and how long it has been throttled; what is kept of a level that left is forgotten."""
        trends = self._trends.add_sizes(now, {
            s.cgroup_path: s.working_set for s in levels
            if s.working_set is not None and (s.limit is not None or s.high is not None)})
        readings = []
        for s in levels:
            path = s.cgroup_path
            trend = trends.get(path)
            if trend is None:
                continue
            throttled_for, share = 0.0, None
            if s.high is not None:
                share = self._stall_share(now, path, s.pressure_total)
                high_rose = s.high_rises > self._high_seen.get(path, 0)
                self._high_seen[path] = s.high_rises
                throttled_for = self._throttling.update(now, path, share, high_rose)
            readings.append(Reading(path, s.limit, s.headroom, trend, s.high, throttled_for,
                                    share))
        for gone in [p for p in self._psi if p not in trends]:
            del self._psi[gone]
        for gone in [p for p in self._high_seen if p not in trends]:
            del self._high_seen[gone]
        self._throttling.keep_only(set(trends))
        return readings

    def _stall_share(self, now: float, path: str, total: Optional[int]) -> Optional[float]:
        """The PSI stall share of one level since its previous reading (None: first reading,
        or unread: the `high` counter decides then)."""
        if total is None:
            self._psi.pop(path, None)
            return None
        reading = (now, total)
        before = self._psi.get(path)
        self._psi[path] = reading
        return policy.stall_share(before, reading)

    # ---- what it stands on ------------------------------------------------------------------

    def saved(self, seconds: float) -> None:
        """A save that took `seconds` (negative: ignored)."""
        if seconds >= 0:
            self._saves.append(float(seconds))

    def estimate_checkpoint(self, nbytes: int) -> bool:
        """Take `nbytes` as a checkpoint's size unless the user gave its time or size; True
        when taken (cgwatch.Guard.estimate_checkpoint)."""
        if nbytes < 0:
            raise ValueError(f"guard: a checkpoint's size is >= 0 bytes, not {nbytes}")
        if self._checkpoint_given:
            return False
        self.checkpoint_bytes = int(nbytes)
        return True

    @property
    def checkpoint_seconds(self) -> float:
        """What a save takes from the stop: `save_delay`, then the save (policy.save_seconds)."""
        return self.save_delay + policy.save_seconds(self._saves, self._configured,
                                                     self.checkpoint_bytes, self.write_rate)

    @property
    def check_gap(self) -> float:
        """The longest time between two checks over the last few samples (seconds)."""
        return max(self._gaps, default=0.0)

    @property
    def lead(self) -> float:
        """checkpoint_seconds x margin + check_gap (seconds)."""
        return self.checkpoint_seconds * self.margin + self.check_gap

    @property
    def rise(self) -> int:
        """The largest piece the job took twice so far (bytes; policy.LargestRise)."""
        return self._rise.largest

    def state_dict(self) -> dict[str, Any]:
        """What the job learned that its next life should start with (JSON-able): its timed
        saves, the checkpoint size an adapter estimated, the pieces it took."""
        return {"version": STATE_VERSION, "saves": list(self._saves),
                "checkpoint_estimate": None if self._checkpoint_given
                else self.checkpoint_bytes, "rise": self._rise.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Start from what `state_dict()` gave (of this version or another: keys missing or
        unknown, or of the wrong type, are skipped). The user's own figures stand."""
        saves = state.get("saves")
        if isinstance(saves, list):
            for seconds in saves:
                if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                    self.saved(float(seconds))
        estimate = state.get("checkpoint_estimate")
        if isinstance(estimate, int) and not isinstance(estimate, bool) and estimate >= 0:
            self.estimate_checkpoint(estimate)
        rise = state.get("rise")
        if isinstance(rise, dict):
            self._rise.load_state_dict(rise)


def bound_limit(available: Optional[int], tight: Reading) -> Optional[int]:
    """The limit of `tight`, the limited level with the least headroom at a sample, when it
    is what bounded `available_memory()` read at that check (within 1/32 of its headroom or
    4 MiB: the two reads are microseconds apart); None when the host's MemAvailable was
    lower (the host is not guarded, and its swings are other processes')."""
    if available is None or tight.limit is None or tight.headroom is None:
        return None
    slack = max(4 << 20, tight.headroom // 32)
    return tight.limit if available >= tight.headroom - slack else None
