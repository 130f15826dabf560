"""The memory shapes of bench/campaign.py: what a job's allocations do over time (pure, no I/O).

A shape is a function of the seconds since the job's loop began, answering the bytes the job
holds beyond what it had at start (its interpreter, cgwatch, a framework). Healthy shapes stay
well under the limit and run for `seconds`; leaking shapes are scaled to the job's `room` (the
limit minus its usage once started) so that they reach it at a known time, `life`: the first
10 ms tick at which the shape reaches `room`, which is where the kernel's OOM killer would
end an unguarded run (the campaign reports each stop's time as a share of it). Both the job
(bench/campaign_job.py) and the harness build them from the same `Shape` and seed.

`kind`: "alloc" (the job's main process holds the bytes), "worker" (a forked worker process
holds them; the main process only steps and checks), "cache" (the job writes files: usage
climbs with page cache the kernel can reclaim, the anonymous part stays `target`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

MiB = 1 << 20
TICK = 0.010  # the job's step: one allocation adjustment and one guard check
Target = Callable[[float], float]  # seconds since the loop began -> bytes held beyond start


@dataclass(frozen=True)
class Shape:
    """One shape of the campaign, with its parameters; `name` is its row in the table."""

    name: str
    leaks: bool
    make: Callable[[random.Random, int, int, float], Target]  # (rng, limit, room, life|seconds)
    seconds: float = 40.0  # healthy: how long the job runs; leaking: its life (to the limit)
    limit: int = 512 * MiB
    kind: str = "alloc"
    full_only: bool = False
    params: dict[str, float] = field(default_factory=dict)


def sawtooth(period: float, amplitude: float, base: float = 0.10) -> Callable[..., Target]:
    """`amplitude` x limit allocated in a ramp over the whole `period`, then freed at once (a
    garbage collector, a batch allocator), over a flat `base` x limit."""
    def make(rng: random.Random, limit: int, room: int, seconds: float) -> Target:
        phase = rng.uniform(0.0, period)
        return lambda t: limit * (base + amplitude * (((t + phase) % period) / period))
    return make


def steps(sizes: tuple[float, ...], every: float, base: float = 0.10,
          first: float = 3.0) -> Callable[..., Target]:
    """Steps of `sizes` x limit, the first at `first` s then one every `every` s; flat after."""
    def make(rng: random.Random, limit: int, room: int, seconds: float) -> Target:
        def target(t: float) -> float:
            held = base
            for i, size in enumerate(sizes):
                if t >= first + i * every:
                    held += size
            return limit * held
        return target
    return make


def startup_ramp(size: float, over: float, base: float = 0.05) -> Callable[..., Target]:
    """Imports, a model load, the first batch: `size` x limit allocated over `over` seconds
    (fast first, as imports are), then flat."""
    def make(rng: random.Random, limit: int, room: int, seconds: float) -> Target:
        return lambda t: limit * (base + size * math.sqrt(min(1.0, t / over)))
    return make


def eval_spike(base: float, peak: float, every: float, hold: float) -> Callable[..., Target]:
    """A flat `base` x limit and, every `every` s, an evaluation or checkpoint that takes the
    job to `peak` x limit in 0.5 s, holds `hold` s, and frees it."""
    def make(rng: random.Random, limit: int, room: int, seconds: float) -> Target:
        def target(t: float) -> float:
            into = (t % every) - (every - hold - 0.5)  # the spike ends each period
            if into <= 0:
                return limit * base
            return limit * (base + (peak - base) * min(1.0, into / 0.5))
        return target
    return make


def noise(base: float, spread: float, every: float) -> Callable[..., Target]:
    """A job whose batches differ in size: `base` x limit plus a seeded random amount within
    +-`spread` x limit, a new one every `every` s (no trend)."""
    def make(rng: random.Random, limit: int, room: int, seconds: float) -> Target:
        values = [rng.uniform(-spread, spread) for _ in range(int(seconds / every) + 2)]
        return lambda t: limit * (base + values[min(int(t / every), len(values) - 1)])
    return make


def ramp_then_sawtooth(size: float, over: float, period: float,
                       amplitude: float) -> Callable[..., Target]:
    """A start-up ramp to `size` x limit over `over` s, then a training sawtooth on top."""
    def make(rng: random.Random, limit: int, room: int, seconds: float) -> Target:
        ramp = startup_ramp(size, over, 0.0)(rng, limit, room, seconds)
        saw = sawtooth(period, amplitude, 0.0)(rng, limit, room, seconds)
        return lambda t: ramp(t) + (saw(t - over) if t > over else 0.0)
    return make


def in_step_peak(base: float, peak: float, every: float, hold: float) -> Callable[..., Target]:
    """A forward pass's peak: a flat `base` x limit and, in each step of `every` s, `peak` x
    limit for its first `hold` s (taken and freed at once: activations)."""
    def make(rng: random.Random, limit: int, room: int, seconds: float) -> Target:
        phase = rng.uniform(0.0, every)
        return lambda t: limit * (peak if (t + phase) % every < hold else base)
    return make


def warm_up(size: float, over: float, base: float = 0.05) -> Callable[..., Target]:
    """A cache warming: `size` x limit taken at an even pace over `over` seconds, then flat
    (a plateau; the climb looks like a leak's until it ends)."""
    def make(rng: random.Random, limit: int, room: int, seconds: float) -> Target:
        return lambda t: limit * (base + size * min(1.0, t / over))
    return make


def cache_base(base: float) -> Callable[..., Target]:
    """The anonymous part of the page-cache writer: a flat `base` x limit."""
    def make(rng: random.Random, limit: int, room: int, seconds: float) -> Target:
        return lambda t: limit * base
    return make


# ---- leaking shapes: reach `room` at `life` seconds ------------------------------------------


def linear(rng: random.Random, limit: int, room: int, life: float) -> Target:
    return lambda t: room * t / life


def accelerating(rng: random.Random, limit: int, room: int, life: float) -> Target:
    """The rate grows with time (a cache whose entries grow): quadratic."""
    return lambda t: room * (t / life) ** 2


def stairs(size: float) -> Callable[..., Target]:
    """Pieces of `size` x limit (an optimizer state, a bigger batch, a cache shard), at an
    even pace so that the piece that no longer fits comes at `life`."""
    def make(rng: random.Random, limit: int, room: int, life: float) -> Target:
        piece = size * limit
        pieces = math.ceil(room / piece)
        every = life / pieces
        return lambda t: piece * math.floor(t / every + 1e-9)
    return make


def slow(rate_mib: float) -> Callable[..., Target]:
    """A leak of `rate_mib` MiB/s whatever the room (its life is room / rate)."""
    def make(rng: random.Random, limit: int, room: int, life: float) -> Target:
        return lambda t: rate_mib * MiB * t
    return make


def bursty(rng: random.Random, limit: int, room: int, life: float) -> Target:
    """Random pieces (1-8 % of the limit) every 0.2-1.5 s, a quarter of them frees of an
    earlier piece's size: a rising walk scaled so that its first passage of `room` is near
    `life` (`bursty_walk`)."""
    times, held = bursty_walk(rng, limit, room, life)
    import bisect

    def target(t: float) -> float:
        return held[bisect.bisect_right(times, t) - 1]
    return target


def bursty_walk(rng: random.Random, limit: int, room: float, life: float,
                pace: tuple[float, float] = (0.2, 1.5),
                must_reach: bool = False) -> tuple[list[float], list[float]]:
    """`bursty`'s walk: (times, the level held from each on), a piece every `pace` seconds,
    scaled so that its level at `life` is the room (its first passage may be earlier). A
    walk that needs scaling by more than 3 (its level at `life` low after many frees) is
    drawn again: scaled, its pieces would be no longer 1-8 % but up to half the limit (a
    campaign's seed 1066: a single piece of 264 MiB in 512 MiB, 1.4 s in); with
    `must_reach`, one that never reaches the room too."""
    while True:
        times, held, now, level = [0.0], [0.0], 0.0, 0.0
        while now < life * 2:
            now += rng.uniform(*pace)
            piece = rng.uniform(0.01, 0.08) * limit
            level = max(0.0, level - piece if rng.random() < 0.25 else level + piece)
            times.append(now)
            held.append(level)
        at_life = next((h for t, h in zip(reversed(times), reversed(held)) if t <= life), 1.0)
        scale = room / max(at_life, 1.0)
        if scale <= 3.0 and (not must_reach or max(held) * scale >= room):
            return times, [h * scale for h in held]


def leak_under_sawtooth(rng: random.Random, limit: int, room: int, life: float) -> Target:
    """A 2 s sawtooth of 20 % of the limit whose floor rises: the peaks climb to the room."""
    saw = sawtooth(2.0, 0.20, 0.0)(rng, limit, room, life)
    rise = room - 0.20 * limit
    return lambda t: rise * t / life + saw(t)


def evaluation_leak(rng: random.Random, limit: int, room: int, life: float) -> Target:
    """An evaluation that gathers its predictions: flat through training, then from the
    evaluation's start (half the life) a climb that reaches the room at `life`."""
    begins = 0.5 * life
    return lambda t: 0.0 if t < begins else room * (t - begins) / (life - begins)


def life_of(target: Target, room: int, until: float) -> float:
    """The first tick at which `target` reaches `room` (inf: never before `until`)."""
    ticks = int(until / TICK) + 1
    for i in range(ticks):
        if target(i * TICK) >= room:
            return i * TICK
    return math.inf


RESERVE_SHARE = 0.05  # the guard's documented reserve, "5%" of the limit


def ceiling_of(target: Target, room: int, reserve: int, until: float) -> float:
    """The last tick before `target` leaves less than `reserve` of `room` free (inf: never
    before `until`): the latest a stop can come with the configured reserve still free, for
    a guard that knew the shape's future. A continuous leak reaches it a reserve's worth
    before its life; stairs at the stair that breaks the reserve, whose time a guard that
    does not know the schedule cannot wait for (it stops after the stair before)."""
    ticks = int(until / TICK) + 1
    for i in range(ticks):
        if room - target(i * TICK) < reserve:
            return max(0.0, (i - 1) * TICK)
    return math.inf


def _healthy() -> list[Shape]:
    out = []
    for period, seconds in ((0.2, 30.0), (0.5, 30.0), (2.0, 40.0), (10.0, 60.0),
                            (60.0, 150.0)):
        for amp in (0.2, 0.6):
            out.append(Shape(f"sawtooth {period:g} s, {amp:.0%}", False,
                             sawtooth(period, amp), seconds,
                             params={"period": period, "amplitude": amp}))
    out += [
        Shape("one step, then flat", False, steps((0.40,), 0.0), 40.0),
        Shape("four steps, then flat", False, steps((0.15,) * 4, 3.0), 40.0),
        Shape("start-up ramp (45 % in 3 s)", False, startup_ramp(0.45, 3.0), 40.0),
        Shape("eval spike to 78 %", False, eval_spike(0.30, 0.78, 12.0, 1.5), 40.0),
        Shape("page-cache writer", False, cache_base(0.10), 40.0, kind="cache"),
        Shape("batch-size noise (30 +-15 %)", False, noise(0.30, 0.15, 0.3), 40.0),
        Shape("ramp, then 2 s sawtooth", False, ramp_then_sawtooth(0.30, 4.0, 2.0, 0.30),
              40.0),
    ]
    # Near the limit (issue 32: a batch size raised until memory is nearly full). The share
    # named is of the limit with the job's start (a plain interpreter: ~5 % of 512 MiB; a
    # framework's: the shape is a share of what it left, so the same total).
    out += [
        Shape("sawtooth 2 s to ~90 %", False, sawtooth(2.0, 0.75), 40.0),
        Shape("sawtooth 0.2 s to ~80 %", False, sawtooth(0.2, 0.65), 30.0),
        Shape("in-step peak to ~90 % (0.25 s a 1 s step)", False,
              in_step_peak(0.30, 0.85, 1.0, 0.25), 40.0),
        Shape("warm-up to ~85 % over 10 s", False, warm_up(0.75, 10.0), 40.0),
        Shape("first step takes ~90 %", False, steps((0.75,), 0.0, first=1.0), 40.0),
        Shape("eval spike to ~90 %", False, eval_spike(0.30, 0.85, 12.0, 1.5), 40.0),
    ]
    return out


def _leaking() -> list[Shape]:
    return [
        Shape("linear leak", True, linear, 40.0),
        Shape("stairs of 5 %", True, stairs(0.05), 40.0),
        Shape("stairs of 15 %", True, stairs(0.15), 40.0),
        Shape("stairs of 25 %", True, stairs(0.25), 40.0),
        Shape("accelerating leak", True, accelerating, 40.0),
        Shape("leak in a worker process", True, linear, 40.0, kind="worker"),
        Shape("bursty leak", True, bursty, 40.0),
        Shape("leak under a sawtooth", True, leak_under_sawtooth, 40.0),
        Shape("evaluation leak", True, evaluation_leak, 40.0),
        Shape("slow leak (1.5 MiB/s)", True, slow(1.5), 660.0, limit=1024 * MiB,
              full_only=True),
    ]


SHAPES: list[Shape] = _healthy() + _leaking()
BY_NAME = {s.name: s for s in SHAPES}
