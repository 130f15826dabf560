"""Run inside a private cgroup namespace (tests/v2/test_v2_kernel.py::test_cgroup_namespace).

The parent has already put this process's cgroup at the namespace root and mounted a fresh
cgroup2 at /sys/fs/cgroup, as a container with --cgroupns=private sees it. Protocol on
stdin/stdout, one JSON line each:
  -> {"proc_cgroup", "status", "total", "levels"}     what a new Monitor sees
  <- "<expected total>"                                after the parent changed the limit
  -> {"seen_after": seconds or null, "total"}          how long until the monitor saw it
"""

import json
import sys
import time

import cgwatch


def read_lines(path: str) -> list[str]:
    with open(path) as f:
        return f.readlines()


with cgwatch.Monitor() as monitor:
    status = monitor.status
    print(json.dumps({
        "proc_cgroup": "".join(read_lines("/proc/self/cgroup")),
        "cgroup_mounts": [ln for ln in read_lines("/proc/self/mountinfo") if "cgroup" in ln],
        "status": {"mode": status.mode, "reason": status.reason, "version": status.version,
                   "cgroup_path": status.cgroup_path, "directory": status.directory},
        "total": monitor.total_memory(),
        "available": monitor.available_memory(),
        "levels": [(lvl.cgroup_path, lvl.limit) for lvl in monitor.levels()],
    }), flush=True)
    expected = int(sys.stdin.readline())
    start = time.monotonic()
    seen_after = None
    while time.monotonic() - start < 60:  # a bound for an emulated, loaded machine
        if monitor.total_memory() == expected:  # a cache read in watching mode: no file I/O
            seen_after = time.monotonic() - start
            break
        time.sleep(0.01)
    print(json.dumps({"seen_after": seen_after, "total": monitor.total_memory(),
                      "mode": monitor.status.mode}), flush=True)
