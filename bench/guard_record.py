"""What `Guard(record=FILE)` adds to a check: a default guard's check (far from every
threshold) and a sampling one (`interval=0`), each with and without a record, timed
interleaved (bench/timing.py, best and median of 40 rounds) in one cgroup limited to 4 GiB.

    sudo .venv/bin/python -m bench.guard_record
"""

from __future__ import annotations

import os
import tempfile

import cgwatch
from bench import cgroups, timing


def main() -> None:
    with cgroups.nest(1, "leaf"), tempfile.TemporaryDirectory() as d:
        monitor = cgwatch.Monitor()
        beyond = 2 * monitor.total_memory()  # a reserve no headroom reaches: always stop
        guards = {
            "far": cgwatch.Guard(monitor, events=False),
            "far + record": cgwatch.Guard(monitor, events=False,
                                          record=os.path.join(d, "far.rec")),
            "sampling": cgwatch.Guard(monitor, reserve=beyond, interval=0.0, events=False),
            "sampling + record": cgwatch.Guard(monitor, reserve=beyond, interval=0.0,
                                               events=False,
                                               record=os.path.join(d, "sampling.rec")),
        }
        try:
            timings = timing.interleaved({k: g.check for k, g in guards.items()}, 40, 0.01)
        finally:
            for g in guards.values():
                g.close()
            monitor.close()
        for name, t in timings.items():
            print(f"{name:18s} best {t.best * 1e9:8.0f} ns   median {t.median * 1e9:8.0f} ns")
        for name in sorted(os.listdir(d)):
            print(f"{name}: {os.path.getsize(os.path.join(d, name))} bytes")


if __name__ == "__main__":
    main()
