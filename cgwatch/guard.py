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

Everything that decides (when to sample, the forecast, the largest rise, the reserve, the
lead, the verdict) is one pure object, decision.py's `Decision` (`guard.decision`), fed the
time and the figures read; its docstring says when a job is stopped. This object is the
shell around it: it reads only through a monitor's public API (`available_memory()`,
`levels()`, `status`, and `layout()`'s kept descriptors for a v2 level's `memory.pressure`)
and the `Events` of that monitor (OOM kills and v2 `high` rises on the path), agrees across
ranks, and delivers (log, callbacks, exit): it does no I/O of its own.

What a save takes (the lead is that times `margin`): the longest of the job's last saves
timed by `saving()` / `saved()`; before the first, `checkpoint_seconds` when given; else
`checkpoint_bytes` (given; or the framework adapters' count of the model's and optimizer's
state, `estimate_checkpoint()`) over `write_rate` (default 100 MiB/s, an assumption: a
local disk or a network filesystem writes at least that), at least 1 s; with no size known,
1 s, whatever the working set (no checkpoint holds the batches and caches; the reserve, 5 %
of the limit, is what grows with the job: docs/design.md section 15). The
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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional, Union

from . import names, values
from .alerts import Threshold
from .decision import Decision, LevelSample
from .logs import reaches_last_resort
from .policy import EXIT_STATUS, Verdict
from .ranks import Agreement
from .recordfile import DEFAULT_MAX_BYTES, end_record, recorded_decision
from .trends import forecastable, working_set
from .wouldstop import Judged, Observer, summary_line, would_stop_line

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .events import Events
    from .monitor import Monitor
    from .ranks import Ranks

__all__ = ["GUARD_EXIT_STATUS", "Guard", "Verdict"]

GUARD_EXIT_STATUS = EXIT_STATUS
log = logging.getLogger("cgwatch")
_monotonic = time.monotonic
_KILLS = ("oom_kill", "oom_group_kill")


class Guard:
    """Decides *save and stop* for the job in this process's cgroup (decision.py).

    `monitor`: whose levels to guard (default: the process-wide one). `reserve`: headroom
    to keep at every limited level, bytes or a size ("512M") or a share of that level's
    limit ("5%"); `rise_margin`: on top of it, the largest piece the job took twice (one
    climb over checks in a row, the same size again) times this (0: none;
    policy.LargestRise). `checkpoint_seconds`: what a save takes until the job reports its
    own (`saving()`, `saved()`); None: `checkpoint_bytes` (bytes or a size; None: an
    adapter's estimate, `estimate_checkpoint()`; else 1 s) over `write_rate`
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
    torch.distributed's default group, once initialised). `observe`: decide, do nothing
    (`would_stops()`); `record`: a file of the decision's inputs for `cgwatch replay`, at
    most `record_bytes` (docs/guard.md, "Check it before you let it act"). `save_delay`:
    seconds the job waits after the stop before its save begins (a trainer's own signal
    handler: HF's `enable_jit_checkpoint` waits 3 s), part of `checkpoint_seconds`.
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
                 ranks: Optional[Ranks] = None, observe: bool = False,
                 record: Optional[str] = None, record_bytes: int = DEFAULT_MAX_BYTES,
                 save_delay: float = 0.0) -> None:
        if monitor is None:
            from .default import default_monitor

            monitor = default_monitor()
        if pressure not in ("some", "full"):
            raise ValueError(f"pressure must be 'some' or 'full', not {pressure!r}")
        if sync_every < 0:
            raise ValueError("guard: sync_every >= 0")
        options: dict[str, Any] = dict(
            reserve=reserve, rise_margin=rise_margin, checkpoint_seconds=checkpoint_seconds,
            checkpoint_bytes=checkpoint_bytes, write_rate=write_rate, margin=margin,
            interval=interval, jitter=jitter, near_interval=near_interval,
            pressure_threshold=pressure_threshold, throttle_seconds=throttle_seconds,
            bucket=bucket, span=span, window=window, save_delay=save_delay)
        self._decision = Decision(**options) if record is None else \
            recorded_decision(record, options, observe, record_bytes)
        self.monitor = monitor
        self.pressure = pressure
        self._reader = LevelReader(monitor, pressure)
        self._callbacks: list[Callable[[Verdict], None]] = []
        self._on_stderr = ""  # the stop line logging's last resort wrote on stderr (exit())
        self._lock = threading.Lock()  # one sample at a time; never held while calling out
        self._agreement = Agreement(sync_every, ranks, self._decision.verdict, self._announce)
        self._events: Optional[Events] = None
        self._own_events = False
        if events is True:
            from .events import Events

            self._events = Events(monitor, log=False, queue_size=0)
            self._own_events = True
        elif events is not False:
            self._events = events
        if self._events is not None:
            self._events.subscribe(self._reader.on_event)
        self._observer = Observer() if observe else None
        if observe:  # on this instance only: an acting guard's check() pays nothing for it
            self.check = self._observed_check  # type: ignore[method-assign]

    # ---- the per-step call --------------------------------------------------------------------

    def check(self, step: Optional[int] = None) -> Verdict:
        """The decision now (never raises). Cheap between samples: see the module docstring.
        In a distributed job, the decision all ranks agreed on (module docstring)."""
        decision, reader = self._decision, self._reader
        now = _monotonic()
        killed = reader.killed
        try:
            available = self.monitor.available_memory()
            if not decision.due(now, available, killed):
                # the last sample's verdict: its `step` is the one of the check that decided it
                return self._agreement.at_check(decision.verdict, step)
            with self._lock:
                previous = decision.verdict
                verdict = decision.sample(now, available, reader.levels(), killed, step)
        except Exception as e:  # noqa: BLE001 - a check must answer; the last verdict stands
            log.warning("cgwatch guard: sampling failed (%r); keeping the last decision", e)
            decision.sampling_failed(now, reader.killed)
            verdict = previous = decision.verdict
        if verdict.key() != previous.key():
            self._announce(verdict)
        return self._agreement.at_check(verdict, step)

    def _observed_check(self, step: Optional[int] = None) -> Verdict:
        """check() in observe mode: the decision kept as a would-be stop, *go on* answered."""
        assert self._observer is not None
        return self._observer.seen(_monotonic(), Guard.check(self, step), self._reader.killed)

    @property
    def observe(self) -> bool:
        return self._observer is not None

    def would_stops(self, ended: Optional[float] = None,
                    killed_at: Optional[float] = None) -> list[Judged]:
        """Observe mode: each would-be stop judged (wouldstop.Observer.judged); else []."""
        return self._observer.judged(ended, killed_at) if self._observer is not None else []

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
        agreement = self._agreement
        return agreement.agreed if agreement.group is not None else self._decision.verdict

    @property
    def decision(self) -> Decision:
        """The pure decision this guard feeds (decision.py)."""
        return self._decision

    @property
    def verdict(self) -> Verdict:
        """The decision of the last sample."""
        return self._decision.verdict

    def subscribe(self, callback: Callable[[Verdict], None]) -> None:
        """Call `callback(verdict)` once per change of the decision (stop or not, trigger,
        level), on the thread that called check()."""
        self._callbacks = [*self._callbacks, callback]

    def unsubscribe(self, callback: Callable[[Verdict], None]) -> None:
        self._callbacks = [c for c in self._callbacks if c != callback]

    # ---- what a save takes (the decision's) ------------------------------------------------------

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
        self._decision.saved(seconds)

    def estimate_checkpoint(self, nbytes: int) -> bool:
        """Take `nbytes` as a checkpoint's size, an estimate (the framework adapters count
        the model's and the optimizer's state: integrations/_guarded.py), unless the user
        gave `checkpoint_seconds` or `checkpoint_bytes`; True when taken. Until then the
        size is the guarded level's working set, the most a checkpoint can hold; a save
        timed later (`saving()`, `saved()`) wins over either (policy.save_seconds)."""
        return self._decision.estimate_checkpoint(nbytes)

    @property
    def checkpoint_bytes(self) -> Optional[int]:
        """A checkpoint's size: the user's, or the adapters' estimate (None: neither)."""
        return self._decision.checkpoint_bytes

    @property
    def checkpoint_seconds(self) -> float:
        """What a save takes: the longest of the last saves reported, else the configured,
        else the estimate from the last sample's working set (module docstring)."""
        return self._decision.checkpoint_seconds

    @property
    def check_gap(self) -> float:
        """The longest time between two checks over the last few samples (seconds): a stop
        comes only at a check, so the forecast must leave that too (module docstring)."""
        return self._decision.check_gap

    @property
    def lead(self) -> float:
        """Seconds the forecast must leave: checkpoint_seconds x margin, plus the time the
        next check may be away (`check_gap`)."""
        return self._decision.lead

    @property
    def rise(self) -> int:
        """The largest piece the job took twice so far (bytes; policy.LargestRise)."""
        return self._decision.rise

    @property
    def sync_every(self) -> int:
        """Checks between two agreements of all ranks (0: none, or no longer: a failed
        all-reduce)."""
        return self._agreement.sync_every

    @property
    def reserve(self) -> Threshold:
        """The reserve kept at every limited level (bytes or a share of its limit)."""
        return self._decision.reserve

    @property
    def near_interval(self) -> float:
        """Seconds between samples near the reserve (bench/guard.py reads it)."""
        return self._decision.near_interval

    def state_dict(self) -> dict[str, Any]:
        """What the job learned that its next life should start with (JSON-able; decision.py:
        timed saves, an estimated checkpoint size, its pieces)."""
        return self._decision.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Start from a previous life's `state_dict()` (missing or unknown keys skipped)."""
        self._decision.load_state_dict(state)

    # ---- lifecycle ---------------------------------------------------------------------------

    def close(self, oom_killed: bool = False) -> None:
        """Detach from the events (closing them if the guard made them); the job ended now
        (`oom_killed`: as `cgwatch run` knows): the would-be stops logged, the record ended."""
        now = _monotonic()
        if self._observer is not None:
            log.info("%s", summary_line(self._observer.judged(now, now if oom_killed else None)))
        end_record(self._decision, now, oom_killed)
        events = self._events
        if events is not None:
            events.unsubscribe(self._reader.on_event)
            if self._own_events:
                events.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _announce(self, verdict: Verdict) -> None:
        if verdict.stop:
            line = verdict.message() if self._observer is None \
                else would_stop_line(verdict.message())
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


class LevelReader:
    """What the guard reads, through `monitor` only: the levels as the decision takes them
    (`levels()`), and the OOM kills and `high` rises its Events deliver (`on_event`, on the
    loop thread; the checks read the integers)."""

    def __init__(self, monitor: Monitor, pressure: str) -> None:
        self.monitor = monitor
        self.pressure = pressure  # the PSI line read: "some" or "full"
        self.killed = 0  # OOM kills on the path since the guard began
        self.high_rises: dict[str, int] = {}  # path -> `high` rises since the guard began

    def on_event(self, item: Any) -> None:
        counter = getattr(item, "counter", None)
        if counter is None or getattr(item, "propagated", False):
            return  # a headroom alert, or a v2 repeat of a rise already seen below
        if counter in _KILLS:
            self.killed += item.new - item.old
        elif counter == "high":
            path = item.cgroup_path
            self.high_rises[path] = self.high_rises.get(path, 0) + item.new - item.old

    def levels(self) -> list[LevelSample]:
        """The levels with a line (a limit or memory.high) and a working set, as the
        decision takes them; a v2 level's PSI total read only where it has memory.high."""
        version: Optional[int] = None  # read only for a level with memory.high (v2's)
        kept: Optional[dict[str, Any]] = None  # layout()'s levels by path, when PSI is read
        samples = []
        for lvl in self.monitor.levels():
            if not forecastable(lvl):
                continue
            path = lvl.cgroup_path
            total: Optional[int] = None
            if lvl.high is not None:
                if version is None:
                    version = self.monitor.status.version
                if version == 2:
                    if kept is None:
                        kept = {k.cgroup_path: k for k in self.monitor.layout().levels}
                    total = self._pressure_total(path, kept.get(path))
            samples.append(LevelSample(path, lvl.limit, lvl.headroom, working_set(lvl),
                                       lvl.high, total, self.high_rises.get(path, 0)))
        return samples

    def _pressure_total(self, path: str, level: Any) -> Optional[int]:
        """The `total=` of the chosen PSI line of a v2 level's memory.pressure (None: PSI
        off or unreadable). Read through the level's kept descriptor (`layout()`, as
        prometheus.py reads it): no open per sample."""
        try:
            if level is None:
                raise FileNotFoundError(path)  # a level that left the layout meanwhile
            total: Optional[int] = values.parse_pressure(
                level.read(names.PRESSURE)).get(self.pressure)
            return total
        except (OSError, ValueError):
            # EOPNOTSUPP with PSI off (psi=0 on the kernel's command line), ENOENT before 4.20
            return None
