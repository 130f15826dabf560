"""Event latency: a write to a limit file until total_memory() returns the new value.

This process is both sides. It writes the new limit with one os.write(2) on a descriptor kept
open (as a container runtime or kubelet does), then polls total_memory() until it answers the
new value; the monitor's background thread has to notice the inotify event and publish a new
snapshot in between. Two pollers:

- "spin": a tight loop calling total_memory() and perf_counter(), as the target specifies. The
  polling thread never releases the GIL, so every time the monitor thread gives the GIL up
  (each syscall it makes) it may have to wait a whole switch interval (5 ms by default) to get
  it back: this poller measures the library's exposure to CPython's GIL hand-off.
- "spin, switch interval 0.5 ms": the same with sys.setswitchinterval(0.0005) for the trials
  only, a diagnostic: if the tail shrinks about tenfold, the GIL hand-off is the cause.
- "yield": the poller sleeps 50 us between queries, like an application that does I/O; this
  shows the latency of the pipeline itself (kernel event, thread wake-up, re-read, publish).
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from typing import Any, Callable, Optional

from bench.cgroups import Nest

PAGE = os.sysconf("SC_PAGE_SIZE")
TIMEOUT = 1.0  # seconds; a trial that takes longer is counted as a timeout at this value


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(seconds: list[float]) -> dict[str, Any]:
    values = sorted(seconds)
    return {
        "trials": len(values),
        "p50_ms": percentile(values, 50) * 1e3,
        "p99_ms": percentile(values, 99) * 1e3,
        "max_ms": values[-1] * 1e3,
        "over_5ms": sum(1 for v in values if v > 0.005),
        "timeouts": sum(1 for v in values if v >= TIMEOUT),
    }


def _wait_spin(query: Callable[[], int], want: int, deadline: float) -> None:
    while query() != want:
        if time.perf_counter() > deadline:
            return


def _wait_yield(query: Callable[[], int], want: int, deadline: float) -> None:
    while query() != want:
        time.sleep(50e-6)
        if time.perf_counter() > deadline:
            return


# name -> (wait loop, GIL switch interval to run it with; None keeps the interpreter's)
POLLERS: dict[str, tuple[Callable[[Callable[[], int], int, float], None], Optional[float]]] = {
    "spin": (_wait_spin, None),
    "spin, switch interval 0.5 ms": (_wait_spin, 0.0005),
    "yield": (_wait_yield, None),
}


def limit_write_seconds(nest: Nest, query: Callable[[], int], base: int, trials: int,
                        poller: str) -> list[float]:
    """`trials` limit writes at the deepest level of `nest` (this process must be inside it and
    `query` must be a monitor's total_memory() there); seconds from each write to new value."""
    wait, interval = POLLERS[poller]
    rng = random.Random(7)
    fd = os.open(nest.limit_path(nest.leaf), os.O_WRONLY)
    seconds = []
    saved = sys.getswitchinterval()
    try:
        if interval is not None:
            sys.setswitchinterval(interval)
        for i in range(trials):
            want = base + (1 + i % 2) * 16 * PAGE  # alternate; page-aligned, so read back as is
            data = str(want).encode()
            start = time.perf_counter()
            os.write(fd, data)
            wait(query, want, start + TIMEOUT)
            seconds.append(min(time.perf_counter() - start, TIMEOUT))
            time.sleep(rng.uniform(0.002, 0.006))  # let the thread settle; no coalesced events
        os.write(fd, str(base).encode())
    finally:
        sys.setswitchinterval(saved)
        os.close(fd)
    return seconds


def limit_write_latency(nest: Nest, query: Callable[[], int], base: int, trials: int,
                        poller: str) -> dict[str, Any]:
    """p50 / p99 / max of `limit_write_seconds`."""
    return summarize(limit_write_seconds(nest, query, base, trials, poller))


def bare_thread_seconds(nest: Nest, base: int, trials: int) -> list[float]:
    """The floor for any design built on a Python thread, with no cgwatch involved: a thread
    blocked in poll(2) on an inotify watch of the limit file publishes a counter as the very
    first thing after waking (no syscall, so it never gives the GIL up before publishing)
    while this thread spins on that counter, exactly as the "spin" poller does."""
    import select
    import threading

    import inotify_simple

    path = nest.limit_path(nest.leaf)
    inotify = inotify_simple.INotify(nonblocking=True)
    inotify.add_watch(path, inotify_simple.flags.MODIFY)
    wakeups = [0]
    stop = [False]

    def run() -> None:
        poller = select.poll()
        poller.register(inotify.fileno(), select.POLLIN)
        while not stop[0]:
            if poller.poll(200):
                wakeups[0] += 1
                try:
                    os.read(inotify.fileno(), 65536)
                except BlockingIOError:
                    pass

    thread = threading.Thread(target=run, name="bare-floor", daemon=True)
    thread.start()
    rng = random.Random(7)
    fd = os.open(path, os.O_WRONLY)
    seconds = []
    try:
        for i in range(trials):
            seen = wakeups[0]
            start = time.perf_counter()
            os.write(fd, str(base + (1 + i % 2) * 16 * PAGE).encode())
            while wakeups[0] == seen:
                if time.perf_counter() > start + TIMEOUT:
                    break
            seconds.append(min(time.perf_counter() - start, TIMEOUT))
            time.sleep(rng.uniform(0.002, 0.006))
        os.write(fd, str(base).encode())
    finally:
        stop[0] = True
        thread.join()
        os.close(fd)
        inotify.close()
    return seconds
