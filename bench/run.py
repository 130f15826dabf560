"""The bench command: every measurement in one process and one run, then the tables.

    python -m bench [--quick] [--json out.json] [--idle-seconds 60]

Sections, in order: call cost where the process started (with the module functions), call
cost in cgroups made below our own at depth 1, 3 and 10 with the deepest level limited or all
limited (the process moves itself into the deepest one and back), each place also timing
total_memory() in the freshness modes (fresh=False, thread=False, a confirm on every call)
and the syscall floors under those checks, the guard's check() per step (far from its thresholds
and near them, bench/guard.py), limit-write latency (also with fresh=False, the thread's
path), OOM kill -> Events callback latency, monitor start-up, import time and RSS
in fresh interpreters, the idle cost of 1, 100 and 1000 monitors in one process, node scale
(bench/nodescale.py: 300 processes of one uid; 24 in a user namespace limited to 8 instances
with --quick), and the idle cost of the thread (not with --quick). Missed targets
print MISS; the exit status is non-zero only if the bench crashes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import cgwatch
from bench import calls, cgroups, events_latency, guard, idle, latency, nodescale, report


@dataclass(frozen=True)
class Plan:
    rounds: int
    batch_seconds: float
    shapes: tuple[tuple[int, str], ...]  # (depth, which levels are limited)
    trials: int  # latency trials per poller
    startup_repeat: int
    rss_repeat: int
    idle_seconds: float
    floor: bool  # also measure the latency floor of a bare Python thread
    event_trials: int  # OOM kills for the Events latency
    idle_scale: tuple[int, ...]  # monitors in one process for the idle-at-scale section
    idle_scale_seconds: float
    nodescale: tuple[int, ...]  # cgwatch processes of one uid (bench/nodescale.py)
    nodescale_userns_limit: int  # 0: the host's limit, as an unused uid


FULL = Plan(61, 0.01, ((1, "leaf"), (3, "leaf"), (10, "leaf"), (3, "all"), (10, "all")),
            300, 30, 5, 60.0, True, 200, (1, 100, 1000), 10.0, (300,), 0)
QUICK = Plan(9, 0.005, ((1, "leaf"), (10, "leaf"), (10, "all")), 60, 10, 2, 0.0, False, 20,
             (1, 1000), 1.0, (24,), 8)


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _git(*args: str) -> str:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(cgwatch.__file__)))
    try:
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def meta(argv: list[str], version: Any) -> dict[str, Any]:
    commit = _git("rev-parse", "--short", "HEAD") or "not a git checkout"
    if _git("status", "--porcelain", "--", "cgwatch"):
        commit += " + uncommitted changes in cgwatch/"
    return {
        "command": " ".join(["python -m bench", *argv]),
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"Linux {platform.release()}, {os.cpu_count()} CPUs, "
                   f"Python {platform.python_version()}, cgroup v{version}",
        "cgwatch": os.path.dirname(os.path.abspath(cgwatch.__file__)),
        "commit": commit,
    }


def base_limit() -> int:
    """The limit the bench's cgroups get: 4 GiB, or half of what binds us now if less."""
    page = os.sysconf("SC_PAGE_SIZE")
    with cgwatch.Monitor() as monitor:
        return min(4 * cgroups.GiB, monitor.total_memory() // 2) // page * page


# (row suffix, Monitor arguments, pollers): the default monitor, whose query applies a queued
# limit write itself, and fresh=False, whose query waits for the thread to publish it (the
# only path before the read-your-writes check)
LATENCY_MONITORS: tuple[tuple[str, dict[str, Any], tuple[str, ...]], ...] = (
    ("", {}, tuple(latency.POLLERS)),
    (", fresh=False (the thread publishes)", {"fresh": False}, ("spin", "yield")),
)


def latency_section(plan: Plan, nest: cgroups.Nest, limit: int, results: dict[str, Any]) -> None:
    for suffix, kwargs, pollers in LATENCY_MONITORS:
        monitor = calls.variant(cgwatch, **kwargs)
        if monitor is None:
            continue  # a cgwatch before the freshness checks
        try:
            for poller in pollers:
                progress(f"limit-write latency, {poller} poller{suffix}, {plan.trials} trials")
                results["latency"][poller + suffix] = latency.limit_write_latency(
                    nest, monitor.total_memory, limit, plan.trials, poller)
        finally:
            monitor.close()


def cgroup_sections(plan: Plan, results: dict[str, Any]) -> None:
    limit = base_limit()
    for depth, limited in plan.shapes:
        name = f"depth {depth}, {limited} limited"
        progress(f"call cost: {name}")
        with cgroups.nest(depth, limited, limit) as nest, cgroups.inside(nest):
            results["calls"].append(calls.scenario(name, plan.rounds, plan.batch_seconds))
            if depth == max(d for d, _ in plan.shapes) and limited == "all":
                results["startup"][name] = idle.startup_time(cgwatch.Monitor,
                                                             plan.startup_repeat)
    with cgroups.nest(1, "leaf", limit) as nest, cgroups.inside(nest):
        progress("guard.check() per step: far from thresholds and near them")
        results["guard"] = guard.scenario("depth 1, leaf limited", plan.rounds,
                                          plan.batch_seconds)
        latency_section(plan, nest, limit, results)
        if plan.floor:
            progress(f"limit-write latency floor: a bare Python thread, {plan.trials} trials")
            results["latency"]["spin, floor: bare Python thread, no cgwatch"] = \
                latency.summarize(latency.bare_thread_seconds(nest, limit, plan.trials))
        why = events_latency.available()
        if why:
            results["events_latency"] = {"skipped": why}
        else:
            progress(f"OOM kill -> Events callback, {plan.event_trials} trials")
            results["events_latency"] = events_latency.oom_latency(nest, plan.event_trials)


def measure(plan: Plan, argv: list[str]) -> dict[str, Any]:
    own = cgwatch.Monitor()
    version = own.status.version
    own.close()
    results: dict[str, Any] = {"meta": meta(argv, version), "calls": [], "latency": {},
                               "startup": {}}
    progress(f"cgwatch from {results['meta']['cgwatch']} ({results['meta']['commit']})")
    progress("call cost: where the process started")
    results["calls"].append(calls.scenario("own cgroup (as started)", plan.rounds,
                                           plan.batch_seconds, with_module_functions=True))
    cgwatch.default_monitor().close()  # it would otherwise follow our moves below
    why = cgroups.unavailable_reason()
    if why:
        progress(f"skipping the sections that need cgroups of our own: {why}")
        results["skipped"] = why
    else:
        cgroup_sections(plan, results)
    progress("start-up, import and RSS")
    results["startup"]["own cgroup"] = idle.startup_time(cgwatch.Monitor, plan.startup_repeat)
    package_parent = os.path.dirname(results["meta"]["cgwatch"])
    results["rss"] = idle.rss_and_import(package_parent, plan.rss_repeat)
    progress(f"idle cost at scale: {plan.idle_scale} monitors, {plan.idle_scale_seconds:g} s")
    results["idle_scale"] = idle.idle_scale(cgwatch.Monitor, plan.idle_scale,
                                            plan.idle_scale_seconds)
    progress(f"node scale: {plan.nodescale} processes of one uid")
    try:
        results["nodescale"] = [
            nodescale.measure(n, idle_seconds=plan.idle_scale_seconds,
                              ns_limit=plan.nodescale_userns_limit) for n in plan.nodescale]
    except (OSError, RuntimeError, SystemExit) as e:
        results["nodescale"] = {"skipped": str(e)}
    if plan.idle_seconds > 0:
        progress(f"idle cost: {plan.idle_seconds:.0f} s asleep")
        monitor = cgwatch.Monitor()
        try:
            results["idle"] = idle.idle_cost(plan.idle_seconds, monitor.migration_interval)
        finally:
            monitor.close()
    results["targets"] = report.targets(results)
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="~20 s smoke run, no idle section")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--idle-seconds", type=float, help="idle section length (default 60)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.idle_seconds is not None:
        plan = Plan(**{**plan.__dict__, "idle_seconds": args.idle_seconds})
    results = measure(plan, argv)
    print(report.render(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        progress(f"wrote {args.json}")
    return 0
