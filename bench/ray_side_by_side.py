"""Ray Train alone, with cgwatch's adapter, and with only cgwatch's psutil switch, side by
side on one leaking job in a real memory cgroup (issue 34). Run by hand, not in CI:

    sudo .venv-integration/bin/python -m bench.ray_side_by_side [--runs 1] [--json out.json]

The job is bench/ray_train_job.py: a local Ray (`ray.init(num_cpus=2)`), a `TorchTrainer` of
2 CPU workers (gloo) on a tiny seeded model, rank 1 leaking LEAK_MIB a step in every
attempt (a leak that a restart releases), a checkpoint reported every EVERY steps, and
`FailureConfig(max_failures=MAX_FAILURES)`. The whole Ray node (driver, GCS, raylet,
workers) runs in one child of our own memory cgroup limited to LIMIT, as in a container. The
cases:
- `alone`: Ray's documented defaults (its memory monitor: 250 ms, 95 %), nothing of cgwatch;
- `alone-sees-cgroup`: the same, but the node's view of /sys/fs/cgroup/memory is the job's
  cgroup (a private mount namespace with that directory bind-mounted there, as a container
  runtime shows a container its own cgroup): what Ray does when it sees the limit;
- `cgwatch`: the adapter (cgwatch.integrations.ray.guard_step every step);
- `psutil`: only the psutil switch (CGWATCH_PSUTIL=1 in every Python process of the node);
  on a v1 host `ray.init` then fails: its node total is psutil's (the job's limit) but its
  used memory the root cgroup's (the whole host's), so the memory left for tasks is negative;
- `psutil-sized`: the switch, and `ray.init(object_store_memory=, _memory=)` given, so that
  Ray starts: what its memory monitor (C++, in the raylet, no psutil) then does.
And the healthy twin of each (`--shape healthy`): the same job whose leak is freed every
SAWTOOTH steps, peaking near the limit: nothing should stop or kill it.

Measured per run: the kernel's OOM kills (the cgroup's `memory.oom_control`), Ray's own
(its raylet log's "Killing N worker(s)"), the attempts (distinct worker pids of rank 1),
steps trained twice (a (rank, step) line written more than once), the wall time from the
driver's start to its end, whether the job finished, and the lines that told the user why
(the guard's, Ray's failure policy's, Ray's OOM message). Afterwards it checks that nothing
is left: no process in the cgroup, no /tmp/ray, Ray's session directory inside the run's.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Optional

from bench import cgroups

MiB = 1 << 20
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_train_job.py")
LIMIT = 2560 * MiB
STEPS = 300
EVERY = 50
LEAK_MIB = 8
SAWTOOTH = 25
MAX_FAILURES = 5
STEP_SECONDS = 0.05
CASES = ("alone", "alone-sees-cgroup", "cgwatch", "psutil", "psutil-sized")
# The Ray node's sizes given to ray.init, for `psutil-sized`: with only the psutil switch
# Ray's own sizing fails (module docstring).
SIZED = {"object_store_memory": 256 * MiB, "_memory": 1024 * MiB}
# The psutil switch as its .pth line runs it (cgwatch.integrations.switches.pth_line), from
# a sitecustomize.py on PYTHONPATH: the same switch in every Python process of the node
# (workers inherit the driver's environment), without writing into the venv.
SITECUSTOMIZE = "from cgwatch.integrations import switches as _s\nexec(_s.pth_line())\n"


def job_config(case: str, shape: str, root: str, **extra: Any) -> dict[str, Any]:
    """The job's configuration (bench/ray_train_job.py) for one case and shape."""
    config: dict[str, Any] = {
        "dir": root, "steps": STEPS, "every": EVERY, "leak_mib": LEAK_MIB, "leak_rank": 1,
        "leak_attempts": "all", "max_failures": MAX_FAILURES, "step_seconds": STEP_SECONDS,
        "guard": "cgwatch" if case == "cgwatch" else "none",
    }
    if shape == "healthy":
        config["sawtooth"] = SAWTOOTH
    if case == "psutil-sized":
        config["ray_init"] = SIZED
    config.update(extra)
    return config


def environment(case: str, root: str) -> dict[str, str]:
    """The driver's environment: this checkout first on the path, no token file in ~/.ray
    (Ray 2.60 writes /root/.ray/auth_token otherwise), temporary files in the run's dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CGWATCH", "RAY_"))}
    path = [cgroups.PROJECT]
    if case.startswith("psutil"):
        site = os.path.join(root, "site")
        os.makedirs(site, exist_ok=True)
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE)
        path.insert(0, site)
        env["CGWATCH_PSUTIL"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["RAY_AUTH_MODE"] = "disabled"
    env["PYTHONUNBUFFERED"] = "1"
    tmp = os.path.join(root, "tmp")
    os.makedirs(tmp, exist_ok=True)
    env["TMPDIR"] = tmp
    return env


def run_job(tree: cgroups.Tree, cgroup: str, config: dict[str, Any], env: dict[str, str],
            *, sees_cgroup: bool = False, timeout: float = 900) -> dict[str, Any]:
    """Run the job's driver inside `cgroup` until it ends (at most `timeout` s; then every
    process there is killed); what it printed and its RESULT."""
    argv = [sys.executable, JOB, json.dumps(config)]
    if sees_cgroup:
        # A private mount namespace whose /sys/fs/cgroup/memory is the job's cgroup.
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f"mount --bind {cgroup} /sys/fs/cgroup/memory && exec \"$@\"", "sh", *argv]
    code = (f"import os, sys\nos.execvpe({argv[0]!r}, {argv!r}, os.environ)\n")
    started = time.monotonic()
    proc = tree.spawn(cgroup, code, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        cgroups.remove_cgroup(cgroup, tries=1)  # kill everything in it (the rmdir may fail)
        out, err = proc.communicate()
    seconds = time.monotonic() - started
    results = [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]
    return {"rc": proc.returncode, "stdout": out, "stderr": err, "wall": round(seconds, 1),
            "result": json.loads(results[-1]) if results else None}


def step_lines(root: str) -> dict[int, list[dict[str, Any]]]:
    """Every step line each rank wrote, in order (bench/ray_train_job.py)."""
    lines: dict[int, list[dict[str, Any]]] = {}
    for rank in (0, 1):
        path = os.path.join(root, "steps", f"rank{rank}.jsonl")
        got = []
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        got.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut by a kill
        lines[rank] = got
    return lines


def ray_kills(ray_dir: str) -> int:
    """Workers Ray's memory monitor killed: its raylet logs' "Killing N worker(s)"."""
    total = 0
    for path in glob.glob(os.path.join(ray_dir, "session_*", "logs", "raylet*.out")):
        with open(path, errors="replace") as f:
            total += sum(int(n) for n in re.findall(r"Killing (\d+) worker\(s\)", f.read()))
    return total


def memory_monitor_view(root: str) -> Optional[str]:
    """The raylet's line saying what total memory its monitor uses."""
    for path in glob.glob(os.path.join(root, "ray", "session_*", "logs", "raylet*.out")):
        with open(path, errors="replace") as f:
            for line in f:
                if "ThresholdMemoryMonitor initialized" in line:
                    return line.split("threshold_memory_monitor.cc:", 1)[-1].strip()
    return None


TOLD = (
    re.compile(r"cgwatch guard: .*"),
    re.compile(r"\[FailurePolicy\] \w+"),
    re.compile(r"Error count: \d+ \(max allowed: \d+\)"),
    re.compile(r"Task was killed due to the node running low on memory[^\n]*"),
    re.compile(r"Memory on the node[^\n]*"),
    re.compile(r"ActorDiedError[^\n]{0,160}"),
    re.compile(r"A worker died or was killed while executing a task by an unexpected system "
               r"error"),
    re.compile(r"Some common causes include: \(1\) the process was killed by the OOM killer"),
    re.compile(r"SIGKILL[^\n]{0,120}"),
    re.compile(r"OutOfMemoryError[^\n]{0,160}"),
    re.compile(r"ValueError: After taking into account object store[^\n]{0,200}"),
)


def told(text: str) -> list[str]:
    """The distinct lines of `text` that tell the user why the job stopped or was killed."""
    seen: list[str] = []
    for pattern in TOLD:
        for match in pattern.finditer(text):
            line = re.sub(r"\x1b\[[0-9;]*m", "", match.group(0))
            line = re.sub(r"pid=\d+|\d+\.\d+ s|\d+(\.\d+)? MiB", "#", line)[:220]
            if line not in seen:
                seen.append(line)
    return seen


def measure(case: str, shape: str, *, limit: int = LIMIT, keep: Optional[str] = None,
            timeout: float = 900, **extra: Any) -> dict[str, Any]:
    """One run of the job in a fresh cgroup limited to `limit`: the figures (module
    docstring). The run's directory is removed unless `keep` names where to copy it."""
    root = tempfile.mkdtemp(prefix="cgw-ray-")  # short: Ray's socket paths (AF_UNIX, 107 B)
    try:
        config = job_config(case, shape, root, **extra)
        with cgroups.cgroup_tree() as tree:
            cgroup = tree.make("ray-node", limit)
            run = run_job(tree, cgroup, config, environment(case, root),
                          sees_cgroup=case == "alone-sees-cgroup", timeout=timeout)
            with open(os.path.join(root, "driver.out"), "w") as f:
                f.write(run["stdout"] + run["stderr"])
            kernel = cgroups.oom_kills(cgroup, tree.version)
            peak_name = "memory.max_usage_in_bytes" if tree.version == 1 else "memory.peak"
            try:
                peak = int(cgroups.read(os.path.join(cgroup, peak_name)))
            except (OSError, ValueError):
                peak = None
            left = cgroups.read(os.path.join(cgroup, "cgroup.procs")).split()
        lines = step_lines(root)
        # A step trained twice: written twice by the same rank (both ranks train in lockstep;
        # a killed rank may have written one line fewer).
        twice = max(sum(1 for n in Counter(line["step"] for line in got).values() if n > 1)
                    for got in lines.values())
        steps = {rank: sorted({line["step"] for line in got}) for rank, got in lines.items()}
        attempts = len({line["pid"] for line in lines[1]})
        result = run["result"] or {}
        return {
            "case": case, "shape": shape, "limit": limit, "rc": run["rc"],
            "end": result.get("end", "no result"), "guard_stop": result.get("guard_stop"),
            "oom_kills_kernel": kernel, "oom_kills_ray": ray_kills(os.path.join(root, "ray")),
            "attempts": attempts,
            "steps_twice": twice,
            "last_step": min(max(s) if s else 0 for s in steps.values()),
            "wall": run["wall"], "peak": peak, "left_in_cgroup": left,
            "ray_view": memory_monitor_view(root),
            "told": told(run["stdout"] + run["stderr"]),
            "losses": {rank: {line["step"]: line["loss"] for line in got}
                       for rank, got in lines.items()},
            "lines": lines, "error": result.get("error"),
            "tail": (run["stdout"] + run["stderr"])[-4000:],
        }
    finally:
        if keep:
            shutil.copytree(root, keep, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("sockets", "session_latest"))
        shutil.rmtree(root, ignore_errors=True)


def row(m: dict[str, Any]) -> str:
    return (f"| {m['case']} | {m['shape']} | {m['end']} | {m['oom_kills_kernel']} | "
            f"{m['oom_kills_ray']} | {m['attempts']} | {m['steps_twice']} | {m['wall']:.0f} s |")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for option, default in (("--cases", ",".join(CASES)), ("--shapes", "leak,healthy"),
                            ("--json", None)):
        parser.add_argument(option, default=default)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    if cgroups.unavailable_reason():
        sys.exit(f"bench.ray_side_by_side: needs real cgroups: {cgroups.unavailable_reason()}")
    runs = []
    print("| case | shape | end | OOM kills (kernel) | OOM kills (Ray) | attempts | "
          "steps trained twice | wall |")
    print("|---|---|---|---|---|---|---|---|")
    for _ in range(args.runs):
        for shape in args.shapes.split(","):
            for case in args.cases.split(","):
                m = measure(case, shape)
                runs.append({k: v for k, v in m.items() if k not in ("lines", "losses")})
                print(row(m), flush=True)
                for line in m["told"]:
                    print(f"    told: {line}", flush=True)
                print(f"    Ray's monitor: {m['ray_view']}; peak {m['peak']}; "
                      f"left in the cgroup: {m['left_in_cgroup'] or 'nothing'}", flush=True)
    print(f"/tmp/ray exists: {os.path.exists('/tmp/ray')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
