"""The simulated campaign's jobs (bench/simulate.py): pure, seeded, at least 10,000 of them.

A job is a `SimJob`: its class (a row of the table), whether it leaks, the way the guard
reaches it, its limit, its step time, its framework start-up, its shape's parameters, what a
real save of it writes and how fast its disk writes, and how loaded the machine is. Nothing
here reads a clock or a file; `working_set(job)` gives the job's working set (bytes) as a
function of the seconds the job has run (its own time: a descheduled job allocates nothing),
and `life_of(job)` when the kernel's OOM killer would end it unguarded (inf: never). The
harness (bench/simulate.py) turns the job's time into the guard's clock.

The classes are the real campaign's (bench/campaign_shapes.py, whose sawtooth, stairs,
accelerating and bursty shapes are reused) and issue 32's, each near the limit (peaks at
80-95 %) and, where it differs, far from it (30-60 %):
- healthy: a sawtooth within a step (each step allocates and frees its activations), a
  sawtooth across steps (period 2-400 steps or 0.2 s-10 min), an in-step peak (a forward
  pass's peak for 0.05-0.3 s of each step), a cache or warm-up plateau to 85 % (a linear or
  concave climb over 1 s to 10 min, then flat), a first step or model load that takes most
  of the limit (80-92 %) then flat, evaluation spikes (to 80-95 % for 2 s-2 min, every 30 s
  to 30 min), batch-size noise, a ramp then a sawtooth;
- leaking: linear, accelerating (quadratic), stairs (pieces of 2-25 % of the limit),
  bursty (the campaign's random walk), a leak under a sawtooth, an evaluation that gathers
  predictions (flat, then a climb from the evaluation's start to the limit), a slow leak
  (a life of 30 min-2 h in the loop, 80-160 s under run --guard).
Limits 256 MiB to 512 GiB; step times 10 ms to a minute (log-uniform); a framework start-up
before the shape (a plain interpreter, ~30 MiB in under a second; a torch framework,
300 MiB-1.2 GiB in 2-20 s, at most a third of the limit); three ways in: `guard` (a
`Guard()` in the loop, one check a step), `adapter` (the same with the adapters' checkpoint
estimate, the model's and optimizer's bytes), `run` (`cgwatch run --guard`, a check every
0.1 s from its own thread, no estimate; the job saves at the end of the step SIGTERM came
in). Loads: `quiet` (rare 5-50 ms pauses) and `loaded` (a 2-core machine at a load of 4-30:
a pause of 20 ms-1.5 s every ~3 s on average, each process its own). No job allocates
faster than MAX_RATE (4 GiB/s): a faster draw is stretched in time (`fastest`).

What a save really takes (`save_seconds`) is not the guard's assumption: the checkpoint
(model and optimizer) is 0.5-40 % of the limit, log-uniform, and the disk writes it at
150 MiB/s-2 GiB/s (a network filesystem to a local NVMe; 500 MiB/s-4 GiB/s for limits of
32 GiB and more, the nodes that hold them), plus 0.05-1 s of opening, pickling and fsync.
`within_reach` says which leaks a guard that never stops a healthy job could save at all.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from typing import Callable

from bench import campaign_shapes as campaign

MiB = 1 << 20
GiB = 1 << 30
LIMITS = tuple(int(x * MiB) for x in (256, 512, 1024, 1536, 2048)) + tuple(
    x * GiB for x in (4, 8, 16, 32, 64, 128, 256, 512))
WAYS = ("guard", "adapter", "run")
RUN_INTERVAL = 0.1  # `cgwatch run --guard` checks this often (cli/runguard.py)
Shape = Callable[[float], float]  # the job's own seconds -> working set (bytes)

HEALTHY = ("sawtooth within a step", "sawtooth across steps", "in-step peak",
           "warm-up plateau to 85 %", "first step takes most", "evaluation spikes",
           "batch-size noise", "ramp, then sawtooth")
LEAKING = ("linear leak", "accelerating leak", "stairs", "bursty leak",
           "leak under a sawtooth", "evaluation leak", "slow leak")
# Healthy classes drawn near the limit (peaks 80-95 %) and far from it (30-60 %).
NEAR_AND_FAR = ("sawtooth within a step", "sawtooth across steps", "in-step peak",
                "evaluation spikes", "batch-size noise", "ramp, then sawtooth")


@dataclass(frozen=True)
class SimJob:
    """One simulated job. Sizes are bytes, times seconds; `params` the shape's, by name."""

    index: int
    cls: str  # the class (the table's row), "near"/"far" included for healthy ones
    kind: str  # the shape's kind (HEALTHY or LEAKING)
    leaks: bool
    way: str  # WAYS
    load: str  # "quiet" | "loaded"
    limit: int
    step: float  # seconds per training step (the job's own time)
    startup: int  # bytes the framework's start-up takes before the shape
    startup_seconds: float
    seconds: float  # the shape's duration (healthy) or its life (leaking), after start-up
    checkpoint: int  # bytes a real save writes
    disk_rate: float  # bytes per second the disk writes
    save_overhead: float  # seconds a save takes besides writing
    seed: int
    params: tuple[tuple[str, float], ...]

    def param(self, name: str) -> float:
        return dict(self.params)[name]

    @property
    def save_seconds(self) -> float:
        """What a real save of this job takes."""
        return self.checkpoint / self.disk_rate + self.save_overhead


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def draw(index: int, kind: str, way: str, near: bool, seed: int) -> SimJob:
    """One job of `kind`, its parameters drawn from `seed` (module docstring)."""
    rng = random.Random(seed)
    leaks = kind in LEAKING
    limit = rng.choice(LIMITS)
    framework = rng.random() < 0.6 and limit >= 1024 * MiB
    if framework:
        startup = min(int(_log_uniform(rng, 300, 1200) * MiB), limit // 3)
        startup_seconds = rng.uniform(2.0, 20.0)
    else:
        startup = min(30 * MiB, limit // 8)
        startup_seconds = rng.uniform(0.2, 1.0)
    # What a job costs the simulation is its samples (~50-100 us each: one a check of steps
    # over 0.5 s, else two a second) and its checks (~5-10 us, at most 10 a second:
    # bench/simulate.py): each job gets 12-80 samples' worth of time (log-uniform, ~36 on
    # average), the leaks at least 10 steps of life, the healthy jobs 5 steps.
    step = _log_uniform(rng, 0.01, 60.0)
    samples = _log_uniform(rng, 12.0, 80.0)
    if way == "run" or step < 0.5:
        seconds = max(10.0, samples * 0.5)
    else:
        seconds = samples * step
    step = min(step, seconds / (10 if leaks else 5))
    big = limit >= 32 * GiB
    checkpoint = max(MiB, int(limit * _log_uniform(rng, 0.005, 0.40)))
    disk_rate = _log_uniform(rng, 500 * MiB, 4 * GiB) if big else \
        _log_uniform(rng, 150 * MiB, 2 * GiB)
    params = _params(rng, kind, near, limit, startup, step, seconds)
    if kind == "slow leak":  # 30 min-2 h in the loop, 80-160 s under run --guard (budget)
        seconds = rng.uniform(80.0, 160.0) if way == "run" else rng.uniform(1800.0, 7200.0)
        step = max(step, seconds / 100) if way != "run" else min(step, seconds / 10)
    # No job allocates faster than a node faults pages in: stretch the job's time (its step,
    # its shape's periods and life) until its fastest climb is at most MAX_RATE.
    stretch = max(1.0, fastest(kind, params, limit, startup, step, seconds) / MAX_RATE)
    if way == "run":  # its 0.1 s checks: a run --guard job of at most ~240 s (the budget)
        stretch = min(stretch, max(1.0, 240.0 / seconds))
    if stretch > 1.0:
        step, seconds = step * stretch, seconds * stretch
        params = {k: v * stretch if k in TIMES else v for k, v in params.items()}
    load = "loaded" if rng.random() < 0.5 else "quiet"
    where = "" if leaks or kind not in NEAR_AND_FAR else (", near" if near else ", far")
    return SimJob(index, kind + where, kind, leaks, way, load, limit, step, startup,
                  startup_seconds, seconds, checkpoint, disk_rate, rng.uniform(0.05, 1.0),
                  seed, tuple(sorted(params.items())))


# Bytes per second a job can allocate at most: page faults of fresh anonymous memory run at
# ~1-4 GiB/s a thread (memset of new pages, measured on x86 servers), a few threads' worth.
MAX_RATE = 4 * GiB
TIMES = ("period", "hold", "over", "every", "up")  # the parameters that are seconds


def fastest(kind: str, p: dict[str, float], limit: int, startup: int, step: float,
            seconds: float) -> float:
    """The fastest the shape allocates (bytes/s): its steepest climb, a piece taken within
    one step."""
    height = (p["peak"] - p["floor"]) * limit
    room = limit - startup - p["floor"] * limit
    rates = {
        "sawtooth within a step": height / step,
        "sawtooth across steps": height / p.get("period", 1.0),
        "in-step peak": height / (0.5 * step),
        "warm-up plateau to 85 %": (p["peak"] * limit - startup) / p.get("over", 1.0)
        * (4.1 if p.get("concave") else 1.0),
        "first step takes most": (p["peak"] * limit - startup) / step,
        "evaluation spikes": height / p.get("up", 1.0),
        "batch-size noise": 2 * height / step,
        "ramp, then sawtooth": max(height / p.get("period", 1.0),
                                   p["floor"] * limit / p.get("over", 1.0)),
        "linear leak": room / seconds, "slow leak": room / seconds,
        "accelerating leak": 2 * room / seconds,
        "stairs": p.get("piece", 0.0) * limit / step,
        "bursty leak": 0.08 * limit / step,
        "leak under a sawtooth": p.get("amplitude", 0.0) * limit / p.get("period", 1.0)
        + room / seconds,
        "evaluation leak": room / ((1 - p.get("begins", 0.0)) * seconds),
    }
    return rates[kind]


def _params(rng: random.Random, kind: str, near: bool, limit: int, startup: int,
            step: float, seconds: float) -> dict[str, float]:
    """The shape's parameters: `peak` and `floor` as shares of the limit (the start-up
    included), periods in seconds."""
    base = startup / limit
    peak = rng.uniform(0.80, 0.95) if near else rng.uniform(0.30, 0.60)
    peak = max(peak, base + 0.1)
    floor = rng.uniform(base, base + 0.5 * (peak - base))
    p: dict[str, float] = {"peak": peak, "floor": floor}
    if kind == "sawtooth across steps":
        if rng.random() < 0.5:
            p["period"] = step * round(_log_uniform(rng, 2, 400))
        else:
            p["period"] = max(2 * step, _log_uniform(rng, 0.2, 600.0))
        p["period"] = min(p["period"], seconds / 3)
    elif kind == "in-step peak":
        p["hold"] = min(rng.uniform(0.05, 0.3), 0.5 * step)
    elif kind == "warm-up plateau to 85 %":
        p["peak"] = 0.85
        p["over"] = min(_log_uniform(rng, 1.0, 600.0), seconds / 2)
        p["concave"] = float(rng.random() < 0.5)
    elif kind == "first step takes most":
        p["peak"] = rng.uniform(0.80, 0.92)
        p["wobble"] = rng.uniform(0.0, 0.03)
    elif kind == "evaluation spikes":
        p["every"] = min(_log_uniform(rng, 30.0, 1800.0), seconds / 2)
        p["hold"] = min(_log_uniform(rng, 2.0, 120.0), p["every"] / 3)
        p["up"] = min(rng.uniform(0.5, 5.0), p["hold"])
    elif kind == "batch-size noise":
        p["floor"] = (peak + floor) / 2 - rng.uniform(0.0, 0.1)
    elif kind == "ramp, then sawtooth":
        p["over"] = min(rng.uniform(2.0, 30.0), seconds / 4)
        p["period"] = min(max(2 * step, _log_uniform(rng, 0.5, 120.0)), seconds / 4)
    elif kind == "stairs":
        p["piece"] = _log_uniform(rng, 0.02, 0.25)
    elif kind == "leak under a sawtooth":
        p["period"] = min(max(2 * step, _log_uniform(rng, 0.5, 120.0)), seconds / 6)
        p["amplitude"] = rng.uniform(0.05, 0.30)
    elif kind == "evaluation leak":
        p["begins"] = rng.uniform(0.2, 0.8)  # the evaluation's start, a share of the life
    elif kind == "sawtooth within a step":
        pass
    if kind in LEAKING:
        p["floor"] = rng.uniform(0.0, 0.3) * (1 - base)
    p["phase"] = rng.random()
    return p


def jobs(count: int = 10_080, seed: int = 0) -> list[SimJob]:
    """`count` jobs, every class x way in turn (healthy ones near and far), each drawn from
    its own seed: the same list for the same arguments."""
    cells = [(k, w, True) for k in HEALTHY for w in WAYS]
    cells += [(k, w, False) for k in NEAR_AND_FAR for w in WAYS]
    cells += [(k, w, False) for k in LEAKING for w in WAYS]
    out = []
    for i in range(count):
        kind, way, near = cells[i % len(cells)]
        out.append(draw(i, kind, way, near, seed * 1_000_003 + i))
    return out


# ---- the working set over the job's own time ------------------------------------------------


def working_set(job: SimJob) -> Shape:
    """The job's working set (bytes) at `tau` seconds of its own time: the start-up (fast
    first, as imports are), then the shape from `job.startup_seconds` on."""
    limit, t0, s0 = job.limit, job.startup_seconds, job.startup
    shape = _shape(job)

    def at(tau: float) -> float:
        if tau < t0:
            return s0 * math.sqrt(max(tau, 0.0) / t0)
        return s0 + shape(tau - t0)
    del limit
    return at


def _shape(job: SimJob) -> Shape:
    """Bytes beyond the start-up at `x` seconds into the shape."""
    p = dict(job.params)
    limit, s0, step, kind = job.limit, job.startup, job.step, job.kind
    floor = p["floor"] * limit - s0 if not job.leaks else p["floor"] * limit
    top = p["peak"] * limit - s0
    rng = random.Random(job.seed + 7)
    if kind == "sawtooth within a step":
        return lambda x: floor + (top - floor) * ((x / step) % 1.0)
    if kind == "sawtooth across steps":
        period, off = p["period"], p["phase"] * p["period"]
        return lambda x: floor + (top - floor) * (((x + off) % period) / period)
    if kind == "in-step peak":
        hold, at = p["hold"], p["phase"] * (step - p["hold"])
        return lambda x: top if at <= x % step < at + hold else floor
    if kind == "warm-up plateau to 85 %":
        over = p["over"]
        if p["concave"]:
            k = 1 - math.exp(-4.0)
            return lambda x: top * (1 - math.exp(-4.0 * min(x, over) / over)) / k
        return lambda x: top * min(x, over) / over
    if kind == "first step takes most":
        wobble = p["wobble"] * limit
        return lambda x: top - wobble * ((x / step) % 1.0) if x >= step else \
            top * x / step
    if kind == "evaluation spikes":
        every, hold, up = p["every"], p["hold"], p["up"]
        off = p["phase"] * every

        def spikes(x: float) -> float:
            into = (x + off) % every - (every - hold)
            return floor if into <= 0 else floor + (top - floor) * min(1.0, into / up)
        return spikes
    if kind == "batch-size noise":
        spread = top - floor
        draws = [rng.uniform(-spread, spread) for _ in range(int(job.seconds / step) + 3)]
        last = len(draws) - 1
        return lambda x: floor + draws[min(int(x / step), last)]
    if kind == "ramp, then sawtooth":
        over, period = p["over"], p["period"]
        off = p["phase"] * period
        return lambda x: floor * math.sqrt(x / over) if x < over else \
            floor + (top - floor) * (((x - over + off) % period) / period)
    return _leak(job, p, floor)


def _leak(job: SimJob, p: dict[str, float], floor: float) -> Shape:
    """A leaking shape from `floor`, reaching the room (the limit minus the start-up) at
    `job.seconds`, the life (campaign_shapes' shapes where they fit)."""
    room = job.limit - job.startup - floor
    life, kind = job.seconds, job.kind
    rng = random.Random(job.seed + 11)
    if kind in ("linear leak", "slow leak"):
        leak = campaign.linear(rng, job.limit, int(room), life)
    elif kind == "accelerating leak":
        leak = campaign.accelerating(rng, job.limit, int(room), life)
    elif kind == "stairs":
        leak = campaign.stairs(p["piece"])(rng, job.limit, int(room), life)
    elif kind == "bursty leak":
        times, held = bursty(rng, job.limit, room, life)

        def leak(x: float) -> float:
            return held[bisect.bisect_right(times, x) - 1]
    elif kind == "leak under a sawtooth":
        amp, period = p["amplitude"] * job.limit, p["period"]
        off = p["phase"] * period
        rise = room - amp

        def leak(x: float) -> float:
            return rise * x / life + amp * (((x + off) % period) / period)
    elif kind == "evaluation leak":
        begins = p["begins"] * life

        def leak(x: float) -> float:
            return 0.0 if x < begins else room * (x - begins) / (life - begins)
    else:
        raise ValueError(f"no shape {kind!r}")
    return lambda x: floor + leak(x)


def life_of(job: SimJob) -> float:
    """When the kernel kills the job unguarded (its own seconds): the first time its
    working set reaches its limit; inf for a healthy job (its peaks stay under 96 %)."""
    return reaches(job, job.limit) if job.leaks else math.inf


def reaches(job: SimJob, line: float) -> float:
    """The first time (the job's own seconds) a leaking job's working set reaches `line`
    bytes (at least its floor)."""
    t0 = job.startup_seconds
    p = dict(job.params)
    floor = p["floor"] * job.limit
    room = job.limit - job.startup - floor
    need = line - job.startup - floor  # what the leak must add
    if job.kind == "bursty leak":  # the first piece that reaches the line
        times, held = bursty(random.Random(job.seed + 11), job.limit, room, job.seconds)
        return t0 + next(t for t, h in zip(times, held) if job.startup + floor + h >= line)
    life = job.seconds
    if job.kind == "leak under a sawtooth":
        # Each period climbs linearly to its top, then drops: the first period whose top
        # reaches the line holds the crossing, found on its line.
        amp, period = p["amplitude"] * job.limit, p["period"]
        off, rise = p["phase"] * period, room - amp
        slope = rise / life + amp / period
        k = 0
        while rise * ((k + 1) * period - off) / life + amp < need:
            k += 1  # the top of window k (just before its drop) is under the line
        start = max(0.0, k * period - off)
        return t0 + max(start, (need + amp * (k * period - off) / period) / slope)
    share = min(1.0, max(0.0, need / room))
    if job.kind in ("linear leak", "slow leak"):
        return t0 + life * share
    if job.kind == "accelerating leak":
        return t0 + life * math.sqrt(share)
    if job.kind == "evaluation leak":
        begins = p["begins"] * life
        return t0 + begins + (life - begins) * share
    if job.kind == "stairs":
        piece = p["piece"] * job.limit
        every = life / math.ceil(room / piece)
        return t0 + every * math.ceil(need / piece - 1e-9)
    raise ValueError(f"no shape {job.kind!r}")


# The highest a healthy job of these classes peaks: a guard that never stops one cannot
# tell a leak from it before the working set passes this share of the limit.
HEALTHY_PEAK = 0.95


def within_reach(job: SimJob) -> bool:
    """Whether a guard that never stops a healthy job could save this leak: its real save,
    plus the wait for the stop (the check at the step's end; under run --guard the 0.1 s
    check, then the step's end the job saves at), fits between the last moment it could
    be told from a healthy job and the kill. That moment: for a continuous leak, when it
    passes HEALTHY_PEAK of the limit; for one in pieces (stairs, bursty), the piece before
    the one that kills it (a piece repeated is its evidence: policy.LargestRise)."""
    life = life_of(job)
    wait = max(job.step, RUN_INTERVAL) if job.way != "run" else RUN_INTERVAL + job.step
    if job.kind == "stairs":
        p = dict(job.params)
        room = job.limit - job.startup - p["floor"] * job.limit
        told = life - job.seconds / math.ceil(room / (p["piece"] * job.limit))
    elif job.kind == "bursty leak":
        p = dict(job.params)
        room = job.limit - job.startup - p["floor"] * job.limit
        times, _ = bursty(random.Random(job.seed + 11), job.limit, room, job.seconds)
        told = job.startup_seconds + max(t for t in times if job.startup_seconds + t < life)
    else:
        told = seen(job, reaches(job, HEALTHY_PEAK * job.limit), life)
    return life - told >= job.save_seconds + wait


def seen(job: SimJob, since: float, until: float) -> float:
    """The first check time from `since` on at which the working set is past HEALTHY_PEAK
    of the limit (`until` if none): a check sees the working set at its own moments only,
    the end of a step (at least 0.1 s apart, as bench/simulate.py checks) or every 0.1 s
    under run --guard, and a sawtooth's top between two checks is never seen."""
    ws, line, t0 = working_set(job), HEALTHY_PEAK * job.limit, job.startup_seconds
    grid = RUN_INTERVAL if job.way == "run" else \
        job.step * max(1, round(RUN_INTERVAL / job.step))
    k = max(0, math.ceil((since - t0) / grid - 1e-9))
    while t0 + k * grid < until:
        if ws(t0 + k * grid + 1e-6 * grid) >= line:
            return t0 + k * grid
        k += 1
    return until


def bursty(rng: random.Random, limit: int, room: float,
           life: float) -> tuple[list[float], list[float]]:
    """campaign_shapes.bursty's walk at a pace scaled to the life (a piece every 0.5-3.75 %
    of it, the campaign's 0.2-1.5 s of 40 s), one that reaches the room."""
    return campaign.bursty_walk(rng, limit, room, life, (0.005 * life, 0.0375 * life),
                                must_reach=True)
