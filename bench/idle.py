"""Idle cost of the monitor thread, monitor start-up time, and RSS added by cgwatch.

Idle: the kernel's per-thread counters for the thread named "cgwatch", read before and after a
quiet period in which this process only sleeps: voluntary context switches (each is one block
then wake-up), CPU time from /proc/self/task/<tid>/stat (utime + stime, clock ticks) and
schedstat (ns on CPU, exact). RSS and import time are measured in fresh subprocesses, so
nothing this process already loaded is counted.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

CLK_TCK = os.sysconf("SC_CLK_TCK")


def thread_counters(tid: int) -> dict[str, float]:
    """Wake-up and CPU counters of one thread of this process."""
    task = f"/proc/self/task/{tid}"
    with open(f"{task}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15 of proc(5).
    cpu_ticks = int(fields[11]) + int(fields[12])
    status = {}
    with open(f"{task}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    with open(f"{task}/schedstat") as f:
        run_ns, _wait_ns, slices = (int(x) for x in f.read().split())
    return {
        "voluntary": int(status["voluntary_ctxt_switches"]),
        "involuntary": int(status["nonvoluntary_ctxt_switches"]),
        "cpu_s": cpu_ticks / CLK_TCK,
        "run_ns": run_ns,
        "timeslices": slices,
    }


def cgwatch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "cgwatch" and t.is_alive()]


def idle_cost(seconds: float, migration_interval: float) -> dict[str, Any]:
    """Counters of the one live "cgwatch" thread over `seconds` of sleeping."""
    threads = cgwatch_threads()
    if len(threads) != 1 or threads[0].native_id is None:
        raise RuntimeError(f"expected one live cgwatch thread, found {len(threads)}")
    tid = threads[0].native_id
    before = thread_counters(tid)
    start = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    after = thread_counters(tid)
    delta = {key: after[key] - before[key] for key in before}
    timer_ticks = math.ceil(elapsed / migration_interval)
    return {
        "seconds": elapsed,
        "wakeups": delta["voluntary"],
        "involuntary_switches": delta["involuntary"],
        "timer_ticks_expected": timer_ticks,
        "wakeups_beyond_timer": max(0, delta["voluntary"] - timer_ticks),
        "cpu_ms": delta["run_ns"] / 1e6,
        "cpu_ms_stat": delta["cpu_s"] * 1e3,
        "cpu_us_per_wakeup": delta["run_ns"] / 1e3 / max(1, delta["voluntary"]),
    }


def idle_scale(make: Callable[[], Any], counts: tuple[int, ...],
               seconds: float) -> dict[str, Any]:
    """Idle cost of the one loop thread with N monitors in this process, for each N: the
    process's one timer and one /proc/self/cgroup read serve them all (ticker.py), so the
    figure should not grow with N. `cpu_percent` is of one core."""
    out: dict[str, Any] = {}
    for count in counts:
        monitors = [make() for _ in range(count)]
        try:
            for m in monitors:
                m.total_memory()
            time.sleep(0.2)  # start-up work done
            cost = idle_cost(seconds, monitors[0].migration_interval)
            cost["cpu_percent"] = cost["cpu_ms"] / 10 / cost["seconds"]
            cost["modes"] = sorted({m.status.mode for m in monitors})
            out[str(count)] = cost
        finally:
            for m in monitors:
                m.close()
        quiet(10.0)
    return out


def quiet(timeout: float = 0.5) -> bool:
    """Wait until no "cgwatch" thread is alive; False if one still is after `timeout` s.

    A start-up measured while the thread of a closed monitor lingers would skip the thread
    start every other one pays (the shared loop thread exits on its own after the last
    close(), and has been seen to wait for a cancelled timer, up to migration_interval)."""
    deadline = time.monotonic() + timeout
    while cgwatch_threads():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def startup_seconds(make: Callable[[], Any]) -> Optional[float]:
    """Seconds to construct one monitor from a process with no cgwatch thread (so it
    resolves, reads, watches and starts the thread), then close it; None if a thread did not
    go away in time (the sample would not be like the others)."""
    if not quiet():
        return None
    start = time.perf_counter()
    monitor = make()
    seconds = time.perf_counter() - start
    monitor.close()
    return seconds


def startup_time(make: Callable[[], Any], repeat: int) -> dict[str, float]:
    """Best and median of `repeat` start-ups (see startup_seconds), from at most 3x as many
    attempts."""
    times: list[float] = []
    attempts = 0
    while len(times) < repeat and attempts < 3 * repeat:
        attempts += 1
        seconds = startup_seconds(make)
        if seconds is not None:
            times.append(seconds)
    if not times:
        raise RuntimeError("a cgwatch thread never went away between start-ups")
    return {"best_ms": min(times) * 1e3, "median_ms": statistics.median(times) * 1e3,
            "repeat": len(times), "skipped": attempts - len(times)}


_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, {path!r})
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
import {pre}
out = {{"rss0": rss()}}
t = time.perf_counter()
import {module}
out["import_ms"] = (time.perf_counter() - t) * 1e3
out["rss_import"] = rss()
if {start}:
    t = time.perf_counter()
    cgwatch.total_memory()
    cgwatch.available_memory()
    out["first_call_ms"] = (time.perf_counter() - t) * 1e3
    time.sleep(0.2)
    out["rss_started"] = rss()
print(json.dumps(out))
"""


# What cgwatch imports from elsewhere: a real application (DeepSpeed, a server) has most of it
# loaded already, so cgwatch's own share is measured with these imported first.
DEPENDENCIES = "threading, select, weakref, heapq, collections, functools, struct, ctypes"


def _child(module: str, start: bool, package_parent: str, pre: str = "os") -> dict[str, float]:
    code = _CHILD.format(path=package_parent, module=module, start=start, pre=pre)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rss_and_import(package_parent: str, repeat: int) -> dict[str, float]:
    """Median over fresh interpreters: RSS added by `import cgwatch` and by starting the
    default monitor (first query), with `import psutil` alone for comparison, and cgwatch's
    own share (its dependencies imported first)."""
    runs = [_child("cgwatch", True, package_parent) for _ in range(repeat)]
    psutil_runs = [_child("psutil", False, package_parent) for _ in range(repeat)]
    own_runs = [_child("cgwatch", False, package_parent, DEPENDENCIES) for _ in range(repeat)]

    def med(rows: list[dict[str, float]], fn: Callable[[dict[str, float]], float]) -> float:
        return statistics.median(fn(r) for r in rows)

    return {
        "import_ms": med(runs, lambda r: r["import_ms"]),
        "first_call_ms": med(runs, lambda r: r["first_call_ms"]),
        "rss_import_kib": med(runs, lambda r: (r["rss_import"] - r["rss0"]) / 1024),
        "rss_start_kib": med(runs, lambda r: (r["rss_started"] - r["rss_import"]) / 1024),
        "psutil_import_ms": med(psutil_runs, lambda r: r["import_ms"]),
        "psutil_rss_import_kib": med(psutil_runs, lambda r: (r["rss_import"] - r["rss0"]) / 1024),
        "own_import_ms": med(own_runs, lambda r: r["import_ms"]),
        "own_rss_import_kib": med(own_runs, lambda r: (r["rss_import"] - r["rss0"]) / 1024),
        "repeat": repeat,
    }
