"""Internal. The `cgwatch` command itself: the levels from this process's cgroup to the top,
and the totals, as a table or JSON (with `--sample SECONDS`, each limited level's growth and
time to its limit, from samples over that time); and /dev/shm when it is smaller than the
available memory (JSON: always, with `limits` saying whether it is)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from .. import trends
from ..forecast import Trend
from ..headroom import throttle_headroom
from ..monitor import Monitor
from ..shm import shm_limits, shm_usage
from ..snapshot import LevelInfo
from ..units import human_bytes

SAMPLES_PER_BUCKET = 4  # --sample reads the levels 4 times a bucket: the peak is each bucket's

LEGEND = {"T": "T: limit that sets total_memory", "A": "A: level with the least headroom"}


def sample_forecast(monitor: Monitor, seconds: float) -> dict[str, Any]:
    """`--sample SECONDS`: read the levels every SAMPLES_PER_BUCKET-th of a bucket for
    `seconds` and forecast each limited level (trends.py). One shot has no history, so the
    forecast needs this wait; forecast.py's model with `seconds / 12` buckets (at least 6
    closed ones before any growth counts), so a sawtooth whose cycle is longer than the 12
    buckets sampled may show its rising edge as growth (and a seconds-to-limit only within a
    third of what was sampled): say so with the answer (`bucket`)."""
    bucket = seconds / 12
    found = trends.LevelTrends(bucket=bucket)
    start = time.monotonic()
    latest: dict[str, Trend] = {}
    levels = []
    while True:
        now = time.monotonic()
        levels = monitor.levels()
        latest = found.add(now, levels)
        if now - start >= seconds:
            break
        time.sleep(min(bucket / SAMPLES_PER_BUCKET, max(0.0, start + seconds - now)))
    return {"sampled_seconds": time.monotonic() - start, "bucket": bucket,
            "levels": {lvl.cgroup_path: trends.fields(latest[lvl.cgroup_path], lvl.limit,
                                                      lvl.high)
                       for lvl in levels if lvl.cgroup_path in latest}}


def report(monitor: Monitor, root: str = "/",
           forecast: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Everything the command shows, as plain data (bytes). `forecast`: sample_forecast()'s,
    or None (no --sample: a one-shot command has no history to forecast from)."""
    status = monitor.status
    host_total, host_available = monitor.host_memory()
    available = monitor.available_memory()
    shm = shm_usage(root)
    # One live read of the levels serves both: usage moves between two reads (in 256 KiB
    # batches on v2, seen in the VM), and the table must agree with itself.
    levels = monitor.levels()
    return {
        "total_memory": monitor.total_memory(),
        "available_memory": available,
        "throttle_headroom": throttle_headroom([lvl.high_headroom for lvl in levels]),
        "dev_shm": None if shm is None else {**shm.as_dict(),
                                             "limits": shm_limits(shm, available)},
        "host": {"mem_total": host_total, "mem_available": host_available,
                 "source": status.host_source},
        "status": {"mode": status.mode, "reason": status.reason, "version": status.version,
                   "cgroup_path": status.cgroup_path, "directory": status.directory,
                   "above": status.above},
        "levels": [lvl.as_dict() for lvl in levels],
        "forecast": forecast,
        "slurm": slurm_report(status.cgroup_path, os.environ, levels),
    }


def slurm_report(cgroup_path: Optional[str], environ: Mapping[str, str],
                 levels: Sequence[LevelInfo]) -> Optional[dict[str, Any]]:
    """The Slurm job this process is in (None outside one): ids, what it declared, and
    whether a cgroup enforces it (None: nothing declared)."""
    from .explain import slurm_job

    job = slurm_job(cgroup_path, environ, levels)
    return None if job is None else job.as_dict()


def format_table(data: dict[str, Any]) -> str:
    status = data["status"]
    lines = []
    if status["version"] is None:
        lines.append(f"no memory cgroup: {status['reason']}")
    else:
        lines.append(f"cgroup v{status['version']}  {status['cgroup_path']}  "
                     f"({status['directory']})  mode: {status['mode']}")
        if status["reason"]:
            lines.append(f"note: {status['reason']}")
        if status.get("above"):
            lines.append(f"note: {status['above']}")
    levels = data["levels"]
    # memory.high and swap only where some level has them (v2 memory.high; swap accounting)
    extra = [(key, title) for key, title in (("high", "high"), ("swap_limit", "swap limit"),
                                             ("swap_usage", "swap used"))
             if any(lvl.get(key) is not None for lvl in levels)]
    forecast = (data.get("forecast") or {}).get("levels")
    if forecast is not None:
        extra.append(("growth", "growth/s"))
        extra.append(("seconds_to_limit", "limit in"))
        levels = [{**lvl, **forecast.get(lvl["cgroup_path"], {})} for lvl in levels]
    header = ("", "cgroup", "limit", "usage", "inactive_file", "headroom",
              *(title for _, title in extra))
    rows = [header]
    for lvl in levels:
        mark = ("T" if lvl["binds_total"] else " ") + ("A" if lvl["binds_available"] else " ")
        name = lvl["cgroup_path"]
        if lvl.get("slurm_role"):
            name += f"  [{lvl['slurm_role']} {lvl['slurm_id']}]"
        rows.append((mark, name, human_bytes(lvl["limit"]),
                     human_bytes(lvl["usage"]), human_bytes(lvl["inactive_file"]),
                     human_bytes(lvl["headroom"]),
                     *(_cell(key, lvl.get(key)) for key, _ in extra)))
    host = data["host"]
    # The marks follow the answers: the host row when the host's figure is the answer and no
    # level was marked (MemAvailable is read again for the table: within 1% is the same).
    host_total = not any(lvl["binds_total"] for lvl in levels) \
        and data["total_memory"] == host["mem_total"]
    host_available = not any(lvl["binds_available"] for lvl in levels) \
        and abs(data["available_memory"] - host["mem_available"]) \
        <= max(1 << 20, host["mem_available"] // 100)
    host_mark = ("T" if host_total else " ") + ("A" if host_available else " ")
    rows.append((host_mark.rstrip(), "host", human_bytes(host["mem_total"]), "", "",
                 human_bytes(host["mem_available"]), *("" for _ in extra)))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    marks = {m for r in rows[1:] for m in r[0] if m != " "}
    if marks:
        lines.append("   ".join(text for mark, text in LEGEND.items() if mark in marks))
    for lvl in levels:
        if lvl.get("kind", "cgroup") != "cgroup" and lvl.get("problem"):
            lines.append(f"{lvl['cgroup_path']}: {lvl['problem']}")
    slurm = data.get("slurm")
    if slurm:
        job = f"Slurm job {slurm['job']}" + (f", step {slurm['job']}.{slurm['step']}"
                                             if slurm["step"] is not None else "")
        if slurm["option"]:
            job += f", {slurm['option']}" + ("" if slurm["enforced_by_cgroup"] else
                                             " (declared, not enforced by a cgroup)")
        lines.append(job)
    lines.append(f"total_memory:     {human_bytes(data['total_memory'])} "
                 f"({data['total_memory']} bytes)")
    lines.append(f"available_memory: {human_bytes(data['available_memory'])} "
                 f"({data['available_memory']} bytes)")
    if data.get("throttle_headroom") is not None:
        lines.append(f"before throttling: {human_bytes(data['throttle_headroom'])} "
                     f"({data['throttle_headroom']} bytes; above memory.high the job is slowed, "
                     "not killed)")
    if forecast is not None:
        lines.append(f"growth/s, limit in: the working set's growth over "
                     f"{data['forecast']['sampled_seconds']:.0f} s of samples and when the "
                     f"limit is reached at that rate (empty: no lasting growth seen; cycles "
                     f"shorter than {12 * data['forecast']['bucket']:.1f} s are not taken for "
                     f"growth)")
    shm = data.get("dev_shm")
    if shm and shm["limits"]:
        lines.append(f"/dev/shm:         {human_bytes(shm['size'])} ({shm['size']} bytes), "
                     f"{human_bytes(shm['used'])} used, smaller than available_memory: "
                     "shared memory (DataLoader workers) runs out first, with SIGBUS")
    return "\n".join(lines)


def _cell(key: str, value: Any) -> str:
    if key == "growth":
        return "" if value is None else f"{human_bytes(int(value))}"
    if key == "seconds_to_limit":
        return "" if value is None else f"~{value:.0f} s"
    return human_bytes(value)


def run_show(root: str, as_json: bool, sample: Optional[float] = None) -> int:
    """Print the table (or JSON) for the tree at `root`; the exit status. `sample`: seconds
    to sample the levels for a forecast first."""
    with Monitor(root) as monitor:
        forecast = sample_forecast(monitor, sample) if sample else None
        data = report(monitor, root, forecast)
    if as_json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(data))
    return 0
