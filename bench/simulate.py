"""The simulated campaign: >= 10,000 jobs (bench/simulate_shapes.py) through the guard's pure
decision, in seconds, with the kernel modelled. Prints a table per class.

    .venv/bin/python -m bench.simulate [--count N] [--seed S] [--jobs J] [--show CLASS]

What is modelled (no cgroup, no process: the decision is fed what `available_memory()` and
`levels()` would read):
- The job's own time runs only while it is scheduled: a pause (the module's `quiet` and
  `loaded` draws in simulate_shapes.py) stops its allocations and lengthens the wall time
  between its steps.
- `guard` and `adapter` ways: one check at the end of every step, on the job's thread; the
  adapter's guard is told the model's and optimizer's bytes (`estimate_checkpoint`) first.
  A stop there begins the save at that check.
- `run` way: `cgwatch run --guard`'s thread checks every 0.1 s from the process's start (the
  start-up included), descheduled on its own; a stop is SIGTERM, and the job saves at the
  end of the step it is in (a stop before its loop began kills it unsaved).
- The kernel: the job is OOM-killed when its working set reaches its limit (`life_of`). A
  stop is *saved* ("lead kept") only if the job lives through its save: the save, begun as
  above, takes `SimJob.save_seconds` (the checkpoint's bytes over the disk's rate, plus its
  overhead: not what the guard assumes), and its working set goes on along its shape
  meanwhile (a worker's leak, a prefetching loader: the cautious reading).
- A healthy job that is stopped at all is a false stop.
- *Life share*: the stop's time into the shape over the time the kernel would have killed
  the job, both from the shape's start (bench/campaign.py's measure).
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing
import random
import statistics
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from bench import simulate_shapes as shapes
from bench.simulate_shapes import RUN_INTERVAL, SimJob
from cgwatch import policy
from cgwatch.decision import Decision, LevelSample

# Pauses of a descheduled process: (per second, shortest, longest) by load (module docstring
# of simulate_shapes.py).
PAUSES = {"quiet": (0.05, 0.005, 0.05), "loaded": (0.33, 0.02, 1.5)}


@dataclass(frozen=True)
class Outcome:
    """What came of one job."""

    index: int
    cls: str
    way: str
    leaks: bool
    limit: int
    stopped: bool
    saved: bool  # stopped, and the save ended before the kill
    killed: bool  # the kernel killed it (unguarded, or in its save)
    share: Optional[float]  # the stop's time over the life, from the shape's start
    in_startup: bool  # the stop came before the shape began
    message: str
    reach: bool = False  # a leak within reach (simulate_shapes.within_reach)


class _Pauses:
    """A process's pauses (wall time) drawn as it goes: `paused(t)` the seconds it was
    descheduled before wall time `t` (t increasing)."""

    def __init__(self, rng: random.Random, load: str) -> None:
        self.rate, self.low, self.high = PAUSES[load]
        self.rng = rng
        self.done = 0.0  # seconds of the pauses wholly before the last t
        self.start, self.length = self._next(0.0)

    def _next(self, after: float) -> tuple[float, float]:
        gap = self.rng.expovariate(self.rate)
        return after + gap, math.exp(self.rng.uniform(math.log(self.low), math.log(self.high)))

    def job_time(self, t: float) -> float:
        """The process's own time at wall time `t`."""
        while self.start + self.length <= t:
            self.done += self.length
            self.start, self.length = self._next(self.start + self.length)
        if t > self.start:
            return self.start - self.done
        return t - self.done

    def wall_time(self, tau: float) -> float:
        """The wall time at which the process reaches its own time `tau` (tau increasing)."""
        while self.start - self.done <= tau:
            self.done += self.length
            self.start, self.length = self._next(self.start + self.length)
        return tau + self.done


class Driver:
    """The guard's pure decision (cgwatch.decision) with the documented defaults, fed one
    limited level at the times the simulation gives; what `cgwatch.Guard.check` does between
    reading and delivering."""

    def __init__(self, job: SimJob) -> None:
        self.limit = job.limit
        self.decision = Decision()
        if job.way == "adapter":
            self.decision.estimate_checkpoint(job.checkpoint)

    def check(self, now: float, ws: int, step: int) -> Optional[str]:
        """The verdict's message when it says stop, else None."""
        decision, available = self.decision, self.limit - ws
        if decision.due(now, available, 0):
            level = LevelSample("/job", self.limit, available, ws)
            verdict = decision.sample(now, available, [level], 0, step)
        else:
            verdict = decision.verdict
        return verdict.message() if verdict.stop else None


def simulate(job: SimJob) -> Outcome:
    """Run one job through the decision (module docstring)."""
    ws = shapes.working_set(job)
    life = shapes.life_of(job)
    t0 = job.startup_seconds
    end = life if job.leaks else t0 + job.seconds
    rng = random.Random(job.seed + 13)
    driver = Driver(job)
    limit = job.limit
    if job.way == "run":
        mine, theirs = _Pauses(rng, job.load), _Pauses(random.Random(job.seed + 17), job.load)
        jitter = 0.2 if job.load == "loaded" else 0.02
        g, k = 0.0, 0
        while True:
            g = theirs.wall_time(theirs.job_time(g) + RUN_INTERVAL * (1 + rng.random() * jitter))
            tau = mine.job_time(g)
            if tau >= end:
                break
            k += 1
            said = driver.check(g, int(ws(tau)), k)
            if said is not None:
                if tau < t0:  # no handler yet: SIGTERM ends it
                    return _outcome(job, tau, False, said, life)
                boundary = t0 + math.ceil((tau - t0) / job.step - 1e-9) * job.step
                return _outcome(job, tau, boundary + job.save_seconds < life, said, life)
    else:
        mine = _Pauses(rng, job.load)
        slow = 0.15 if job.load == "loaded" else 0.02
        # A check at most every 0.1 s, as run --guard's: checking a 10 ms step's end every
        # 10th step changes only the time to the next check (in the lead: 90 ms more) and
        # merges ten falls of the working set into one (a climb's sum is the same).
        every = max(1, round(RUN_INTERVAL / job.step))
        k, extra = 0, 0.0
        while True:
            k += every
            tau = t0 + k * job.step
            extra += every * job.step * slow * rng.random()  # a loaded machine's slower steps
            if tau >= end:
                break
            # Just after the step's end: the step's own frees are done (its check's place).
            at = tau + 1e-6 * job.step
            wall = mine.wall_time(tau) + extra
            said = driver.check(wall, int(ws(at)), k)
            if said is not None:
                return _outcome(job, tau, tau + job.save_seconds < life, said, life)
    return Outcome(job.index, job.cls, job.way, job.leaks, limit, False, False, job.leaks,
                   None, False, "", job.leaks and shapes.within_reach(job))


def _outcome(job: SimJob, tau: float, saved: bool, message: str, life: float) -> Outcome:
    t0 = job.startup_seconds
    share = max(0.0, (tau - t0) / (life - t0)) if job.leaks else None
    return Outcome(job.index, job.cls, job.way, job.leaks, job.limit, True,
                   saved and job.leaks, job.leaks and not saved, share, tau < t0, message,
                   job.leaks and shapes.within_reach(job))


def _chunk(indexes: Sequence[int], count: int, seed: int) -> list[Outcome]:
    every = shapes.jobs(count, seed)
    # The guard's stop lines would be ~1,000 records on stderr: the table says it all.
    logger = logging.getLogger("cgwatch")
    was, logger.disabled = logger.disabled, True
    try:
        return [simulate(every[i]) for i in indexes]
    finally:
        logger.disabled = was


def without_forecast() -> None:
    """An ablation, in this process and the workers it forks: the decision as if the job
    were always no deeper than a depth it came back from, which is what turns the forecast
    off (policy.decide's `trusted`); the reserve, its room for a rise, OOM kills and
    throttling decide as before."""
    decide = policy.decide

    def untrusting(*args: Any, **kwargs: Any) -> policy.Verdict:
        return decide(*args, **{**kwargs, "trusted": True})
    policy.decide = untrusting  # type: ignore[assignment]


def run_all(count: int = 10_080, seed: int = 0, processes: int = 2) -> list[Outcome]:
    """Every job's outcome, in job order, over `processes` worker processes (1: in this one).
    Each worker draws the same pure list and simulates its share: only indexes and outcomes
    cross the pipe."""
    chunks = [list(range(i, count, 24)) for i in range(24)]
    if processes <= 1:
        outs = [o for c in chunks for o in _chunk(c, count, seed)]
    else:
        context = multiprocessing.get_context("fork")
        with context.Pool(processes) as pool:
            parts = pool.starmap(_chunk, [(c, count, seed) for c in chunks], chunksize=1)
        outs = [o for part in parts for o in part]
    return sorted(outs, key=lambda o: o.index)


# ---- the table ------------------------------------------------------------------------------


def _share(values: Iterable[Optional[float]]) -> str:
    shares = [v for v in values if v is not None]
    return f"{statistics.median(shares):.0%}" if shares else "—"


def _triggers(outs: Sequence[Outcome]) -> str:
    """The stops' triggers, from their messages (policy.Verdict.message)."""
    said = [o.message for o in outs if o.stopped]
    rise = sum("largest rise" in m for m in said)
    reserve = sum("below the reserve" in m for m in said) - rise
    return f"{sum('predicted' in m for m in said)} / {reserve} / {rise}"


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole else "—"


def table(outs: Sequence[Outcome]) -> str:
    """The per-class table (markdown), healthy classes then leaking ones."""
    ways = shapes.WAYS
    order: list[str] = []
    for o in outs:
        if o.cls not in order:
            order.append(o.cls)
    healthy = [c for c in order if not any(o.leaks for o in outs if o.cls == c)]
    leaking = [c for c in order if c not in healthy]
    lines = ["Healthy classes (goal: 0 stops).", "",
             "| class | runs | stops | " + " | ".join(f"stops, {w}" for w in ways)
             + " | of the stops: forecast / reserve / reserve with a rise | in start-up |",
             "|---" * (5 + len(ways)) + "|"]
    for c in healthy:
        rs = [o for o in outs if o.cls == c]
        lines.append(f"| {c} | {len(rs)} | {sum(o.stopped for o in rs)} | " + " | ".join(
            f"{sum(o.stopped for o in rs if o.way == w)}/{sum(o.way == w for o in rs)}"
            for w in ways) + f" | {_triggers(rs)} | {sum(o.in_startup for o in rs)} |")
    hs = [o for o in outs if not o.leaks]
    lines.append(f"| **all healthy** | {len(hs)} | {sum(o.stopped for o in hs)} | " + " | ".join(
        str(sum(o.stopped for o in hs if o.way == w)) for w in ways)
        + f" | {_triggers(hs)} | {sum(o.in_startup for o in hs)} |")
    lines += ["", "Leaking classes (goal: >= 99 % of those within reach saved: the save ends "
              "before the kill). Within reach: a guard that never stops a healthy job could "
              "save it (simulate_shapes.within_reach). Life share: the stop's time over the "
              "kill's, from the shape's start.", "",
              "| class | runs | saved | within reach | saved of those | saved per way, of "
              "those (" + " / ".join(ways) + ") | saved beyond reach | stopped, save cut | "
              "not stopped | life share, median (of those) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for c in leaking + ["**all leaks**"]:
        rs = [o for o in outs if o.leaks and (o.cls == c or c == "**all leaks**")]
        near = [o for o in rs if o.reach]
        saved, kept = sum(o.saved for o in rs), sum(o.saved for o in near)
        lines.append(
            f"| {c} | {len(rs)} | {saved} ({_pct(saved, len(rs))}) | {len(near)} | {kept} "
            f"({_pct(kept, len(near))}) | " + " / ".join(
                f"{sum(o.saved for o in near if o.way == w)}/{sum(o.way == w for o in near)}"
                for w in ways) + f" | {saved - kept}/{len(rs) - len(near)} | "
            f"{sum(o.stopped and not o.saved for o in rs)} | {sum(not o.stopped for o in rs)} "
            f"| {_share(o.share for o in rs)} ({_share(o.share for o in near)}) |")
    return "\n".join(lines) + "\n"


def failures(outs: Sequence[Outcome]) -> Iterator[Outcome]:
    """The healthy jobs stopped and the leaks not saved."""
    return (o for o in outs if o.stopped != o.leaks or (o.leaks and not o.saved))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_080, help="jobs (default 10,080)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--show", default=None, metavar="CLASS",
                        help="also list this class's failures (its jobs' parameters)")
    parser.add_argument("--without", choices=("forecast",), default=None,
                        help="an ablation: the decision with this part of its rule left out "
                             "(what the part buys and costs, docs/bench.md)")
    args = parser.parse_args(argv)
    if args.without == "forecast":
        without_forecast()
    outs = run_all(args.count, args.seed, args.jobs)
    print(table(outs), end="")
    if args.show:
        every = shapes.jobs(args.count, args.seed)
        for o in failures(outs):
            if args.show in o.cls:
                print(every[o.index], o, sep="\n  -> ", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
