"""A/B of the guard's decisions (not its speed): do two copies of cgwatch stop the same
traces at the same checks, with the same figures?

    python -m bench.guard_same BASE/cgwatch CHANGED/cgwatch [--seeds N] [--checks N]

Both packages are loaded side by side (bench.ab.load); their Guards read one stub monitor
(`_Job`: what a v2 Monitor's `available_memory()`, `levels()`, `status` and `layout()`
answer, from the trace's figures; the guard's own reading, filtering and PSI parsing run as
they do on a real one) on one fake clock (each package's `guard._monotonic`). Each
seed is a random trace: a leak, a sawtooth, stairs, a random walk or a mix, in a limit of
512 MiB, 2 or 8 GiB resized now and then, checks 5 ms to 0.6 s apart, sometimes
memory.high with a PSI total and `high` rises, OOM kills and timed saves; run under four
option sets (the defaults, interval 0, short buckets with a short throttle, a byte reserve
with a given save time). Every field of BASE's Verdict is compared at every check; the
first difference of each trace is printed. For a refactor the answer must be "every trace
the same" (branch core against main: 160 of 160, 240,000 checks); for a change of the rule it shows
where the change acts. Always exits 0.

The kills and `high` rises are given to each guard's Events handler directly (the guard is
made with events=False, so no thread's timing enters): `_on_event` on a Guard of before the
core/shell split, `_reader.on_event` after; those private names are used here only.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import logging
import random
from types import ModuleType, SimpleNamespace
from typing import Any, Callable, Optional

from bench.ab import load

MiB = 1 << 20
GiB = 1 << 30

FIELDS = ("stop", "trigger", "level", "limit", "headroom", "reserve", "growth", "seconds_left",
          "lead", "pressure", "throttled_for", "killed", "step", "rank", "rise")
OPTIONS: tuple[dict[str, Any], ...] = (
    {}, {"interval": 0.0}, {"interval": 0.0, "bucket": 0.05, "throttle_seconds": 0.5},
    {"reserve": "200M", "checkpoint_seconds": 3.0, "jitter": 0.2})
PSI = ("some avg10=0.00 avg60=0.00 avg300=0.00 total={t}\n"
       "full avg10=0.00 avg60=0.00 avg300=0.00 total={t}\n")


class _Rise:
    """A counter rise as Events delivers it (the fields the guard reads)."""

    def __init__(self, counter: str, old: int) -> None:
        self.counter, self.old, self.new = counter, old, old + 1
        self.propagated, self.cgroup_path = False, "/job"


class _Job:
    """A v2 job's level as the guard asks a Monitor about it: its limit, usage (inactive 0),
    memory.high and memory.pressure's total (None: none)."""

    def __init__(self, limit: int, usage: int, high: Optional[int], psi: Optional[int]) -> None:
        self.limit, self.usage, self.high, self.psi = limit, usage, high, psi
        self.status = SimpleNamespace(version=2)

    def available_memory(self) -> int:
        return self.limit - self.usage

    def levels(self) -> list[Any]:
        return [SimpleNamespace(cgroup_path="/job", limit=self.limit, usage=self.usage,
                                inactive_file=0, headroom=self.limit - self.usage,
                                high=self.high, hidden=False)]

    def layout(self) -> Any:
        return SimpleNamespace(levels=[SimpleNamespace(cgroup_path="/job", read=self._read)])

    def _read(self, name: str) -> str:
        if self.psi is None:
            raise FileNotFoundError(name)
        return PSI.format(t=self.psi)


def _handler(guard: Any) -> Callable[[Any], None]:
    reader = getattr(guard, "_reader", None)
    return reader.on_event if reader is not None else guard._on_event


def _next_size(rnd: random.Random, shape: str, ws: int, limit: int, dt: float, t: float,
               piece: int) -> int:
    if shape == "leak":
        ws += int(limit * 0.002 * dt * rnd.uniform(0, 3))
    elif shape == "sawtooth":
        ws = int(limit * (0.3 + 0.5 * ((t % 2.0) / 2.0)))
    elif shape == "stairs":
        ws += piece if rnd.random() < 0.05 else 0
    elif shape == "walk":
        ws += int(rnd.gauss(0, limit * 0.02))
    else:
        ws += int(limit * 0.001 * dt) + (piece if rnd.random() < 0.02 else 0) \
            - (piece if rnd.random() < 0.015 else 0)
    if ws > limit * 0.99 or ws < limit * 0.02:  # the job restarts its shape
        ws = int(limit * rnd.uniform(0.1, 0.5))
    return ws


def trace(packages: dict[str, ModuleType], seed: int, options: dict[str, Any], checks: int,
          triggers: collections.Counter[str]) -> str:
    """Run one trace through both packages; "" when they agreed at every check, else the
    first difference."""
    rnd = random.Random(seed)
    clock = [100.0]
    guard_modules = [importlib.import_module(p.__name__ + ".guard") for p in packages.values()]
    for module in guard_modules:
        module._monotonic = lambda: clock[0]
    limit = rnd.choice([512 * MiB, 2 * GiB, 8 * GiB])
    high = rnd.random() < 0.4
    job = _Job(limit, 0, int(limit * 0.8) if high else None, 0 if high else None)
    guards = [gm.Guard(job, events=False, **options) for gm in guard_modules]
    handlers = [_handler(g) for g in guards]
    shape = rnd.choice(["leak", "sawtooth", "stairs", "walk", "mix"])
    ws, piece = int(limit * rnd.uniform(0.05, 0.5)), int(limit * rnd.uniform(0.02, 0.15))
    kills = rises = 0
    for step in range(checks):
        dt = rnd.choice([0.005, 0.01, 0.02, 0.05, 0.1, 0.1, 0.3, rnd.uniform(0.0, 0.6)])
        clock[0] += dt
        ws = _next_size(rnd, shape, ws, job.limit, dt, clock[0], piece)
        job.usage = max(0, ws)
        if job.psi is not None:
            job.psi += int(dt * 1e6 * rnd.choice([0.0, 0.05, 0.5]))
            if rnd.random() < 0.3:
                for h in handlers:
                    h(_Rise("high", rises))
                rises += 1
        if rnd.random() < 0.002:
            for h in handlers:
                h(_Rise("oom_kill", kills))
            kills += 1
        if rnd.random() < 0.003:
            job.limit = int(job.limit * rnd.uniform(0.8, 1.25))
        if rnd.random() < 0.01:
            seconds = rnd.uniform(0.1, 5)
            for g in guards:
                g.saved(seconds)
        verdicts = [g.check(step) for g in guards]
        seen = [tuple(getattr(v, f) for f in FIELDS) for v in verdicts]
        if any(x != seen[0] for x in seen[1:]):
            return f"seed {seed} {options} {shape}, check {step}: " + " | ".join(
                f"{alias}: {v.message()}" for alias, v in zip(packages, verdicts))
        triggers[verdicts[0].trigger or "go on"] += 1
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="+", help="cgwatch package directories, A first")
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--checks", type=int, default=1500)
    args = parser.parse_args()
    logging.getLogger("cgwatch").disabled = True  # each stop's line, once per package
    packages = {f"cgwatch_{chr(ord('a') + i)}": load(f"cgwatch_{chr(ord('a') + i)}", d)
                for i, d in enumerate(args.packages)}
    for alias, d in zip(packages, args.packages):
        print(f"{alias[-1].upper()} = {d}")
    triggers: collections.Counter[str] = collections.Counter()
    same = total = 0
    for seed in range(args.seeds):
        for options in OPTIONS:
            total += 1
            first = trace(packages, seed, options, args.checks, triggers)
            same += not first
            if first:
                print(first)
    print(f"{same} of {total} traces the same at every check; verdicts of those checks: "
          + ", ".join(f"{k} {n}" for k, n in triggers.most_common()))


if __name__ == "__main__":
    main()
