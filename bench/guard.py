"""What `Guard.check()` costs per training step, next to `available_memory()` and
`psutil.virtual_memory()` timed in the same rounds.

- *far*: a default guard far from every threshold: between its samples (every 0.5 s) a
  check is `time.monotonic()` and `available_memory()`.
- *near, between samples*: the reserve set above the limit, so the headroom is under it and
  the verdict says stop; between samples (every `near_interval`, 0.05 s, when near) a check
  is again one `available_memory()` and a few comparisons.
- *a sampling check*: `interval=0`, so every check samples: `levels()` (every file of every
  level), the forecast and the policy. Far from thresholds one check in 0.5 s does this,
  near them one in 0.05 s.

*Near, per 10 ms step* is then worked out, not timed: a check between samples plus a fifth
of a sampling check (0.01 s / 0.05 s). All without an Events object (the OOM-kill trigger
costs a check one attribute comparison; Events itself works on the background thread).
Goals: far about available_memory()'s cost; near under 1% of a 10 ms step (100 us).
"""

from __future__ import annotations

from typing import Any, Callable

import psutil

import cgwatch
from bench import timing

STEP_SECONDS = 0.010  # the training step the goal is stated against


def _psutil_available() -> int:
    return int(psutil.virtual_memory().available)


def scenario(name: str, rounds: int, batch_seconds: float) -> dict[str, Any]:
    """Time the guard's checks where this process is now (a limited cgroup)."""
    monitor = cgwatch.Monitor()
    beyond = 2 * monitor.total_memory()  # a reserve no headroom reaches
    far = cgwatch.Guard(monitor, events=False)
    near = cgwatch.Guard(monitor, reserve=beyond, events=False)
    sampling = cgwatch.Guard(monitor, reserve=beyond, interval=0.0, events=False)
    guards = {"far": far, "near": near, "sampling": sampling}
    try:
        verdicts = {k: g.check(0).trigger for k, g in guards.items()}
        if verdicts != {"far": "", "near": "reserve", "sampling": "reserve"}:
            raise RuntimeError(f"the guards did not decide as set up: {verdicts}")
        candidates: dict[str, Callable[[], object]] = {
            "guard.check (far)": far.check,
            "guard.check (near, between samples)": near.check,
            "guard.check (a sampling check)": sampling.check,
            "cgwatch.available": monitor.available_memory,
            "psutil": _psutil_available,
        }
        timings = timing.interleaved(candidates, rounds, batch_seconds)
        levels = len(monitor.levels())
        near_interval = near.near_interval
    finally:
        for g in guards.values():
            g.close()
        monitor.close()
    per_step = {k: getattr(timings["guard.check (near, between samples)"], k)
                + getattr(timings["guard.check (a sampling check)"], k)
                * STEP_SECONDS / near_interval for k in ("best", "median")}
    out = {k: v.as_dict() for k, v in timings.items()}
    out["guard.check (near, per 10 ms step)"] = {"best_ns": per_step["best"] * 1e9,
                                                 "median_ns": per_step["median"] * 1e9}
    return {"name": name, "levels": levels, "verdicts": verdicts,
            "near_interval": near_interval, "timings": out}
