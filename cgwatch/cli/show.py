"""The `cgwatch` command itself: the levels from this process's cgroup to the top, and the
totals, as a table or JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

from ..monitor import Monitor
from ..units import human_bytes


def report(monitor: Monitor) -> dict[str, Any]:
    """Everything the command shows, as plain data (bytes)."""
    status = monitor.status
    host_total, host_available = monitor.host_memory()
    return {
        "total_memory": monitor.total_memory(),
        "available_memory": monitor.available_memory(),
        "host": {"mem_total": host_total, "mem_available": host_available,
                 "source": status.host_source},
        "status": {"mode": status.mode, "reason": status.reason, "version": status.version,
                   "cgroup_path": status.cgroup_path, "directory": status.directory},
        "levels": [lvl.as_dict() for lvl in monitor.levels()],
    }


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
    header = ("", "cgroup", "limit", "usage", "inactive_file", "headroom")
    rows = [header]
    for lvl in data["levels"]:
        mark = ("T" if lvl["binds_total"] else " ") + ("A" if lvl["binds_available"] else " ")
        rows.append((mark, lvl["cgroup_path"], human_bytes(lvl["limit"]),
                     human_bytes(lvl["usage"]), human_bytes(lvl["inactive_file"]),
                     human_bytes(lvl["headroom"])))
    host = data["host"]
    rows.append(("", "host", human_bytes(host["mem_total"]), "", "",
                 human_bytes(host["mem_available"])))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    lines.append("T: limit that sets total_memory   A: level with the least headroom")
    lines.append(f"total_memory:     {human_bytes(data['total_memory'])} "
                 f"({data['total_memory']} bytes)")
    lines.append(f"available_memory: {human_bytes(data['available_memory'])} "
                 f"({data['available_memory']} bytes)")
    return "\n".join(lines)


def run_show(root: str, as_json: bool) -> int:
    """Print the table (or JSON) for the tree at `root`; the exit status."""
    with Monitor(root) as monitor:
        data = report(monitor)
    if as_json:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(data))
    return 0
