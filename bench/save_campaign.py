"""Does the guard leave a job time to save? A campaign in real cgroups (not a CI test).

    sudo .venv/bin/python -m bench.save_campaign [--runs 20] [--seed 19] [--quick | --long]

1. **Leak campaign**: `--runs` jobs (bench/save_child.py `leak`), each in a fresh child cgroup
   of our own limited to 256 MiB, leaking at a seeded random rate (8-64 MiB/s) from a thread
   that does not pause while the job saves; the job checks `cgwatch.Guard` every 10 ms step
   and, told to stop, "saves" (a file written, fsynced, renamed; `--save-seconds` in all).
   `--margin`: the guard's (lead = save time x margin; 1.5, the Guard's default). Saved =
   exit 75 with the checkpoint in place and no `oom_kill` counted. A save was *possible in
   time* when the leak needed at least FIRST_SIGHT + the save's time to fill what the job
   had left once started (its `available_memory()` before the leak): the forecast needs 4
   closed 1 s buckets to see any growth (forecast.py), so a faster leak can only be caught
   by the reserve. Goal: >= 95% saved
   among those.
2. **Sawtooth**: one job with a flat base and allocate/free cycles (`sawtooth`) in a 256 MiB
   cgroup, for 600 s (`--long`), 30 s (`--quick`) or 120 s; goal 0 stops.
Prints a table (and `--json FILE`). Runs as root in a memory cgroup where it may make children.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench import cgroups

MiB = 1 << 20
LIMIT = 256 * MiB
FIRST_SIGHT = 5.0  # seconds before the forecast can see growth (4 closed buckets + 1)
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "save_child.py")


def _child(tree: cgroups.Tree, cgroup: str, *args: str, timeout: float,
           checkpoint: str = os.devnull, save_seconds: float = 1.0,
           margin: float = 1.5) -> tuple[int, dict[str, Any]]:
    argv = [sys.executable, CHILD, "--cgroup", cgroup, "--checkpoint", checkpoint,
            "--save-seconds", str(save_seconds), "--margin", str(margin), *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree.procs.append(proc)  # killed by remove_all if we stop early
    out, err = proc.communicate(timeout=timeout)
    data: dict[str, Any] = {}
    for line in out.strip().splitlines():
        data.update(json.loads(line))
    if err:
        data["stderr"] = err[-500:]
    return proc.returncode, data


def leak_run(rate: float, save_seconds: float, margin: float, workdir: str,
             index: int) -> dict[str, Any]:
    with cgroups.cgroup_tree() as tree:
        job = tree.make("job", limit=LIMIT)
        checkpoint = os.path.join(workdir, f"checkpoint-{index}.json")
        began = time.monotonic()
        status, data = _child(tree, job, "leak", "--rate", f"{rate:.3f}", timeout=300,
                              checkpoint=checkpoint, save_seconds=save_seconds,
                              margin=margin)
        ran = time.monotonic() - began
        kills = cgroups.oom_kills(job, tree.version)
    saved = status == 75 and os.path.exists(checkpoint) and kills == 0
    # From what the job had left once started (the interpreter and cgwatch are charged there
    # too): the time the leak needs to fill it.
    fill = data.get("room_at_start", LIMIT) / (rate * MiB)
    return {"rate_mib_s": round(rate, 2), "fill_seconds": round(fill, 2),
            "possible": fill >= FIRST_SIGHT + save_seconds, "status": status,
            "oom_kills": kills, "saved": saved, "ran_seconds": round(ran, 2), **data}


def sawtooth_run(seconds: float, seed: int) -> dict[str, Any]:
    with cgroups.cgroup_tree() as tree:
        job = tree.make("job", limit=LIMIT)
        status, data = _child(tree, job, "sawtooth", "--seconds", str(seconds), "--seed",
                              str(seed), timeout=seconds + 120)
        kills = cgroups.oom_kills(job, tree.version)
    return {"status": status, "oom_kills": kills, **data}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.save_campaign")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--save-seconds", type=float, default=1.0)
    parser.add_argument("--margin", type=float, default=1.5,
                        help="the guard's margin (lead = save seconds x margin; default 1.5)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="a 30 s sawtooth, 5 leak runs")
    group.add_argument("--long", action="store_true", help="a 600 s sawtooth")
    parser.add_argument("--skip-leaks", action="store_true")
    parser.add_argument("--skip-sawtooth", action="store_true")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    why = cgroups.writable_reason()
    if why:
        print(f"save_campaign: skipped: {why}", file=sys.stderr)
        return 0
    runs = 5 if args.quick else args.runs
    rng = random.Random(args.seed)
    rates = [rng.uniform(8.0, 64.0) for _ in range(runs)]
    result: dict[str, Any] = {"seed": args.seed, "limit": LIMIT,
                              "save_seconds": args.save_seconds, "margin": args.margin,
                              "loadavg": os.getloadavg(), "leaks": [], "sawtooth": None}
    with tempfile.TemporaryDirectory(prefix="cgwatch-campaign-") as workdir:
        if not args.skip_leaks:
            for i, rate in enumerate(rates):
                run = leak_run(rate, args.save_seconds, args.margin, workdir, i)
                result["leaks"].append(run)
                print(f"[campaign] run {i + 1}/{runs}: {rate:5.1f} MiB/s, fill "
                      f"{run['fill_seconds']:5.1f} s, possible={run['possible']}, "
                      f"saved={run['saved']} ({run.get('trigger', '-')}, fired at "
                      f"{run.get('fired_at', float('nan')):.1f} s, status {run['status']}, "
                      f"oom_kills {run['oom_kills']})", file=sys.stderr, flush=True)
    if not args.skip_sawtooth:
        seconds = 30.0 if args.quick else 600.0 if args.long else 120.0
        print(f"[campaign] sawtooth for {seconds:.0f} s", file=sys.stderr, flush=True)
        result["sawtooth"] = sawtooth_run(seconds, args.seed)
    result["loadavg_after"] = os.getloadavg()
    print(summary(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def summary(result: dict[str, Any]) -> str:
    lines = []
    leaks = result["leaks"]
    if leaks:
        possible = [r for r in leaks if r["possible"]]
        saved = [r for r in possible if r["saved"]]
        share = 100.0 * len(saved) / len(possible) if possible else float("nan")
        triggers: dict[str, int] = {}
        for r in leaks:
            if r["saved"]:
                triggers[r.get("trigger", "?")] = triggers.get(r.get("trigger", "?"), 0) + 1
        lines.append(f"leak campaign: {len(leaks)} runs (seed {result['seed']}, limit "
                     f"{result['limit'] // MiB} MiB, save {result['save_seconds']:g} s, margin "
                     f"{result['margin']:g})")
        lines.append(f"  save possible in time: {len(possible)}; saved before the kill: "
                     f"{len(saved)} ({share:.0f}%) {'ok' if share >= 95 else 'MISS'} (goal 95%)")
        lines.append(f"  saved among the rest (leak too fast to see): "
                     f"{sum(r['saved'] for r in leaks if not r['possible'])}"
                     f"/{len(leaks) - len(possible)}; triggers of the saves: {triggers}")
        lefts = sorted(r["headroom"] for r in leaks if r["saved"] and r.get("headroom"))
        if lefts:
            lines.append(f"  headroom when the guard fired: {lefts[0] / MiB:.0f}-"
                         f"{lefts[-1] / MiB:.0f} MiB (median {lefts[len(lefts) // 2] / MiB:.0f})")
    saw = result["sawtooth"]
    if saw:
        stops = len(saw.get("stops", []))
        lines.append(f"sawtooth: {saw.get('seconds', 0):.0f} s, {saw.get('cycles', 0)} cycles, "
                     f"{stops} stops {'ok' if stops == 0 and not saw['oom_kills'] else 'MISS'} "
                     f"(goal 0), oom_kills {saw['oom_kills']}")
    lines.append(f"load average before {result['loadavg'][0]:.1f}, after "
                 f"{result['loadavg_after'][0]:.1f} (2 vCPUs, shared)")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
