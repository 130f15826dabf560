"""Does the guard stop only the jobs it should, and those in time? A campaign on real cgroups.

    sudo .venv/bin/python -m bench.campaign [--quick] [--runs N] [--jobs J] [--out DIR]
        [--shapes SUBSTRING ...] [--ways guard,learned,run] [--loads quiet,hog]
        [--trainer-python PY] [--no-plots] [--work DIR] [--high-share F]
    sudo bench/campaign_vm [ARGS]   # the same inside the cgroup v2 VM (default --quick)

Not part of `python -m bench` nor of the test command: the full campaign takes hours. Each
run is one job (bench/campaign_job.py) in a fresh memory cgroup of its own, made below this
process's memory cgroup with a real limit (512 MiB; 1 GiB for the slow leak, 1.5 GiB for the
framework jobs), J at a time, removed after the run (and, with every process in them, on
Ctrl-C or any failure). Its memory follows one shape of bench/campaign_shapes.py.

Ways in (`--ways`): `guard`, the job's own loop calls `cgwatch.Guard().check(step)` with the
documented defaults; `learned`, the same after one real save timed with `guard.saving()`;
`run`, `cgwatch run --guard -- python campaign_job.py` (defaults), the job saving on SIGTERM.
Loads (`--loads`): `quiet` (whatever else the machine runs) and `hog` (two busy-loop
processes, one per core of a 2-core machine, for the whole phase).

What is counted, per run: a *stop* (the guard said stop: the job's `check()` or its SIGTERM);
an *OOM kill* (the cgroup's `oom_kill` counter, v1 memory.oom_control, v2 memory.events, or the
job ending by SIGKILL); *saved* (a stop whose save completed, the checkpoint in place, with no
OOM kill in the cgroup); for leaking shapes the *life* (campaign_shapes.py: when the shape
reaches what the job had left once started, i.e. where the kernel kills an unguarded run,
computed from the shape) and the share of it used before the stop. A healthy shape must give 0
stops; a leaking one must be saved before the kill (goal >= 95 %) as late as it can (goal: a
median life share >= 90 %). No run ends on a timeout of ours while the job is alive unless it
overran a generous budget (3x its time plus 5 min), which is reported as `timeout`, never as a
kill.

Writes DIR/runs.json (every run), DIR/table.md (the tables) and, unless --no-plots, one
picture per shape (`cgwatch run --plot`, the first `run` way run of each shape) in DIR/img.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Optional

from bench import campaign_shapes as shapes
from bench.campaign_replay import replayed, summary
from bench.cgroups import remove_cgroup, write

MiB = shapes.MiB
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOB = os.path.join(HERE, "campaign_job.py")
FRAMEWORK_LIMIT = 1536 * MiB
# The framework jobs: a step then flat and a start-up ramp then a sawtooth (healthy), a linear
# leak; the shapes are fractions of what is left once the framework is loaded.
FRAMEWORK_SHAPES = ("one step, then flat", "ramp, then 2 s sawtooth", "linear leak",
                    "sawtooth 2 s to ~90 %", "warm-up to ~85 % over 10 s", "evaluation leak")
# Moves itself into the cgroup, then becomes the command: every page it touches is charged
# there, and no preexec_fn runs in a threaded parent.
ENTER = ("import os, sys; fd = os.open(sys.argv[1] + '/cgroup.procs', os.O_WRONLY); "
         "os.write(fd, str(os.getpid()).encode()); os.close(fd); os.execv(sys.argv[2], "
         "sys.argv[2:])")
QUICK_SHAPES = ("sawtooth 0.2 s, 60%", "sawtooth 0.5 s, 60%", "sawtooth 2 s, 20%",
                "sawtooth 10 s, 60%", "sawtooth 2 s to ~90 %", "sawtooth 0.2 s to ~80 %")


@dataclass
class Run:
    index: int
    shape: str
    way: str  # guard | learned | run
    load: str  # quiet | hog
    seed: int
    framework: str = "plain"
    plot: str = ""


# ---- cgroups: made below our own memory cgroup, removed always ------------------------------


def own_memory_cgroup() -> tuple[str, int]:
    """(directory, version) of this process's memory cgroup, through cgwatch's resolver."""
    from cgwatch import discovery, tree

    res, _ = tree.resolve_process("/")
    if not isinstance(res, discovery.Resolved):
        raise SystemExit(f"campaign: no memory cgroup: {res.reason}")
    return res.directory, res.version


class Cgroups:
    """The campaign's directory below our own cgroup, one child per run."""

    def __init__(self) -> None:
        base, self.version = own_memory_cgroup()
        if self.version == 2:
            _write(os.path.join(base, "cgroup.subtree_control"), "+memory", quiet=True)
        self.top = os.path.join(base, f"cgwatch-campaign-{uuid.uuid4().hex[:8]}")
        os.mkdir(self.top)
        if self.version == 2:
            _write(os.path.join(self.top, "cgroup.subtree_control"), "+memory", quiet=True)
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping = False

    def make(self, name: str, limit: int, high_share: Optional[float] = None) -> str:
        """A run's cgroup with `limit`; v2 and `high_share`: memory.high at that share of it
        (the kernel throttles the job above it: the guard's PSI trigger's case)."""
        path = os.path.join(self.top, name)
        os.mkdir(path)
        _write(os.path.join(path, "memory.max" if self.version == 2
                            else "memory.limit_in_bytes"), str(limit))
        if high_share is not None:
            _write(os.path.join(path, "memory.high"), str(int(limit * high_share)))
        return path

    def counters(self, path: str) -> dict[str, Any]:
        """A run's cgroup as the kernel counted it, read at its end through cgwatch's parsers:
        `oom_kill`; `failcnt` (v1 memory.failcnt: charges that failed at the limit; v2 the
        `max` line of memory.events: times usage reached memory.max); `peak` (v1
        memory.max_usage_in_bytes, v2 memory.peak since 5.19; None: not there); v2 only,
        `high` (memory.events) and the PSI stall seconds of memory.pressure, `some` and
        `full` (None with PSI off)."""
        from cgwatch import values

        def optional(name: str) -> Optional[str]:
            try:
                return _read(path, name)
            except OSError:
                return None

        if self.version == 2:
            events = values.parse_flat_keyed(_read(path, "memory.events"))
            peak = optional("memory.peak")
            pressure = optional("memory.pressure")
            stalls = values.parse_pressure(pressure) if pressure else {}
            return {"oom_kill": events.get("oom_kill", 0), "failcnt": events.get("max", 0),
                    "peak": values.parse_counter(peak) if peak else None,
                    "high": events.get("high", 0),
                    "some": stalls["some"] / 1e6 if "some" in stalls else None,
                    "full": stalls["full"] / 1e6 if "full" in stalls else None}
        control = values.parse_flat_keyed(_read(path, "memory.oom_control"))
        peak = optional("memory.max_usage_in_bytes")
        return {"oom_kill": control.get("oom_kill", 0),
                "failcnt": values.parse_counter(_read(path, "memory.failcnt")),
                "peak": values.parse_counter(peak) if peak else None}

    def remove(self, path: str) -> None:
        if not remove_cgroup(path):
            print(f"campaign: could not remove {path}", file=sys.stderr)

    def stop(self) -> None:
        """Kill every job started and start no more (Ctrl-C, a failure)."""
        with self.lock:
            self.stopping = True
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()

    def close(self) -> None:
        self.stop()
        for name in os.listdir(self.top):
            if os.path.isdir(os.path.join(self.top, name)):
                self.remove(os.path.join(self.top, name))
        self.remove(self.top)


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as f:
        return f.read()


def _write(path: str, value: str, quiet: bool = False) -> None:
    try:
        write(path, value)
    except OSError:
        if not quiet:
            raise


# ---- one run ---------------------------------------------------------------------------------


def budget(shape: shapes.Shape, quick: bool) -> float:
    """Seconds a run may take before we call it a timeout: generous on a loaded machine (the
    kill must be the kernel's)."""
    seconds = min(shape.seconds, 25.0 if shape.leaks else 20.0) if quick else shape.seconds
    return 3 * seconds + 300 + (120 if shape.name in FRAMEWORK_SHAPES else 0)


def run_one(run: Run, groups: Cgroups, args: argparse.Namespace, workroot: str) -> dict[str, Any]:
    shape = shapes.BY_NAME[run.shape]
    limit = FRAMEWORK_LIMIT if run.framework != "plain" else (
        args.limit_mib * MiB if args.limit_mib else shape.limit)
    work = os.path.join(workroot, f"run-{run.index}")
    os.makedirs(work)
    out = os.path.join(work, "result.json")
    report = os.path.join(work, "report.json")
    python = args.trainer_python if run.framework != "plain" else sys.executable
    job = [python, JOB, "--shape", run.shape, "--seed", str(run.seed), "--out", out,
           "--workdir", os.path.join(work, "job"), "--framework", run.framework]
    if args.quick:
        job.append("--quick")
    # Every guarded run records its guard's checks, replayed after it (campaign_replay.py).
    recorded = os.path.join(work, "guard.record")
    if run.way == "run":
        # This interpreter runs `cgwatch run` (it has matplotlib for --plot), the job's its own.
        cmd = [sys.executable, "-m", "cgwatch", "run", "--guard", "--report", report,
               "--record", recorded]
        if run.plot:
            cmd += ["--plot", run.plot]
        argv = cmd + ["--", *job, "--mode", "signal"]
    elif run.way == "none":
        argv = job + ["--mode", "none"]
    else:
        argv = job + ["--mode", "guard", "--record", recorded] + (
            ["--learned"] if run.way == "learned" else [])
    if groups.stopping:
        raise KeyboardInterrupt
    cgroup = groups.make(f"run-{run.index}", limit, args.high_share)
    argv[argv.index("--out"):argv.index("--out")] = ["--cgroup", cgroup]
    # One OpenMP thread for torch, as tests/integration's launchers: torch's default of one
    # per core spins against the other jobs and the hog on the 2-core machine, and a tiny
    # GPT-2 step then took 0.5-3 s (measured, 2 HF jobs and the hog) instead of ~25 ms: a
    # 41 MiB/s leak came in pieces of 20-120 MiB, one a check, bigger than the 5 % reserve
    # (77 MiB), a machine no user trains on.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", PYTHONUNBUFFERED="1",
               PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    record: dict[str, Any] = {**asdict(run), "limit": limit, "loadavg": os.getloadavg()[0]}
    began = time.monotonic()
    try:
        with open(os.path.join(work, "stderr"), "wb") as err:
            with groups.lock:  # started under the lock: stop() kills it or it never starts
                if groups.stopping:
                    raise KeyboardInterrupt
                proc = subprocess.Popen([sys.executable, "-c", ENTER, cgroup, *argv],
                                        cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                        stderr=err)
                groups.procs.append(proc)
            try:
                status = proc.wait(timeout=budget(shape, args.quick))
                record["outcome_of_ours"] = ""
            except subprocess.TimeoutExpired:
                proc.kill()
                status = proc.wait()
                record["outcome_of_ours"] = "timeout"
        record["status"] = status
        ended_wall = time.time()
        record["wall_seconds"] = round(time.monotonic() - began, 2)
        record["kernel"] = groups.counters(cgroup)
        record["oom_kills"], record["failcnt"] = (record["kernel"]["oom_kill"],
                                                  record["kernel"]["failcnt"])
    finally:
        groups.remove(cgroup)
    for name, key in ((out + ".start", "start"), (out, "result"), (report, "report")):
        try:
            with open(name) as f:
                record[key] = json.load(f)
        except (OSError, ValueError):
            record[key] = None
    if record["start"]:
        # Until the job ended, from its shape's start: an unguarded leak's kill time.
        record["ended_after"] = round(ended_wall - record["start"]["t0_wall"], 2)
    with open(os.path.join(work, "stderr"), "rb") as f:
        record["stderr"] = f.read()[-1500:].decode(errors="replace")
    if run.way != "none":
        record["replay"] = replayed(recorded)
    shutil.rmtree(work, ignore_errors=True)
    return classify(record, shape)


def classify(record: dict[str, Any], shape: shapes.Shape) -> dict[str, Any]:
    result = record.get("result") or {}
    start = record.get("start") or {}
    outcome = result.get("outcome", "")
    stopped = outcome in ("stopped", "signalled")
    killed = record["oom_kills"] > 0 or record["status"] in (-9, 137)
    record["stopped"] = stopped
    record["killed"] = killed
    record["saved"] = stopped and not killed and record["status"] in (0, 75)
    stop_at = result.get("stop_at")
    # A stop before the shape began: the guard acted on the job's start-up (its imports).
    record["during_startup"] = stopped and stop_at is not None and stop_at < 0
    record["stop_at"] = stop_at
    life = start.get("life")
    record["life"] = life
    record["life_share"] = max(0.0, stop_at / life) if stopped and life and \
        stop_at is not None else None
    # What the share can be at best with the guard's 5 % reserve kept (campaign_shapes.
    # ceiling_of), and the seconds of the life a stop gave away: on the campaign's lives of
    # 25-40 s a lead of a few seconds is a large share, on an hour's job a small one.
    ceiling = start.get("ceiling")
    record["ceiling_share"] = ceiling / life if ceiling is not None and life and \
        math.isfinite(ceiling) and math.isfinite(life) else None
    record["given_away"] = max(0.0, life - stop_at) if record["life_share"] is not None \
        else None
    message = result.get("message") or ""
    if not message and record.get("stderr"):
        lines = [ln for ln in record["stderr"].splitlines() if "cgwatch guard" in ln]
        message = lines[0] if lines else ""
    record["message"] = message[:400]
    record["leaks"] = shape.leaks
    return record


# ---- the campaign ----------------------------------------------------------------------------


def plan(args: argparse.Namespace, frameworks: bool) -> list[Run]:
    chosen = [s for s in shapes.SHAPES
              if (not s.full_only or not args.quick)
              and (not args.shapes or any(w in s.name for w in args.shapes))]
    if args.quick and not args.shapes:
        chosen = [s for s in chosen
                  if s.leaks or not s.name.startswith("sawtooth") or s.name in QUICK_SHAPES]
    runs: list[Run] = []
    plotted: set[str] = set()
    for load in args.loads:
        for rep in range(args.runs):
            for shape in chosen:
                for way in args.ways:
                    plot = ""
                    if args.plots and way == "run" and shape.name not in plotted:
                        plotted.add(shape.name)
                        plot = os.path.join(args.plots, slug(shape.name) + ".png")
                    runs.append(Run(len(runs), shape.name, way, load,
                                    seed=1000 * rep + len(runs), plot=plot))
            if frameworks:
                for framework in ("hf", "lightning"):
                    for name in [n for n in FRAMEWORK_SHAPES
                                 if not args.shapes or any(w in n for w in args.shapes)]:
                        for way in [w for w in args.ways if w != "learned"]:
                            plot = ""
                            key = f"{framework}: {name}"
                            if args.plots and way == "run" and key not in plotted:
                                plotted.add(key)
                                plot = os.path.join(args.plots, slug(key) + ".png")
                            runs.append(Run(len(runs), name, way, load, seed=1000 * rep
                                            + len(runs), framework=framework, plot=plot))
    return runs


def slug(name: str) -> str:
    return "campaign-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def frameworks_import(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import torch, transformers, lightning"],
                           capture_output=True, timeout=300)
    return probe.returncode == 0


class Hogs:
    """Two busy-loop processes (one per core of this 2-core machine) while a phase runs."""

    def __init__(self, count: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(count)]

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def main(argv: Optional[list[str]] = None) -> int:
    try:
        return campaign(argv)
    except KeyboardInterrupt:
        print("campaign: interrupted; its cgroups and jobs are gone, the runs so far are in "
              "runs.json", file=sys.stderr)
        return 130


def campaign(argv: Optional[list[str]]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.campaign",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a subset for trying: runs shortened to 20-25 s, four sawtooths "
                             "of ten, no slow leak, quiet only, one run each")
    parser.add_argument("--runs", type=int, default=None,
                        help="repetitions of every shape x way x load (default 3; --quick 1)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--limit-mib", type=int, default=None,
                        help="the plain jobs' limit, MiB (default: each shape's, 512 or "
                             "1024; the shapes are fractions of it)")
    parser.add_argument("--shapes", nargs="*", default=[],
                        help="only the shapes whose name contains one of these")
    parser.add_argument("--ways", type=lambda v: v.split(","), default="guard,learned,run",
                        help="guard,learned,run (default); none: unguarded (checks `life`)")
    parser.add_argument("--loads", type=lambda v: v.split(","), default=None,
                        help="quiet,hog (default; --quick: quiet)")
    parser.add_argument("--out", default=None, help="directory for runs.json, table.md, img/")
    parser.add_argument("--trainer-python", default=None,
                        help="interpreter for the HF/Lightning jobs (default: this one if it "
                             "imports torch, transformers and lightning, else "
                             ".venv-integration/bin/python); none: skip them")
    parser.add_argument("--high-share", type=float, default=None,
                        help="cgroup v2: memory.high at this share of each run's limit (default "
                             "none: memory.max only, as on v1)")
    parser.add_argument("--work", default="/var/tmp",
                        help="where the runs' files go (default /var/tmp): a disk-backed file "
                             "system, since the page-cache writer's files on a tmpfs are shmem, "
                             "which the kernel cannot reclaim (the VM: its scratch disk)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--tables", metavar="RUNS_JSON",
                        help="run nothing: print the tables of an earlier campaign's runs.json "
                             "(and draw its picture into --out, unless --no-plots)")
    args = parser.parse_args(argv)
    if args.tables:
        with open(args.tables) as f:
            old = [classify(r, shapes.BY_NAME[r["shape"]]) for r in json.load(f)["runs"]]
        if not args.no_plots and args.out:
            draw_sheet(old, os.path.join(args.out, "campaign.png"))
        print(tables(old), end="")
        return 0
    args.runs = args.runs or (1 if args.quick else 3)
    args.loads = args.loads or (["quiet"] if args.quick else ["quiet", "hog"])
    args.out = args.out or f"campaign-{time.strftime('%Y%m%d-%H%M%S')}"
    os.makedirs(args.out, exist_ok=True)
    args.plots = "" if args.no_plots else os.path.join(args.out, "img")
    if args.plots:
        os.makedirs(args.plots, exist_ok=True)
    if os.geteuid() != 0:
        print("campaign: needs root (it makes memory cgroups)", file=sys.stderr)
        return 2
    frameworks = False
    if args.trainer_python != "none":
        for candidate in ([args.trainer_python] if args.trainer_python else
                          [sys.executable, os.path.join(ROOT, ".venv-integration", "bin",
                                                        "python")]):
            if os.path.exists(candidate) and frameworks_import(candidate):
                args.trainer_python, frameworks = candidate, True
                break
        else:
            print("campaign: no interpreter imports torch, transformers and lightning: the "
                  "framework jobs are skipped (tests/integration/setup makes one)",
                  file=sys.stderr)
    runs = plan(args, frameworks)
    print(f"campaign: {len(runs)} runs, {args.jobs} at a time, into {args.out}",
          file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _interrupted)  # cleaned up as on Ctrl-C
    groups = Cgroups()
    if args.high_share is not None and groups.version != 2:
        groups.close()
        print("campaign: --high-share needs cgroup v2 (memory.high)", file=sys.stderr)
        return 2
    records: list[dict[str, Any]] = []
    hogs: Optional[Hogs] = None
    began = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="cgwatch-campaign-", dir=args.work) as work:
            for load in args.loads:
                phase = [r for r in runs if r.load == load]
                if load == "hog":
                    hogs = Hogs(2)
                pool = ThreadPoolExecutor(args.jobs)
                try:
                    for record in pool.map(lambda r: run_one(r, groups, args, work), phase):
                        records.append(record)
                        progress(record, len(records), len(runs), began)
                except BaseException:
                    groups.stop()  # the running jobs end now; the queued ones never start
                    raise
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
                if hogs is not None:
                    hogs.stop()
                    hogs = None
    finally:
        if hogs is not None:
            hogs.stop()
        groups.close()
        with open(os.path.join(args.out, "runs.json"), "w") as f:
            json.dump({"argv": sys.argv, "quick": args.quick, "cgroup_version": groups.version,
                       "kernel": os.uname().release, "runs": records}, f, indent=1)
    if args.plots and draw_sheet(records, os.path.join(args.out, "campaign.png")):
        print(f"campaign: the shapes' picture: {os.path.join(args.out, 'campaign.png')}",
              file=sys.stderr)
    table = tables(records)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    return 0


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def progress(r: dict[str, Any], done: int, total: int, began: float) -> None:
    if not r["leaks"]:
        what = "FALSE STOP" if r["stopped"] else "KILLED" if r["killed"] else \
            r["outcome_of_ours"] or "ok"
    else:
        what = ("saved" if r["saved"] else "STOPPED, NOT SAVED" if r["stopped"] else
                f"KILLED at {r.get('ended_after', 0):.1f} s of {r['life'] or 0:.1f}"
                if r["killed"] else r["outcome_of_ours"] or "NOT KILLED")
    share = f" life {r['life_share']:.0%}" if r["life_share"] is not None else ""
    print(f"[{done}/{total} {time.monotonic() - began:5.0f} s] {r['framework']:9s} "
          f"{r['shape']:30s} {r['way']:7s} {r['load']:5s} {what}{share} (status "
          f"{r['status']}, oom_kill {r['oom_kills']}) {r['message'][:100]}",
          file=sys.stderr, flush=True)


# ---- the picture: one small panel per shape -------------------------------------------------


def draw_sheet(records: list[dict[str, Any]], path: str) -> bool:
    """One panel per shape from its first `run` way run (whose `--report` has the timeline):
    the working set `cgwatch run` sampled, the limit, what the shape asks for (dotted, from
    the job's start, over its whole time), and the guard's signal (red). matplotlib, as
    `run --plot` draws, here a small Agg figure (no pyplot); False if it is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    chosen: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["way"] == "run" and (r.get("report") or {}).get("timeline") and r.get("start"):
            chosen.setdefault(row_name(r), r)
    if not chosen:
        return False
    cols = 4
    rows = -(-len(chosen) // cols)
    fig = Figure(figsize=(12, 1.9 * rows), dpi=64, layout="constrained")
    FigureCanvasAgg(fig)
    for i, (name, r) in enumerate(chosen.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        timeline = r["report"]["timeline"]
        columns = timeline["columns"]
        ws: list[Optional[int]] = next(
            (v for k, v in columns.items() if k.startswith("working_set:")), [])
        times = timeline["times"][:len(ws)]
        usage: list[Optional[int]] = next(
            (v for k, v in columns.items() if k.startswith("usage:")), [])
        ax.plot(timeline["times"][:len(usage)], [(v or 0) / MiB for v in usage],
                color="tab:blue", alpha=0.35, lw=2)
        ax.plot(times, [(v or 0) / MiB for v in ws], color="tab:green", lw=1)
        ax.axhline(r["limit"] / MiB, color="black", ls="--", lw=0.8)
        start = r["start"]
        offset = start["t0_wall"] - timeline["start_wall_time"]
        shape = shapes.BY_NAME[r["shape"]]
        scale = start["room"] if r["framework"] != "plain" else start["limit"]
        target = shape.make(random.Random(r["seed"]), scale, start["room"], start["seconds"])
        end = start["life"] or start["seconds"]
        xs = [k * end / 300 for k in range(301)]
        ax.plot([offset + x for x in xs],
                [min(start["limit"], start["usage_at_start"] + target(x)) / MiB for x in xs],
                color="grey", ls=":", lw=0.8)
        for mark in timeline.get("marks", []):
            if mark.get("kind") == "guard":
                ax.axvline(mark["time"], color="tab:red", lw=1)
        ax.set_title(name + (" (stopped)" if r["stopped"] else ""), fontsize=8)
        ax.tick_params(labelsize=6)
    fig.suptitle("MiB against seconds under `cgwatch run --guard`: working set green, usage "
                 "blue, limit dashed, the shape dotted (from the job's start), the guard's "
                 "signal red", fontsize=9)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    try:  # Pillow comes with matplotlib: a 32-colour palette makes the file ~4x smaller
        from PIL import Image

        buffer.seek(0)
        Image.open(buffer).convert("RGB").quantize(colors=32).save(path, optimize=True)
    except ImportError:
        with open(path, "wb") as f:
            f.write(buffer.getvalue())
    return True


# ---- the tables ------------------------------------------------------------------------------


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.0f} %" if whole else "—"


def _median_share(rs: list[dict[str, Any]]) -> str:
    shares = [r["life_share"] for r in rs if r["life_share"] is not None]
    return f"{statistics.median(shares):.0%}" if shares else "—"


def row_name(r: dict[str, Any]) -> str:
    return r["shape"] if r["framework"] == "plain" else f"{r['framework']}: {r['shape']}"


def tables(records: list[dict[str, Any]]) -> str:
    ways = sorted({r["way"] for r in records}, key=["guard", "learned", "run", "none"].index)
    order: list[str] = []
    for r in records:
        if row_name(r) not in order:
            order.append(row_name(r))
    healthy = [n for n in order if not any(r["leaks"] for r in records if row_name(r) == n)]
    leaking = [n for n in order if n not in healthy]
    loads = ", ".join(sorted({r["load"] for r in records}))
    lines = [f"Healthy shapes (goal: 0 stops), loads: {loads}.",
             "", "| shape | runs | stops | " + " | ".join(f"stops, {w}" for w in ways)
             + " | of the stops, in start-up | OOM kills | timeouts |",
             "|---" * (6 + len(ways)) + "|"]
    total = [0, 0]
    for name in healthy:
        rs = [r for r in records if row_name(r) == name]
        stops = sum(r["stopped"] for r in rs)
        total[0] += len(rs)
        total[1] += stops
        by_way = [f"{sum(r['stopped'] for r in rs if r['way'] == w)}/"
                  f"{sum(1 for r in rs if r['way'] == w)}" for w in ways]
        lines.append(f"| {name} | {len(rs)} | {stops} | " + " | ".join(by_way)
                     + f" | {sum(r['during_startup'] for r in rs)}"
                     f" | {sum(r['killed'] for r in rs)} | "
                     f"{sum(bool(r['outcome_of_ours']) for r in rs)} |")
    lines.append(f"| **all healthy** | {total[0]} | {total[1]} | " + " | ".join(
        f"{sum(r['stopped'] for r in records if not r['leaks'] and r['way'] == w)}" for w in ways)
        + " | | | |")
    lines += ["", "Leaking shapes (goal: >= 95 % saved before the kill; median life share "
              ">= 90 %). Life share = the stop's time / the time the shape reaches the room "
              "the job had once started (its life). Ceiling = the latest stop that keeps the "
              "guard's 5 % reserve free, over the life (a stop after the last stair that "
              "fits cannot reach it). Given away = the life minus the stop's time.", "",
              "| shape | runs | stops | of them in start-up | saved before the kill | OOM kills "
              "| life share, median (min-max) | ceiling | given away, median | saved per way ("
              + " / ".join(ways) + ") | median life share per way |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in leaking:
        rs = [r for r in records if row_name(r) == name]
        shares = sorted(r["life_share"] for r in rs if r["life_share"] is not None)
        share = (f"{statistics.median(shares):.0%} ({shares[0]:.0%}-{shares[-1]:.0%})"
                 if shares else "—")
        share_by_way = " / ".join(_median_share([r for r in rs if r["way"] == w])
                                  for w in ways)
        saved_by_way = " / ".join(f"{sum(r['saved'] for r in rs if r['way'] == w)}/"
                                  f"{sum(1 for r in rs if r['way'] == w)}" for w in ways)
        ceilings = [r["ceiling_share"] for r in rs if r.get("ceiling_share") is not None]
        ceiling = f"{statistics.median(ceilings):.0%}" if ceilings else "—"
        away = [r["given_away"] for r in rs if r.get("given_away") is not None]
        given = f"{statistics.median(away):.1f} s" if away else "—"
        lines.append(f"| {name} | {len(rs)} | {sum(r['stopped'] for r in rs)} | "
                     f"{sum(r['during_startup'] for r in rs)} | "
                     f"{_pct(sum(r['saved'] for r in rs), len(rs))} | "
                     f"{sum(r['killed'] for r in rs)} | {share} | {ceiling} | {given} | "
                     f"{saved_by_way} | {share_by_way} |")
    lines += counters_table(records, order)
    if any("replay" in r for r in records):  # none in a runs.json from before replays
        lines += [""] + summary(records)
    averages = [r["loadavg"] for r in records]
    if averages:
        lines += ["", f"Load average (1 min) at the runs' starts: {min(averages):.1f}-"
                  f"{max(averages):.1f} (median {statistics.median(averages):.1f})."]
    return "\n".join(lines) + "\n"


def counters_table(records: list[dict[str, Any]], order: list[str]) -> list[str]:
    """The kernel's own counters of the runs' cgroups, per shape (medians; none for a
    runs.json from before they were recorded): what v1 and v2 charge and count differently."""
    if not any(r.get("kernel") for r in records):
        return []
    lines = ["", "What the kernel counted in the runs' cgroups (median over the shape's runs): "
             "peak usage (v1 memory.max_usage_in_bytes, v2 memory.peak) over the limit; "
             "limit hits (v1 memory.failcnt: failed charges; v2 memory.events `max`: "
             "reclaims at memory.max); v2 only: memory.events `high` and the seconds "
             "memory.pressure says tasks stalled on memory (some / full). Step: the job's "
             "loop's time per step (median; 10 ms asked), long where the machine cannot "
             "write the shape's memory at its pace.", "",
             "| shape | peak / limit | limit hits | high | PSI some, s | PSI full, s | step |",
             "|---|---|---|---|---|---|---|"]

    def median(rs: list[dict[str, Any]], key: str, form: str) -> str:
        got = [r["kernel"][key] for r in rs if r.get("kernel") and
               r["kernel"].get(key) is not None]
        return format(statistics.median(got), form) if got else "—"

    for name in order:
        rs = [r for r in records if row_name(r) == name]
        shares = [r["kernel"]["peak"] / r["limit"] for r in rs if r.get("kernel") and
                  r["kernel"].get("peak") is not None]
        peak = f"{statistics.median(shares):.0%}" if shares else "—"
        steps = [1000 * (r["stop_at"] or r["result"]["ended_at"]) / r["result"]["step"]
                 for r in rs if r.get("result") and r["result"].get("step")
                 and r["result"].get("ended_at")]
        step = f"{statistics.median(steps):.0f} ms" if steps else "—"
        lines.append(f"| {name} | {peak} | {median(rs, 'failcnt', '.0f')} | "
                     f"{median(rs, 'high', '.0f')} | {median(rs, 'some', '.2f')} | "
                     f"{median(rs, 'full', '.2f')} | {step} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
