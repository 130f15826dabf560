"""A memory guard: call `check(step)` every training step; it says when to save and stop,
before the kernel's OOM killer ends the job or memory.high throttling stalls it.

    with cgwatch.Guard(reserve="5%") as guard:  # a save's time: module docstring
        for step, batch in enumerate(loader):
            train(batch)
            verdict = guard.check(step)
            if verdict.stop:
                with guard.saving():          # times the save: later forecasts use it
                    save_checkpoint()
                guard.exit(verdict)           # its line on stderr, exit 75 (policy.py: why)

What it decides is policy.py (the triggers, their order, the exit status, what a save
takes, the largest rise); how it predicts is forecast.py, one forecast per level kept by
trends.py's `LevelTrends` (as for the `cgwatch` table, `watch` and the Prometheus gauges);
when it samples is sampling.py. This object samples and delivers, reading only through a
monitor's public API (`available_memory()`, `levels()`, `status`, and `layout()`'s kept
descriptors for a v2 level's `memory.pressure`) and the `Events` of that monitor (OOM kills
and v2 `high` rises on the path): it does no I/O of its own.

What a save takes (the lead is that times `margin`): the longest of the job's last saves
timed by `saving()` / `saved()`; before the first, `checkpoint_seconds` when given; else
`checkpoint_bytes` (given; or the framework adapters' count of the model's and optimizer's
state, `estimate_checkpoint()`; else the guarded level's working set, the most a checkpoint
can hold) over `write_rate` (default 100 MiB/s, an assumption: a local disk or a network
filesystem writes at least that), at least 1 s. A 1 GiB job is so given ~10 s x 1.5. The
lead also holds the longest time between two checks over the last 5 samples (`check_gap`):
a stop comes only at a check, and with one check a step a job of 3 s steps is next checked
3 s later (its leak meanwhile one piece of 3 s), so the forecast must stop it a step early.

Cost: a check between samples is one `time.monotonic()` and one `available_memory()`. A
sample (`levels()`: every file of every level, ~20-40 us per level here, then the forecast
and the policy) comes every `interval` seconds (0.5, at spread phases), or every
`near_interval` (0.05) while `available_memory()` is within the reserve plus the growth
expected before the next sample, and at once when it falls under the least reserve of any
level: a breach is never left waiting for the clock (sampling.py). bench/guard.py measures
both kinds of check.

Every change of the decision (stop or not, the trigger, the level) is one log record on the
"cgwatch" logger (a warning when it says stop) and one call of each `subscribe()`d callback,
on the thread that called `check()`; never one per step. The stop line reaches stderr once:
with logging unconfigured, the record itself is written there (logging's last resort), and
`exit()` does not print that line again.

Distributed jobs: once torch.distributed is initialised (with 2 or more ranks), every
`sync_every`-th check is one all-reduce of one int64 across ranks (ranks.py), and every rank
gets the same answer at the same check: stop when any rank's guard says stop. Between those
checks the last agreed verdict stands, so a rank never stops alone (a collective checkpoint
would hang) and a stop comes at most `sync_every - 1` checks late. Every rank must call
`check()` once per step, as a collective; ~0.2 ms per all-reduce with gloo on two CPU ranks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional, Union

from . import names, policy, ranks, sampling, values
from .alerts import Threshold
from .frozen import replace
from .logs import reaches_last_resort
from .policy import EXIT_STATUS, LargestRise, Reading, Throttling, Verdict
from .trends import LevelTrends
from .wouldstop import Judged, Observer, summary_line, would_stop_line

if TYPE_CHECKING:
    from .events import Events
    from .monitor import Monitor
    from .ranks import Ranks

__all__ = ["GUARD_EXIT_STATUS", "Guard", "Verdict"]

GUARD_EXIT_STATUS = EXIT_STATUS
log = logging.getLogger("cgwatch")
_monotonic = time.monotonic
_KILLS = ("oom_kill", "oom_group_kill")
_SAVES_KEPT = 5  # the longest of the last few saves is the checkpoint time
_GAPS_KEPT = 5  # samples over which the longest time between two checks is kept in the lead


class Guard:
    """Decides *save and stop* for the job in this process's cgroup (policy.py).

    `monitor`: whose levels to guard (default: the process-wide one). `reserve`: headroom
    to keep at every limited level, bytes or a size ("512M") or a share of that level's
    limit ("5%"); `rise_margin`: on top of it, the largest piece the job took twice (one
    climb over checks in a row, the same size again) times this (0: none;
    policy.LargestRise). `checkpoint_seconds`: what a save takes until the job reports its
    own (`saving()`, `saved()`); None: `checkpoint_bytes` (bytes or a size; None: an
    adapter's estimate, `estimate_checkpoint()`, else the working set) over `write_rate`
    (bytes or a size per second), module docstring;
    `margin`: the forecast must leave that times the checkpoint time. `interval`: seconds
    between samples on average (spread +-`jitter` of it); `near_interval`: between samples
    while `available_memory()` is within the reserve plus the growth expected meanwhile.
    `pressure`: the PSI line ("full" or "some") and `pressure_threshold` its stall share
    that counts as throttled, for `throttle_seconds` in a row (0: never stop for
    throttling). `events`: an `Events` of the same monitor to learn OOM kills and `high`
    rises from, True to make one (closed with the guard), False for none. `bucket`, `span`,
    `window`: the forecast's (forecast.py: 1 s buckets, the peak of the last 12, 24 kept
    per time scale). `sync_every`: checks between two agreements
    of all ranks (module docstring; 0: never, each rank decides alone); `ranks`: the group
    to agree in (anything with `rank` and a collective `max(int) -> int`; default
    torch.distributed's default group, once initialised). `observe`: decide everything,
    do nothing: `check()` answers *go on* where it would say stop, a would-be stop is logged
    once ("would save and stop"), and `would_stops()` judges each by what followed
    (wouldstop.py; docs/guard.md, "Check it before you let it act").
    """

    def __init__(self, monitor: Optional[Monitor] = None, *,
                 reserve: Union[int, str, Threshold] = "5%", rise_margin: float = 1.25,
                 checkpoint_seconds: Optional[float] = None,
                 checkpoint_bytes: Union[int, str, None] = None,
                 write_rate: Union[int, str] = "100M", margin: float = 1.5,
                 interval: float = 0.5, jitter: float = 0.5, near_interval: float = 0.05,
                 pressure: str = "full", pressure_threshold: float = 0.10,
                 throttle_seconds: float = 30.0, events: Union[bool, Events] = True,
                 bucket: float = 1.0, span: int = 12, window: int = 24, sync_every: int = 10,
                 ranks: Optional[Ranks] = None, observe: bool = False) -> None:
        if monitor is None:
            from .default import default_monitor

            monitor = default_monitor()
        if pressure not in ("some", "full"):
            raise ValueError(f"pressure must be 'some' or 'full', not {pressure!r}")
        rate = _size(write_rate)
        size = None if checkpoint_bytes is None else _size(checkpoint_bytes)
        if (checkpoint_seconds is not None and checkpoint_seconds < 0) or margin < 1 \
                or interval < 0 or near_interval < 0 or not 0 <= jitter < 1 \
                or throttle_seconds < 0 or sync_every < 0 or rise_margin < 0 or rate <= 0 \
                or (size is not None and size < 0):
            raise ValueError("guard: checkpoint_seconds >= 0, margin >= 1, intervals >= 0, "
                             "0 <= jitter < 1, throttle_seconds >= 0, sync_every >= 0, "
                             "rise_margin >= 0, write_rate > 0, checkpoint_bytes >= 0")
        threshold = reserve if isinstance(reserve, Threshold) else (
            Threshold(bytes=reserve) if isinstance(reserve, int) else Threshold.parse(reserve))
        self.monitor = monitor
        self.reserve = threshold
        self.margin = margin
        self.rise_margin = rise_margin
        self.interval = interval
        self.jitter = jitter
        self.near_interval = near_interval
        self.write_rate = rate
        self.checkpoint_bytes = size
        self.pressure = pressure
        self.throttle_seconds = throttle_seconds
        self._configured_checkpoint = None if checkpoint_seconds is None \
            else float(checkpoint_seconds)
        # The user said what a save takes (its time or its size): no estimate replaces it.
        self._checkpoint_given = checkpoint_seconds is not None or size is not None
        self._saves: deque[float] = deque(maxlen=_SAVES_KEPT)
        self._last_check: Optional[float] = None  # when check() last ran (monotonic)
        self._gap_now = 0.0  # the longest time between two checks since the last sample
        self._gaps: deque[float] = deque(maxlen=_GAPS_KEPT)  # that, at the last samples
        self._working_set = 0  # the guarded level's at the last sample (a save's estimate)
        self._rise = LargestRise()
        self._bound: Optional[int] = None  # the limit of the level that bounded the last sample
        # The working-set forecast of each guarded level (trends.py, one owner of per-level
        # forecasts); refuses a bad shape here, not at the first sample.
        self._trends = LevelTrends(bucket=bucket, span=span, window=window)
        self._throttling = Throttling(pressure_threshold)
        self._psi: dict[str, tuple[float, int]] = {}  # path -> (time, total= us)
        self._high_seen: dict[str, int] = {}  # path -> `high` rises counted at the last sample
        self._high_rises: dict[str, int] = {}  # path -> `high` rises (Events thread writes)
        self._killed = 0  # OOM kills on the path (Events thread writes, checks read)
        self._callbacks: list[Callable[[Verdict], None]] = []
        self._on_stderr = ""  # the stop line logging's last resort wrote on stderr (exit())
        self._lock = threading.Lock()  # one sample at a time; never held while calling out
        self._plan = sampling.FIRST  # when the next sample comes (sampling.py)
        self._samples = 0  # samples taken: the next one's phase
        self._verdict = Verdict(False, policy.OK, lead=self.lead)
        self.sync_every = sync_every
        self._ranks = ranks
        self._calls = 0  # checks since the ranks were found: every sync_every-th agrees
        self._agreed = self._verdict  # what the ranks last agreed on
        self._events: Optional[Events] = None
        self._own_events = False
        if events is True:
            from .events import Events

            self._events = Events(monitor, log=False, queue_size=0)
            self._own_events = True
        elif events is not False:
            self._events = events
        if self._events is not None:
            self._events.subscribe(self._on_event)
        self._observer: Optional[Observer] = None
        if observe:
            self._observer = Observer()
            # In place of the method on this instance only: an acting guard's check() pays
            # nothing for observe mode, not even a test.
            self.check = self._observed_check  # type: ignore[method-assign]

    # ---- the per-step call --------------------------------------------------------------------

    def check(self, step: Optional[int] = None) -> Verdict:
        """The decision now (never raises). Cheap between samples: see the module docstring.
        In a distributed job, the decision all ranks agreed on (module docstring)."""
        verdict = self._decide(step)
        if not self.sync_every:
            return verdict
        group = self._ranks
        if group is None:
            # Looked up at every check until found (a sys.modules lookup without torch): a
            # group initialised after the guard was made is used from its first check on.
            group = self._ranks = ranks.torch_ranks()
            if group is None:
                return verdict
            self._calls = 0
        self._calls += 1
        if (self._calls - 1) % self.sync_every:
            return self._agreed
        return self._agree(group, verdict, step)

    def _observed_check(self, step: Optional[int] = None) -> Verdict:
        """check() in observe mode: the decision kept as a would-be stop, *go on* answered."""
        verdict = Guard.check(self, step)
        assert self._observer is not None
        return self._observer.seen(self._last_check or 0.0, verdict, self._killed)

    @property
    def observe(self) -> bool:
        """Whether this guard only observes (its `observe` argument)."""
        return self._observer is not None

    def would_stops(self, ended: Optional[float] = None,
                    killed_at: Optional[float] = None) -> list[Judged]:
        """Observe mode: each would-be stop so far, judged (wouldstop.judge) from the OOM
        kills counted on the path, `ended` (when the job ended, on time.monotonic()'s clock;
        None: it runs on) and `killed_at` (when the job itself was OOM-killed, which only
        whoever waited for it knows: `cgwatch run`). [] for a guard that acts."""
        if self._observer is None:
            return []
        return self._observer.judged(ended, killed_at)

    def _agree(self, group: Ranks, verdict: Verdict, step: Optional[int]) -> Verdict:
        try:
            rank = group.rank
            agreed = ranks.decode(group.max(ranks.encode(verdict.stop, verdict.trigger, rank)))
        except Exception as e:  # noqa: BLE001 - a peer gone: its socket is closed, decide alone
            log.warning("cgwatch guard: the all-reduce across ranks failed (%r); this rank "
                        "decides alone from now on", e)
            self.sync_every = 0
            return verdict
        previous = self._agreed
        if agreed is None:
            self._agreed = verdict  # no rank, this one included, said stop
        elif verdict.stop and agreed[0] == verdict.trigger:
            # Ours says it all (another rank may have said the same), at the step all act.
            self._agreed = verdict if verdict.step == step else replace(verdict, step=step)
        else:
            self._agreed = Verdict(True, agreed[0], lead=verdict.lead, step=step,
                                   rank=agreed[1])
        if self._agreed.rank is not None and self._agreed.key() != previous.key():
            self._announce(self._agreed)
        return self._agreed

    def exit(self, verdict: Optional[Verdict] = None) -> NoReturn:
        """End the job after its save: print `verdict.message()` (default: the last one
        `check()` decided) to stderr and raise SystemExit(GUARD_EXIT_STATUS). Not printed
        again when the stop's log record already wrote that very line there (logging
        unconfigured: its last-resort handler writes the message alone)."""
        import sys

        line = (verdict if verdict is not None else self._agreed_or_local()).message()
        if line != self._on_stderr:
            print(line, file=sys.stderr, flush=True)
        raise SystemExit(GUARD_EXIT_STATUS)

    def _agreed_or_local(self) -> Verdict:
        return self._agreed if self._ranks is not None else self._verdict

    def _decide(self, step: Optional[int]) -> Verdict:
        now = _monotonic()
        if self._last_check is not None and now - self._last_check > self._gap_now:
            self._gap_now = now - self._last_check
        self._last_check = now
        available: Optional[int] = None
        try:
            available = self.monitor.available_memory()
            self._rise.update(available, self._bound, now)
            if not sampling.due(self._plan, now, available, near_interval=self.near_interval,
                                stopped=self._verdict.stop, killed=self._killed):
                return self._verdict  # its `step` is the one of the check that decided it
            return self._sample(now, step, available)
        except Exception as e:  # noqa: BLE001 - a check must answer; the last verdict stands
            log.warning("cgwatch guard: sampling failed (%r); keeping the last decision", e)
            self._plan = replace(self._plan, due=now + max(self.interval, 1.0), near=-1,
                                 killed=self._killed)
            return self._verdict

    @property
    def verdict(self) -> Verdict:
        """The decision of the last sample."""
        return self._verdict

    def subscribe(self, callback: Callable[[Verdict], None]) -> None:
        """Call `callback(verdict)` once per change of the decision (stop or not, trigger,
        level), on the thread that called check()."""
        self._callbacks = [*self._callbacks, callback]

    def unsubscribe(self, callback: Callable[[Verdict], None]) -> None:
        self._callbacks = [c for c in self._callbacks if c != callback]

    # ---- what a save takes --------------------------------------------------------------------

    @contextmanager
    def saving(self) -> Iterator[None]:
        """Time a checkpoint save; forecasts then allow for the longest of the last few."""
        start = _monotonic()
        try:
            yield
        finally:
            self.saved(_monotonic() - start)

    def saved(self, seconds: float) -> None:
        """Report a save that took `seconds`."""
        if seconds >= 0:
            self._saves.append(float(seconds))

    def estimate_checkpoint(self, nbytes: int) -> bool:
        """Take `nbytes` as a checkpoint's size, an estimate (the framework adapters count
        the model's and the optimizer's state: integrations/_guarded.py), unless the user
        gave `checkpoint_seconds` or `checkpoint_bytes`; True when taken. Until then the
        size is the guarded level's working set, the most a checkpoint can hold; a save
        timed later (`saving()`, `saved()`) wins over either (policy.save_seconds)."""
        if nbytes < 0:
            raise ValueError(f"guard: a checkpoint's size is >= 0 bytes, not {nbytes}")
        if self._checkpoint_given:
            return False
        self.checkpoint_bytes = int(nbytes)
        return True

    @property
    def checkpoint_seconds(self) -> float:
        """What a save takes: the longest of the last saves reported, else the configured,
        else the estimate from the last sample's working set (module docstring)."""
        return policy.save_seconds(self._saves, self._configured_checkpoint,
                                   self.checkpoint_bytes, self._working_set, self.write_rate)

    @property
    def check_gap(self) -> float:
        """The longest time between two checks over the last few samples (seconds): a stop
        comes only at a check, so the forecast must leave that too (module docstring)."""
        return max(self._gaps, default=0.0)

    @property
    def lead(self) -> float:
        """Seconds the forecast must leave: checkpoint_seconds x margin, plus the time the
        next check may be away (`check_gap`)."""
        return self.checkpoint_seconds * self.margin + self.check_gap

    @property
    def rise(self) -> int:
        """The largest piece the job took twice so far (bytes; policy.LargestRise)."""
        return self._rise.largest

    # ---- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Detach from the events (closing them if the guard made them). In observe mode,
        one INFO record: the would-be stops, judged with the job ended now."""
        if self._observer is not None:
            log.info("%s", summary_line(self.would_stops(ended=_monotonic())))
        events = self._events
        if events is not None:
            events.unsubscribe(self._on_event)
            if self._own_events:
                events.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- sampling ------------------------------------------------------------------------------

    def _on_event(self, item: Any) -> None:
        counter = getattr(item, "counter", None)
        if counter is None or getattr(item, "propagated", False):
            return  # a headroom alert, or a v2 repeat of a rise already seen below
        if counter in _KILLS:
            self._killed += item.new - item.old
        elif counter == "high":
            path = item.cgroup_path
            self._high_rises[path] = self._high_rises.get(path, 0) + item.new - item.old

    def _sample(self, now: float, step: Optional[int], available: Optional[int]) -> Verdict:
        with self._lock:
            killed = self._killed
            readings = self._read(now)
            limited = [r for r in readings if r.limit is not None and r.headroom is not None]
            bound, self._bound = self._bound, None
            if limited:  # the tightest level's working set: what a save may have to write
                tight = min(limited, key=lambda r: r.headroom or 0)
                self._working_set = max(0, (tight.limit or 0) - (tight.headroom or 0))
                self._bound = bound_limit(available, tight)
            if available is not None and self._bound != bound:
                # The level just found teaches from this check on. Only then: this check's
                # figure fed again under the same level is a check that did not fall.
                self._rise.update(available, self._bound, now)
            self._gaps.append(self._gap_now)
            self._gap_now = 0.0
            lead = self.lead
            share = self.reserve.fraction
            rise = int(self._rise.room(available) * self.rise_margin)
            verdict = policy.decide(readings, reserve=self.reserve.bytes or 0, share=share,
                                    lead=lead, throttle_seconds=self.throttle_seconds,
                                    killed=killed, step=step, rise=rise)
            floors = [policy.reserve_bytes(r.limit, self.reserve.bytes or 0, share) + rise
                      for r in readings if r.limit is not None]
            self._plan = sampling.plan(
                now, interval=self.interval, jitter=self.jitter, k=self._samples,
                floors=floors, growth=max([r.trend.growth for r in readings], default=0.0),
                lead=lead, available=available, stopped=verdict.stop, killed=killed)
            self._samples += 1
            previous, self._verdict = self._verdict, verdict
        if verdict.key() != previous.key():
            self._announce(verdict)
        return verdict

    def _read(self, now: float) -> list[Reading]:
        version: Optional[int] = None  # read only for a level with memory.high (v2's)
        kept: Optional[dict[str, Any]] = None  # layout()'s levels by path, when PSI is read
        readings = []
        levels = self.monitor.levels()
        # The levels with a limit or memory.high and a read working set (trends.forecastable),
        # each with its trend; a level no longer on the path is forgotten there.
        trends = self._trends.add(now, levels)
        for lvl in levels:
            path = lvl.cgroup_path
            trend = trends.get(path)
            if trend is None:
                continue
            throttled_for, share = 0.0, None
            if lvl.high is not None:
                if version is None:
                    version = self.monitor.status.version
                share = None
                if version == 2:
                    if kept is None:
                        kept = {k.cgroup_path: k for k in self.monitor.layout().levels}
                    share = self._stall_share(now, path, kept.get(path))
                rises = self._high_rises.get(path, 0)
                high_rose = rises > self._high_seen.get(path, 0)
                self._high_seen[path] = rises
                throttled_for = self._throttling.update(now, path, share, high_rose)
            readings.append(Reading(path, lvl.limit, lvl.headroom, trend, lvl.high,
                                    throttled_for, share))
        for gone in [p for p in self._psi if p not in trends]:
            del self._psi[gone]  # a level no longer on the path: its PSI reading too
        for gone in [p for p in self._high_seen if p not in trends]:
            del self._high_seen[gone]
        self._throttling.keep_only(set(trends))
        return readings

    def _stall_share(self, now: float, path: str, level: Any) -> Optional[float]:
        """The PSI stall share of one v2 level since the previous sample (None: first
        reading, PSI off or unreadable: the `high` counter decides then). Read through the
        level's kept descriptor (`layout()`, as prometheus.py reads it): no open per sample."""
        try:
            if level is None:
                raise FileNotFoundError(path)  # a level that left the layout meanwhile
            total = values.parse_pressure(level.read(names.PRESSURE)).get(self.pressure)
        except (OSError, ValueError):
            # EOPNOTSUPP with PSI off (psi=0 on the kernel's command line), ENOENT before 4.20
            total = None
        if total is None:  # unreadable, or no line of this kind
            self._psi.pop(path, None)
            return None
        reading = (now, total)
        before = self._psi.get(path)
        self._psi[path] = reading
        return policy.stall_share(before, reading)

    def _announce(self, verdict: Verdict) -> None:
        if verdict.stop:
            line = verdict.message()
            if self._observer is not None:
                line = would_stop_line(line)
            log.warning("%s", line)
            if reaches_last_resort(log, logging.WARNING):
                self._on_stderr = line  # written to stderr as it is: exit() need not again
        else:
            log.info("%s", verdict.message())
        for callback in self._callbacks:
            try:
                callback(verdict)
            except Exception:  # noqa: BLE001 - a callback must not stop the training loop
                log.exception("cgwatch guard: callback %r failed", callback)


def _size(value: Union[int, str]) -> int:
    """Bytes from an int or a size ("100M"), as `reserve` takes them (alerts.Threshold)."""
    if isinstance(value, int):
        return value
    parsed = Threshold.parse(value)
    if parsed.bytes is None:
        raise ValueError(f"guard: a size in bytes, not a share: {value!r}")
    return parsed.bytes


def bound_limit(available: Optional[int], tight: Reading) -> Optional[int]:
    """The limit of `tight`, the limited level with the least headroom at a sample, when it
    is what bounded `available_memory()` read at that check (within 1/32 of its headroom or
    4 MiB: the two reads are microseconds apart); None when the host's MemAvailable was
    lower (the host is not guarded, and its swings are other processes')."""
    if available is None or tight.limit is None or tight.headroom is None:
        return None
    slack = max(4 << 20, tight.headroom // 32)
    return tight.limit if available >= tight.headroom - slack else None

