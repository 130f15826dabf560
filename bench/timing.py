"""Interleaved best-of-N timing of several callables in one process.

Each candidate gets a batch size calibrated so one batch lasts about `batch_seconds`; then every
round runs one batch of each candidate, in an order rotated from round to round, so slow drifts
of a noisy machine (frequency, neighbours) hit all candidates alike. The figure kept is the
best round (the least disturbed), per call; the median is kept too, to show the spread.
"""

from __future__ import annotations

import gc
import itertools
import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    """Per-call seconds of one candidate: best and median over the rounds."""

    best: float
    median: float
    calls_per_batch: int
    rounds: int

    def as_dict(self) -> dict[str, float]:
        return {"best_ns": self.best * 1e9, "median_ns": self.median * 1e9,
                "calls_per_batch": self.calls_per_batch, "rounds": self.rounds}


def _batch(fn: Callable[[], object], n: int) -> float:
    """Seconds for n calls, with the collector off (as timeit does)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in itertools.repeat(None, n):
            fn()
        return time.perf_counter() - start
    finally:
        if enabled:
            gc.enable()


def calibrate(fn: Callable[[], object], batch_seconds: float) -> int:
    """Calls per batch so that one batch takes about batch_seconds (at least 1)."""
    _batch(fn, 3)  # warm up: a first call may build state (the default monitor) or fill caches
    n = 1
    while True:
        elapsed = _batch(fn, n)
        if elapsed >= batch_seconds / 4 or n >= 1 << 24:
            return max(1, int(n * batch_seconds / max(elapsed, 1e-9)))
        n *= 4


def interleaved(candidates: dict[str, Callable[[], object]], rounds: int,
                batch_seconds: float) -> dict[str, Timing]:
    """Time every candidate, interleaved round by round; best-of-`rounds` per call."""
    names = list(candidates)
    sizes = {name: calibrate(candidates[name], batch_seconds) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(_batch(candidates[name], sizes[name]) / sizes[name])
    return {name: Timing(min(s), statistics.median(s), sizes[name], rounds)
            for name, s in samples.items()}
