"""What one Prometheus scrape of cgwatch.prometheus costs, at 1, 3 and 10 nested cgroups.

    sudo .venv/bin/python -m bench.scrape [--quick] [--json out.json]

Real cgroups below our own (bench/cgroups.py), every level limited (each level then has every
file a scrape reads); this process moves into the deepest one, as `cgwatch serve` runs inside
the job's cgroup. Three figures per depth, timed interleaved (bench/timing.py), best round and
median, per scrape:
- reads: `MonitorCollector.read()`: the two answers, the status, `levels()` and every level's
  counter files (v1: memory.oom_control, memory.failcnt; v2: memory.events, memory.pressure);
- families: reads plus building the metric families (`collect()`);
- text: a whole `generate_latest(registry)`, what the HTTP handler sends (goal: <= 1 ms at 10).
"Levels" counts every directory from the process's cgroup to the top of the mount. Also shown:
the threads the collector adds (0: it reads at scrape time, nothing runs in between).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from bench import cgroups
from bench.timing import interleaved
from cgwatch import Monitor
from cgwatch.prometheus import MonitorCollector

DEPTHS = (1, 3, 10)
GOAL_SECONDS = 1e-3  # a scrape at 10 levels


def measure(depth: int, rounds: int, batch_seconds: float) -> dict[str, Any]:
    with cgroups.nest(depth, "all") as n, cgroups.inside(n):
        threads_before = threading.active_count()
        monitor = Monitor(thread=False)
        collector = MonitorCollector(monitor)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        generate_latest(registry)  # first use opens the kept descriptors
        threads_added = threading.active_count() - threads_before
        try:
            levels = len(monitor.levels())
            timings = interleaved({
                "reads": collector.read,
                "families": lambda: list(collector.collect()),
                "text": lambda: generate_latest(registry),
            }, rounds, batch_seconds)
            size = len(generate_latest(registry))
        finally:
            monitor.close()
    return {"depth": depth, "levels": levels, "version": n.version,
            "threads_added": threads_added, "bytes": size,
            **{name: t.as_dict() for name, t in timings.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scrape", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (~2 s)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    why = cgroups.unavailable_reason()
    if why:
        print(f"bench.scrape: skipped: {why}")
        return 0
    rounds, batch = (5, 0.005) if args.quick else (25, 0.01)
    rows = [measure(depth, rounds, batch) for depth in DEPTHS]
    print(f"Scrape cost of cgwatch.prometheus (cgroup v{rows[0]['version']}, every level "
          f"limited; best round, median in parentheses; {rounds} rounds)")
    print(f"{'depth':>5} {'levels':>6} {'reads':>17} {'families':>17} {'text':>17} "
          f"{'bytes':>6} {'threads':>7}")
    for row in rows:
        cells = [f"{row[k]['best_ns'] / 1e3:7.1f} ({row[k]['median_ns'] / 1e3:6.1f}) us"
                 for k in ("reads", "families", "text")]
        print(f"{row['depth']:>5} {row['levels']:>6} {cells[0]:>17} {cells[1]:>17} "
              f"{cells[2]:>17} {row['bytes']:>6} {row['threads_added']:>7}")
    deepest = rows[-1]["text"]["best_ns"] / 1e9
    verdict = "ok" if deepest <= GOAL_SECONDS else "MISS"
    print(f"goal: a whole scrape at 10 levels <= {GOAL_SECONDS * 1e3:.0f} ms: "
          f"{deepest * 1e3:.3f} ms  {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
