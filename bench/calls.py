"""Call cost of total_memory() / available_memory(): cgwatch vs psutil vs the uncached walk.

One scenario = one place in the cgroup tree: a fresh cgwatch Monitor is made there, checked
against the uncached walk (total_memory() must be equal; available_memory() close, since usage
moves between reads), and then all candidates are timed interleaved in the same rounds.

Besides the default monitor (its queries check for queued limit writes and, every
confirm_interval, re-read /proc/self/cgroup), the same place times the freshness modes:
`fresh=False` (the thread-kept cache, no per-call check), `thread=False` (no background
thread; queries keep the cache exact themselves) and `confirm_interval=0` (every call takes
the confirm slow path), and polling (`use_inotify=False`: a pread of each limit file per
query instead of the inotify poll), with the bare syscalls under those checks as floors. A
cgwatch whose Monitor does not take these arguments (before the freshness checks) just has
fewer rows.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import psutil

import cgwatch
from bench import reference, timing

# Monitor variants timed next to the default one: candidate suffix -> keyword arguments
VARIANTS: dict[str, dict[str, Any]] = {
    "fresh=False": {"fresh": False},
    "thread=False": {"thread": False},
    "confirm every call": {"confirm_interval": 0.0},
    # No inotify (CGWATCH_INOTIFY=0, or the uid's quota left to others): each query preads
    # every level's limit file, so the answer stays exact.
    "polling": {"use_inotify": False},
}


def _psutil_total() -> int:
    return int(psutil.virtual_memory().total)


def variant(package: Any, **kwargs: Any) -> Optional[Any]:
    """package.Monitor(**kwargs), or None if this cgwatch's Monitor has no such arguments
    (asked of its signature, so a TypeError inside the constructor is not mistaken for it)."""
    if not set(kwargs) <= set(inspect.signature(package.Monitor).parameters):
        return None
    return package.Monitor(**kwargs)


def _check(monitor: cgwatch.Monitor, others: list[Any]) -> dict[str, Any]:
    """cgwatch's answers against the uncached walk's, read around them."""
    ref_total = reference.total_memory()
    ref_before = reference.available_memory()
    total, available = monitor.total_memory(), monitor.available_memory()
    ref_after = reference.available_memory()
    slack = max(16 << 20, ref_before // 100)  # usage and host figures move between reads
    low, high = min(ref_before, ref_after) - slack, max(ref_before, ref_after) + slack
    return {
        # every variant must answer the same limits (they differ only in how they keep them)
        "total_equal": total == ref_total and all(m.total_memory() == ref_total
                                                  for m in others),
        "total": total,
        "total_uncached": ref_total,
        "available_close": low <= available <= high,
        "available": available,
        "available_uncached": ref_before,
    }


def _variants() -> dict[str, Any]:
    made = {name: variant(cgwatch, **kwargs) for name, kwargs in VARIANTS.items()}
    return {name: m for name, m in made.items() if m is not None}


def _freshness_candidates(variants: dict[str, Any],
                          floors: reference.FreshnessFloors) -> dict[str, Callable[[], object]]:
    candidates: dict[str, Callable[[], object]] = {}
    for name, monitor in variants.items():
        candidates[f"cgwatch.total ({name})"] = monitor.total_memory
    if "fresh=False" in variants:
        # how much of available_memory() is the freshness check (the 1.2x floor target)
        candidates["cgwatch.available (fresh=False)"] = variants["fresh=False"].available_memory
    candidates["floor.pending"] = floors.pending
    candidates["floor.confirm"] = floors.confirm
    return candidates


def scenario(name: str, rounds: int, batch_seconds: float,
             with_module_functions: bool = False) -> dict[str, Any]:
    """Time every candidate where this process is now; `name` labels the row."""
    monitor = cgwatch.Monitor()
    variants = _variants()
    floor = reference.KeptReads()
    floors = reference.FreshnessFloors()
    try:
        candidates: dict[str, Callable[[], object]] = {
            "cgwatch.total": monitor.total_memory,
            "cgwatch.available": monitor.available_memory,
            "psutil": _psutil_total,
            "uncached.total": reference.total_memory,
            "uncached.available": reference.available_memory,
            "floor.available": floor,
            **_freshness_candidates(variants, floors),
        }
        if with_module_functions:
            candidates["cgwatch.total (module function)"] = cgwatch.total_memory
            candidates["cgwatch.available (module function)"] = cgwatch.available_memory
        check = _check(monitor, list(variants.values()))
        timings = timing.interleaved(candidates, rounds, batch_seconds)
        status = monitor.status
        modes = {n: {"mode": m.status.mode, "thread": getattr(m.status, "thread", None)}
                 for n, m in variants.items()}
        limited_levels = sum(1 for lvl in monitor.levels() if lvl.limit is not None)
    finally:
        for m in [monitor, *variants.values()]:
            m.close()
        floor.close()
        floors.close()
    version, leaf, top = reference.resolve()
    return {
        "name": name,
        "levels": reference.level_count(leaf, top),
        "limited_levels": limited_levels,
        "mode": status.mode,
        "status_reason": status.reason,
        "variants": modes,
        "check": check,
        "timings": {k: v.as_dict() for k, v in timings.items()},
    }
