"""A/B: copies of the cgwatch package timed against each other in one process.

    python -m bench.ab BASE/cgwatch CHANGED/cgwatch [MORE/cgwatch ...] [--quick]

For judging a proposed library change on a noisy machine: the packages are loaded side by
side (as cgwatch_a, cgwatch_b, ...), their queries are timed interleaved in the same rounds, in
the same cgroups, next to psutil; limit-write latency alternates blocks of trials between a
monitor of each (never two alive at once, so their threads do not compete).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Callable

import psutil

from bench import cgroups, events_latency, latency, timing

SHAPES = ((0, "none"), (1, "leaf"), (10, "leaf"), (10, "all"))


def load(alias: str, package_dir: str) -> ModuleType:
    """Import the package in `package_dir` under the name `alias`."""
    init = os.path.join(os.path.abspath(package_dir), "__init__.py")
    spec = importlib.util.spec_from_file_location(
        alias, init, submodule_search_locations=[os.path.dirname(init)])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {package_dir}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)
    return module


def _calls(packages: dict[str, ModuleType], rounds: int, batch: float) -> dict[str, float]:
    monitors = {name: package.Monitor() for name, package in packages.items()}
    try:
        candidates: dict[str, Callable[[], object]] = {"psutil": psutil.virtual_memory}
        for name, monitor in monitors.items():
            candidates[f"{name}.total"] = monitor.total_memory
            candidates[f"{name}.available"] = monitor.available_memory
            candidates[f"{name}.module total"] = packages[name].total_memory
        return {k: v.best * 1e9 for k, v in
                timing.interleaved(candidates, rounds, batch).items()}
    finally:
        for name, monitor in monitors.items():
            monitor.close()
            packages[name].default_monitor().close()  # it must not follow us to the next place
            packages[name]._default = None


def _latency(packages: dict[str, ModuleType], nest: cgroups.Nest, base: int, trials: int,
             poller: str, block: int = 50) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {name: [] for name in packages}
    if poller == "spin":
        seconds["floor (bare thread)"] = []
    while min(len(s) for s in seconds.values()) < trials:
        for name, package in packages.items():
            with package.Monitor() as monitor:
                seconds[name] += latency.limit_write_seconds(
                    nest, monitor.total_memory, base, block, poller)
        if poller == "spin":
            seconds["floor (bare thread)"] += latency.bare_thread_seconds(nest, base, block)
    return {name: latency.summarize(s) for name, s in seconds.items()}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="+", help="cgwatch package directories; the first is "
                        "the baseline the others are compared with")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("calls", "latency", "events"),
                        help="run one section (events: only with --only)")
    parser.add_argument("--trials", type=int, help="latency trials per package")
    args = parser.parse_args()
    packages = {chr(ord("A") + i): load(f"cgwatch_{chr(ord('a') + i)}", path)
                for i, path in enumerate(args.packages)}
    rounds, batch, trials = (15, 0.005, 100) if args.quick else (101, 0.005, 300)
    trials = args.trials or trials
    for name, path in zip(packages, args.packages):
        print(f"{name} = {path}")
    if args.only is None or args.only == "calls":
        _call_table(packages, rounds, batch)
    if args.only is None or args.only == "latency":
        _latency_table(packages, trials)
    if args.only == "events":
        _events_table(packages, args.trials or 100)
    return 0


def _events_table(packages: dict[str, ModuleType], trials: int, block: int = 20) -> None:
    """OOM kill -> Events callback, alternating blocks of trials between the packages."""
    first: dict[str, list[float]] = {name: [] for name in packages}
    with cgroups.nest(1, "leaf", 4 * cgroups.GiB) as nest, cgroups.inside(nest):
        while min(len(s) for s in first.values()) < trials:
            for name, package in packages.items():
                seconds = events_latency.oom_latency(nest, block, package)["first_event_seconds"]
                first[name] += seconds
    print("\n| OOM kill -> first Events callback | trials | p50 | p99 | max |\n"
          "|---|---|---|---|---|")
    for name, s in first.items():
        r = latency.summarize(s)
        print(f"| {name} | {r['trials']} | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms "
              f"| {r['max_ms']:.2f} ms |")


def _call_table(packages: dict[str, ModuleType], rounds: int, batch: float) -> None:
    others = list(packages)[1:]
    print("\n| where | fn | A | " + " | ".join(f"{o} | {o}/A" for o in others)
          + " | A/psutil |\n|---|---|---|" + "---|---|" * len(others) + "---|")
    limit = 4 * cgroups.GiB
    for depth, limited in SHAPES:
        name = "own cgroup" if depth == 0 else f"depth {depth}, {limited} limited"
        if depth == 0:
            best = _calls(packages, rounds, batch)
        else:
            with cgroups.nest(depth, limited, limit) as nest, cgroups.inside(nest):
                best = _calls(packages, rounds, batch)
        for fn in ("total", "available", "module total"):
            base = best[f"A.{fn}"]
            cells = " | ".join(f"{best[f'{o}.{fn}']:.0f} ns | {best[f'{o}.{fn}'] / base:.3f}"
                               for o in others)
            print(f"| {name} | {fn} | {base:.0f} ns | {cells} | {base / best['psutil']:.4f} |",
                  flush=True)
    print(f"\npsutil.virtual_memory() in the last row: {best['psutil']:.0f} ns")


def _latency_table(packages: dict[str, ModuleType], trials: int) -> None:
    limit = 4 * cgroups.GiB
    print("\n| limit write -> new value | poller | trials | p50 | p99 | max | > 5 ms |\n"
          "|---|---|---|---|---|---|---|")
    with cgroups.nest(1, "leaf", limit) as nest, cgroups.inside(nest):
        for poller in ("spin", "yield"):
            lat = _latency(packages, nest, limit, trials, poller)
            for name, s in lat.items():
                print(f"| {name} | {poller} | {s['trials']} | {s['p50_ms']:.2f} ms "
                      f"| {s['p99_ms']:.2f} ms | {s['max_ms']:.2f} ms | {s['over_5ms']} |",
                      flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
