"""A/B: copies of the cgwatch package timed against each other in one process.

    python -m bench.ab BASE/cgwatch CHANGED/cgwatch [MORE/cgwatch ...] [--quick]
        [--only calls|latency|startup|events|guard] [--trials N]

For judging a proposed library change on a noisy machine: the packages are loaded side by
side (as cgwatch_a, cgwatch_b, ...), their queries are timed interleaved in the same rounds, in
the same cgroups, next to psutil and the bare-syscall floors (bench/reference.py); a package
whose Monitor takes `fresh` / `thread` / `confirm_interval` also gets those modes timed.
Limit-write latency and OOM kill -> callback alternate blocks of trials between a monitor of
each (never two alive at once, so their threads do not compete); Monitor() start-up
alternates single constructions. `--only guard`: each package's `Guard.check()` far, near
and sampling (bench/guard.py's three), interleaved in one limited cgroup. The goals table at
the end compares every package with A.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from types import ModuleType
from typing import Any, Callable

import psutil

from bench import calls, cgroups, events_latency, idle, latency, reference, report, timing

SHAPES = ((0, "none"), (1, "leaf"), (10, "leaf"), (10, "all"))
STARTUP_SHAPES = ((0, "none"), (10, "all"))
TOLERANCE = 0.10  # "no worse than A": within 10% (this machine's run-to-run noise) ...
SLACK_MS = 0.05  # ... or 50 us, for latencies so small that 10% is below the timer's noise


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


def forget_default(package: ModuleType) -> None:
    """Close the package's process-wide monitor and forget it, so the next module-function
    call makes one where the process is now (a closed one would answer from uncached reads).
    Neither the old nor the new cgwatch has a public way to replace the default monitor;
    both keep it in `_default`, so that private name is used, and only here."""
    monitor = getattr(package, "_default", None)
    if monitor is not None:
        monitor.close()
    package._default = None


def where(depth: int, limited: str) -> str:
    return "own cgroup" if depth == 0 else f"depth {depth}, {limited} limited"


def _place(depth: int, limited: str, run: Callable[[], Any]) -> Any:
    """run() in the process's own cgroup (depth 0) or in a nest made for it."""
    if depth == 0:
        return run()
    with cgroups.nest(depth, limited, 4 * cgroups.GiB) as nest, cgroups.inside(nest):
        return run()


# ---- call cost ---------------------------------------------------------------------------


def _candidates(packages: dict[str, ModuleType], monitors: dict[str, Any]
                ) -> dict[str, Callable[[], object]]:
    """Every package's queries (and its freshness modes, when it has them), made now."""
    candidates: dict[str, Callable[[], object]] = {}
    for name, package in packages.items():
        monitors[name] = monitor = package.Monitor()
        candidates[f"{name}.total"] = monitor.total_memory
        candidates[f"{name}.available"] = monitor.available_memory
        candidates[f"{name}.module total"] = package.total_memory
        for mode, kwargs in calls.VARIANTS.items():
            made = calls.variant(package, **kwargs)
            if made is not None:
                monitors[f"{name} {mode}"] = made
                candidates[f"{name}.total {mode}"] = made.total_memory
    return candidates


def _calls(packages: dict[str, ModuleType], rounds: int, batch: float) -> dict[str, float]:
    monitors: dict[str, Any] = {}
    kept = reference.KeptReads()
    floors = reference.FreshnessFloors()
    try:
        candidates: dict[str, Callable[[], object]] = {
            "psutil": psutil.virtual_memory, "floor.available": kept,
            "floor.pending": floors.pending, "floor.confirm": floors.confirm,
            **_candidates(packages, monitors)}
        return {k: v.best * 1e9 for k, v in
                timing.interleaved(candidates, rounds, batch).items()}
    finally:
        for monitor in monitors.values():
            monitor.close()
        for package in packages.values():
            forget_default(package)  # it must not follow us to the next place
        kept.close()
        floors.close()


def _call_rows(packages: dict[str, ModuleType], place: str, best: dict[str, float]) -> None:
    others = list(packages)[1:]
    for fn in ("total", "available", "module total"):
        base = best[f"A.{fn}"]
        cells = " | ".join(f"{best[f'{o}.{fn}']:.0f} ns | {best[f'{o}.{fn}'] / base:.3f} "
                           f"| {best[f'{o}.{fn}'] / best['psutil']:.4f}" for o in others)
        print(f"| {place} | {fn} | {base:.0f} ns | {base / best['psutil']:.4f} | {cells} |",
              flush=True)


def _call_table(packages: dict[str, ModuleType], rounds: int, batch: float
                ) -> dict[str, dict[str, float]]:
    others = list(packages)[1:]
    print("\n| where | fn | A | A/psutil | "
          + " | ".join(f"{o} | {o}/A | {o}/psutil" for o in others)
          + " |\n|---|---|---|---|" + "---|---|---|" * len(others))
    results = {}
    for depth, limited in SHAPES:
        place = where(depth, limited)
        results[place] = best = _place(depth, limited,
                                       lambda: _calls(packages, rounds, batch))
        _call_rows(packages, place, best)
    print(f"\npsutil.virtual_memory() in the last row: {best['psutil']:.0f} ns")
    _freshness_table(packages, results)
    _floor_table(packages, results)
    return results


def _freshness_table(packages: dict[str, ModuleType],
                     results: dict[str, dict[str, float]]) -> None:
    """total_memory() in every mode each package has, and the floors under the checks."""
    modes = [("default", "")] + [(mode, f" {mode}") for mode in calls.VARIANTS]
    print("\n| total_memory() | package, mode | per call | /psutil | /A default |\n"
          "|---|---|---|---|---|")
    for place, best in results.items():
        rows = [(f"{name}, {mode}", best[f"{name}.total{suffix}"])
                for name in packages for mode, suffix in modes
                if f"{name}.total{suffix}" in best]
        rows += [("floor: epoll_wait(0) on an idle inotify fd", best["floor.pending"]),
                 ("floor: pread of a kept /proc/self/cgroup fd", best["floor.confirm"])]
        for label, ns in rows:
            print(f"| {place} | {label} | {ns:.0f} ns | {report.ratio(ns, best['psutil'])} "
                  f"| {ns / best['A.total']:.2f} |")


def _floor_table(packages: dict[str, ModuleType], results: dict[str, dict[str, float]]) -> None:
    print("\n| available_memory() | kept-fd reads alone | "
          + " | ".join(f"{name} | {name}/floor" for name in packages)
          + " |\n|---|---|" + "---|---|" * len(packages))
    for place, best in results.items():
        floor = best["floor.available"]
        cells = " | ".join(f"{best[f'{name}.available']:.0f} ns "
                           f"| {best[f'{name}.available'] / floor:.3f}" for name in packages)
        print(f"| {place} | {floor:.0f} ns | {cells} |")


# ---- limit-write latency -----------------------------------------------------------------


def _latency_monitors(packages: dict[str, ModuleType]) -> dict[str, Callable[[], Any]]:
    """name -> a monitor factory: every package as it comes, and with fresh=False when it
    has that mode (its queries then wait for the thread, as before read-your-writes)."""
    made: dict[str, Callable[[], Any]] = {}
    for name, package in packages.items():
        made[name] = package.Monitor
        probe = calls.variant(package, fresh=False)
        if probe is not None:
            probe.close()
            made[f"{name} fresh=False"] = lambda p=package: p.Monitor(fresh=False)
    return made


def _latency(factories: dict[str, Callable[[], Any]], nest: cgroups.Nest, base: int,
             trials: int, poller: str, block: int = 50) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {name: [] for name in factories}
    if poller == "spin":
        seconds["floor (bare thread)"] = []
    while min(len(s) for s in seconds.values()) < trials:
        for name, factory in factories.items():
            with factory() as monitor:
                seconds[name] += latency.limit_write_seconds(
                    nest, monitor.total_memory, base, block, poller)
        if poller == "spin":
            seconds["floor (bare thread)"] += latency.bare_thread_seconds(nest, base, block)
    return {name: latency.summarize(s) for name, s in seconds.items()}


def _latency_table(packages: dict[str, ModuleType], trials: int) -> dict[str, Any]:
    limit = 4 * cgroups.GiB
    factories = _latency_monitors(packages)
    print("\n| limit write -> new value | poller | trials | p50 | p99 | max | > 5 ms |\n"
          "|---|---|---|---|---|---|---|")
    results = {}
    with cgroups.nest(1, "leaf", limit) as nest, cgroups.inside(nest):
        for poller in ("spin", "yield"):
            results[poller] = lat = _latency(factories, nest, limit, trials, poller)
            for name, s in lat.items():
                print(f"| {name} | {poller} | {s['trials']} | {s['p50_ms']:.2f} ms "
                      f"| {s['p99_ms']:.2f} ms | {s['max_ms']:.2f} ms | {s['over_5ms']} |",
                      flush=True)
    return results


# ---- Monitor() start-up --------------------------------------------------------------------


def _startups(packages: dict[str, ModuleType], repeat: int) -> dict[str, list[float]]:
    """Seconds per Monitor() construction, alternating packages (the order rotates), each
    from a process with no cgwatch thread (idle.startup_seconds)."""
    names = list(packages)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for package in packages.values():
        forget_default(package)
    for r in range(repeat):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            found = idle.startup_seconds(packages[name].Monitor)
            if found is not None:
                seconds[name].append(found)
    return seconds


def _startup_table(packages: dict[str, ModuleType], repeat: int) -> dict[str, Any]:
    print("\n| Monitor() start-up | package | best | median | constructions |\n"
          "|---|---|---|---|---|")
    results: dict[str, Any] = {}
    for depth, limited in STARTUP_SHAPES:
        place = where(depth, limited)
        seconds = _place(depth, limited, lambda: _startups(packages, repeat))
        results[place] = {}
        for name, s in seconds.items():
            results[place][name] = {"best_ms": min(s) * 1e3,
                                    "median_ms": statistics.median(s) * 1e3}
            print(f"| {place} | {name} | {min(s) * 1e3:.2f} ms "
                  f"| {statistics.median(s) * 1e3:.2f} ms | {len(s)} |", flush=True)
    return results


# ---- OOM kill -> Events callback ------------------------------------------------------------


def _events_table(packages: dict[str, ModuleType], trials: int, block: int = 20
                  ) -> dict[str, Any]:
    """OOM kill -> Events callback, alternating blocks of trials between the packages; the
    bare-thread floor runs through every block and is shown per package (what the floor
    gets while that package's Events is alive: a busy cgwatch thread slows it too)."""
    first: dict[str, list[float]] = {name: [] for name in packages}
    floor: dict[str, list[float]] = {name: [] for name in packages}
    stale = dict.fromkeys(packages, 0)
    with cgroups.nest(1, "leaf", 4 * cgroups.GiB) as nest, cgroups.inside(nest):
        while min(len(s) for s in first.values()) < trials:
            for name, package in packages.items():
                found = events_latency.oom_latency(nest, block, package)
                first[name] += found["first_event_seconds"]
                floor[name] += found["floor_seconds"]
                stale[name] += found["stale_events"]
    print("\n| OOM kill -> first Events callback | trials | p50 | p99 | max "
          "| earlier trials' events (ignored) |\n|---|---|---|---|---|---|")
    results = {}
    for name in packages:
        rows = [(name, first[name], str(stale[name])),
                (f"floor (bare thread) beside {name}", floor[name], "")]
        for label, s, extra in rows:
            if not s:
                continue
            r = latency.summarize(s)
            if label == name:
                results[name] = r
            print(f"| {label} | {r['trials']} | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms "
                  f"| {r['max_ms']:.2f} ms | {extra} |")
    return results


# ---- goals ----------------------------------------------------------------------------------


# ---- the guard's check -------------------------------------------------------------------


def _guard_checks(packages: dict[str, ModuleType], rounds: int, batch: float
                  ) -> dict[str, float]:
    """Each package's `Guard.check()` far from its thresholds, near them between samples,
    and a sampling check (bench/guard.py's three), timed interleaved; best ns per call."""
    kept: list[Any] = []
    candidates: dict[str, Callable[[], object]] = {}
    try:
        for name, package in packages.items():
            monitor = package.Monitor()
            kept.append(monitor)
            beyond = 2 * monitor.total_memory()  # a reserve no headroom reaches: near
            for kind, kwargs in (("far", {}), ("near", {"reserve": beyond}),
                                 ("sampling", {"reserve": beyond, "interval": 0.0})):
                guard = package.Guard(monitor, events=False, **kwargs)
                kept.append(guard)
                candidates[f"{name}.{kind}"] = guard.check
        return {k: v.best * 1e9 for k, v in
                timing.interleaved(candidates, rounds, batch).items()}
    finally:
        for made in reversed(kept):
            made.close()


def _guard_table(packages: dict[str, ModuleType], rounds: int, batch: float
                 ) -> dict[str, float]:
    place = where(1, "leaf")
    best: dict[str, float] = _place(1, "leaf", lambda: _guard_checks(packages, rounds, batch))
    print("\n| Guard.check() | " + " | ".join(f"{n} | {n}/A" for n in packages)
          + " |\n|---|" + "---|---|" * len(packages))
    for kind in ("far", "near", "sampling"):
        base = best[f"A.{kind}"]
        cells = " | ".join(f"{best[f'{n}.{kind}']:.0f} ns | {best[f'{n}.{kind}'] / base:.3f}"
                           for n in packages)
        print(f"| {kind} ({place}) | {cells} |")
    return best


def _goal(title: str, value: float, limit: float, shown: str) -> None:
    print(f"| {title} | {shown} | {'PASS' if value <= limit else 'MISS'} |")


def _call_goals(name: str, results: dict[str, dict[str, float]]) -> None:
    """The issue's call-cost goals, for a package that has the freshness modes."""
    if not any(f"{name}.total fresh=False" in best for best in results.values()):
        return
    fresh = max((best[f"{name}.{fn}"] / best["psutil"], f"{place}, {fn}")
                for place, best in results.items()
                for fn in ("total", "module total", "total thread=False")
                if f"{name}.{fn}" in best)
    _goal(f"{name}: total_memory() <= 1/30 of psutil, read-your-writes (worst)", fresh[0],
          report.TOTAL_FRESH_RATIO, f"1/{1 / fresh[0]:.0f} ({fresh[1]})")
    trusted = max((best[f"{name}.total fresh=False"] / best["psutil"], place)
                  for place, best in results.items())
    _goal(f"{name}: total_memory() <= 1/300 of psutil, fresh=False (worst)", trusted[0],
          report.TOTAL_TRUSTED_RATIO, f"1/{1 / trusted[0]:.0f} ({trusted[1]})")
    one = results.get(where(1, "leaf"))
    if one is not None:
        r = one[f"{name}.available"] / one["floor.available"]
        _goal(f"{name}: available_memory(), 1 limited level <= 1.2x kept-fd reads alone", r,
              report.AVAILABLE_FLOOR_RATIO, f"{r:.3f}x")


def _no_worse(title: str, a: float, b: float, slack_ms: float = SLACK_MS) -> None:
    _goal(f"{title}: no worse than A (within {TOLERANCE:.0%} or {slack_ms * 1e3:.0f} us)", b,
          max(a * (1 + TOLERANCE), a + slack_ms), f"{a:.2f} -> {b:.2f} ms")


def _goals(packages: dict[str, ModuleType], found: dict[str, Any]) -> None:
    print("\n| goal | measured (A -> other) | result |\n|---|---|---|")
    for name in list(packages)[1:]:
        if "calls" in found:
            _call_goals(name, found["calls"])
        for poller, lat in found.get("latency", {}).items():
            for key in (name, f"{name} fresh=False"):
                for stat in ("p50_ms", "p99_ms"):
                    if key in lat:
                        _no_worse(f"{key}: limit write -> new value, {poller}, {stat[:3]}",
                                  lat["A"][stat], lat[key][stat])
        for place, per in found.get("startup", {}).items():
            _no_worse(f"{name}: Monitor() start-up ({place}), best", per["A"]["best_ms"],
                      per[name]["best_ms"], slack_ms=0.0)
        guard = found.get("guard")
        if guard:
            for kind in ("far", "near"):
                a, b = guard[f"A.{kind}"], guard[f"{name}.{kind}"]
                _goal(f"{name}: Guard.check() {kind}: no worse than A (within "
                      f"{TOLERANCE:.0%})", b, a * (1 + TOLERANCE),
                      f"{a / 1e3:.1f} -> {b / 1e3:.1f} us")
            # near, per 10 ms step: a check between samples + a fifth of a sampling check
            step = guard[f"{name}.near"] + guard[f"{name}.sampling"] / 5
            _goal(f"{name}: Guard.check() near, per 10 ms step <= 1 %", step / 1e7, 0.01,
                  f"{step / 1e3:.1f} us ({step / 1e5:.2f} %)")
        ev = found.get("events")
        if ev:
            for stat in ("p50_ms", "p99_ms"):
                _no_worse(f"{name}: OOM kill -> first callback, {stat[:3]}", ev["A"][stat],
                          ev[name][stat])


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="+", help="cgwatch package directories; the first is "
                        "the baseline the others are compared with")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("calls", "latency", "startup", "events", "guard"),
                        help="run one section (events, guard: only with --only)")
    parser.add_argument("--trials", type=int, help="latency trials per package")
    args = parser.parse_args()
    packages = {chr(ord("A") + i): load(f"cgwatch_{chr(ord('a') + i)}", path)
                for i, path in enumerate(args.packages)}
    rounds, batch, trials, starts = (15, 0.005, 100, 20) if args.quick else (101, 0.005, 300,
                                                                              100)
    trials = args.trials or trials
    for name, path in zip(packages, args.packages):
        print(f"{name} = {path}")
    found: dict[str, Any] = {}
    if args.only in (None, "calls"):
        found["calls"] = _call_table(packages, rounds, batch)
    if args.only in (None, "latency"):
        found["latency"] = _latency_table(packages, trials)
    if args.only in (None, "startup"):
        found["startup"] = _startup_table(packages, starts)
    if args.only == "events":
        found["events"] = _events_table(packages, args.trials or 100)
    if args.only == "guard":
        found["guard"] = _guard_table(packages, rounds, batch)
    if len(packages) > 1:
        _goals(packages, found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
