"""Call cost of total_memory() / available_memory(): cgwatch vs psutil vs the uncached walk.

One scenario = one place in the cgroup tree: a fresh cgwatch Monitor is made there, checked
against the uncached walk (total_memory() must be equal; available_memory() close, since usage
moves between reads), and then all candidates are timed interleaved in the same rounds.
"""

from __future__ import annotations

from typing import Any, Callable

import psutil

import cgwatch
from bench import reference, timing


def _psutil_total() -> int:
    return int(psutil.virtual_memory().total)


def _check(monitor: cgwatch.Monitor) -> dict[str, Any]:
    """cgwatch's answers against the uncached walk's, read around them."""
    ref_total = reference.total_memory()
    ref_before = reference.available_memory()
    total, available = monitor.total_memory(), monitor.available_memory()
    ref_after = reference.available_memory()
    slack = max(16 << 20, ref_before // 100)  # usage and host figures move between reads
    low, high = min(ref_before, ref_after) - slack, max(ref_before, ref_after) + slack
    return {
        "total_equal": total == ref_total,
        "total": total,
        "total_uncached": ref_total,
        "available_close": low <= available <= high,
        "available": available,
        "available_uncached": ref_before,
    }


def scenario(name: str, rounds: int, batch_seconds: float,
             with_module_functions: bool = False) -> dict[str, Any]:
    """Time every candidate where this process is now; `name` labels the row."""
    monitor = cgwatch.Monitor()
    floor = reference.KeptReads()
    try:
        candidates: dict[str, Callable[[], object]] = {
            "cgwatch.total": monitor.total_memory,
            "cgwatch.available": monitor.available_memory,
            "psutil": _psutil_total,
            "uncached.total": reference.total_memory,
            "uncached.available": reference.available_memory,
            "floor.available": floor,
        }
        if with_module_functions:
            candidates["cgwatch.total (module function)"] = cgwatch.total_memory
            candidates["cgwatch.available (module function)"] = cgwatch.available_memory
        check = _check(monitor)
        timings = timing.interleaved(candidates, rounds, batch_seconds)
        status = monitor.status
        limited_levels = sum(1 for lvl in monitor.levels() if lvl.limit is not None)
    finally:
        monitor.close()
        floor.close()
    version, leaf, top = reference.resolve()
    return {
        "name": name,
        "levels": reference.level_count(leaf, top),
        "limited_levels": limited_levels,
        "mode": status.mode,
        "status_reason": status.reason,
        "check": check,
        "timings": {k: v.as_dict() for k, v in timings.items()},
    }
