"""Internal. When the memory guard samples its levels (`levels()`, the forecast, the policy)
and when a check answers from the last sample: pure (times and sizes are passed in), table-
tested in tests/test_sampling.py. decision.py holds the last `Plan` and asks `due` at every check.

A check between samples costs one `available_memory()`; a sample costs `levels()` (every file
of every level). The rules:
1. A sample comes every `interval` seconds on average, at a phase spread over +-`jitter` of
   it by the golden-ratio sequence (`phase`): a fixed clock beats against a job's periodic
   allocations (a 0.5 s cycle read every 0.5 s shows a slow wave that is not there, the
   issue that stopped a flat sawtooth after 37-211 s); spread phases sample every part of
   a cycle, so a window's lowest and highest samples approach the cycle's trough and peak.
2. While `available_memory()` is at or under `near` (the largest reserve plus twice the
   growth expected before the next sample), one every `near_interval`.
3. At once when it falls under `floor` (the least reserve of any level) and the last
   verdict does not say stop, unless the last sample found that it was the host's
   MemAvailable under it, which no reserve covers (`host_low`).
4. At once after an OOM kill on the path the last sample had not counted.
5. After a sample that failed (the levels could not be read), not before `interval` or 1 s,
   whichever is longer, and not near the reserve meanwhile (`after_failure`): a failing read
   retried at every check would cost every step a failed `levels()`.
"""

from __future__ import annotations

from .frozen import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Optional

GOLDEN = 0.6180339887498949  # frac of the golden ratio: the evenest spread of phases


def phase(k: int) -> float:
    """The k-th phase in [0, 1): frac(k x golden ratio), never two alike and evenly spread
    at every length (Weyl's equidistribution)."""
    return (k * GOLDEN) % 1.0


class Plan(Frozen):
    """What the last sample set: `due` (the next sample, whatever memory does), `near`
    (available at or under it: sample every near_interval), `floor` (available under it:
    sample at once), `sampled` (when it was), `host_low` (available was under `floor` by the
    host's figure, not a level's), `killed` (the OOM kills it counted)."""

    __slots__ = _fields = ("due", "near", "floor", "sampled", "host_low", "killed")
    due: float
    near: int
    floor: int
    sampled: float
    host_low: bool
    killed: int

    def __init__(self, due: float, near: int, floor: int, sampled: float,
                 host_low: bool = False, killed: int = 0) -> None:
        fill(self, locals())


FIRST = Plan(0.0, 0, 0, float("-inf"))  # no sample yet: the first check samples


def plan(now: float, *, interval: float, jitter: float, k: int, floors: Sequence[int],
         growth: float, lead: float, available: Optional[int], stopped: bool,
         killed: int) -> Plan:
    """The plan after a sample at `now`: `floors` each level's reserve (bytes, the learned
    rise included), `growth` the fastest level's (bytes/s), `lead` the guard's (s),
    `available` what the check read before sampling (None: not read), `stopped` the new
    verdict's, `killed` the OOM kills counted; `k` numbers the sample (its phase)."""
    floor = min(floors, default=0)
    # Far enough that `interval` seconds of growth (or a doubling of the last growth rate)
    # cannot pass the reserve before the next sample.
    near = max(floors, default=0) + int(2 * growth * max(interval, lead))
    spread = interval * (1.0 + jitter * (2.0 * phase(k) - 1.0))
    host_low = available is not None and available < floor and not stopped
    return Plan(now + spread, near, floor, now, host_low, killed)


def due(last: Plan, now: float, available: int, *, near_interval: float, stopped: bool,
        killed: int) -> bool:
    """Whether this check samples (module docstring), given the last plan and what
    `available_memory()` says now."""
    if killed != last.killed or now >= last.due:
        return True
    if available > last.near:
        return False
    # Near: every near_interval, and at once when a level is certainly under its reserve
    # while the verdict does not say so (unless it was the host's MemAvailable).
    return now >= last.sampled + near_interval or not (
        stopped or available >= last.floor or last.host_low)


def after_failure(last: Plan, now: float, *, interval: float, killed: int) -> Plan:
    """The plan after a sample at `now` failed: the next one `interval` (at least 1 s) later,
    never sooner for being near (`near` -1: no figure is at or under it), `killed` the OOM
    kills counted (a kill already seen does not retry at once); the rest is the last plan's."""
    return Plan(now + max(interval, 1.0), -1, last.floor, last.sampled, last.host_low, killed)
