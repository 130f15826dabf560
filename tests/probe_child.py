"""A child process that runs a Monitor where the test put it and answers questions on stdin.

One JSON request per line, one JSON reply per line. Requests:
  {"op": "query"}                         -> total, available, status, levels
  {"op": "total"}                         -> total alone (a query loop's cheap form: under the
                                             VM tier's emulation the full reply costs ~0.5 s)
  {"op": "wait_total", "value": N, "timeout": s}
      spin on total_memory() (an attribute read: it triggers nothing) until it equals N;
      reply with the CLOCK_MONOTONIC time it was first seen, comparable across processes
  {"op": "headroom", "directory": D}       -> available_memory() and an independent reading of
                                              D's headroom taken right after it
  {"op": "exit"}
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cgwatch import Monitor  # noqa: E402
from tests.kernel_files import measured_headroom  # noqa: E402  (no pytest: see there)


def main() -> None:
    monitor = Monitor(migration_interval=float(os.environ.get("PROBE_MIGRATION", "5")))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "exit":
            break
        if op == "query":
            reply = {
                "total": monitor.total_memory(),
                "available": monitor.available_memory(),
                "status": monitor.status.__dict__,
                "levels": [lvl.as_dict() for lvl in monitor.levels()],
            }
        elif op == "total":
            reply = {"total": monitor.total_memory()}
        elif op == "wait_total":
            deadline = time.monotonic() + req["timeout"]
            seen_at = None
            while time.monotonic() < deadline:
                if monitor.total_memory() == req["value"]:
                    seen_at = time.monotonic()
                    break
                time.sleep(0.0002)
            reply = {"seen_at": seen_at, "total": monitor.total_memory()}
        elif op == "headroom":
            available = monitor.available_memory()
            version = monitor.status.version or 1
            reply = {"available": available,
                     "measured": measured_headroom(req["directory"], version)}
        else:
            reply = {"error": f"unknown op {op}"}
        print(json.dumps(reply), flush=True)
    monitor.close()


if __name__ == "__main__":
    main()
