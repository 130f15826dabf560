"""`cgwatch watch`: the current headroom, then one line per memory event and per headroom
threshold crossing until Ctrl-C (or SIGTERM); `--json` prints JSON lines instead."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any, TextIO

from ..alerts import Threshold
from ..event import Event
from ..events import Events, Item
from ..monitor import Monitor
from ..units import human_bytes
from .format import format_item


def start_record(monitor: Monitor, events: Events, thresholds: list[Threshold]) -> dict[str, Any]:
    """What `watch` prints first: where it is, the headroom now, and how it is watching."""
    status = monitor.status
    available = monitor.available_memory()
    least = [lvl for lvl in monitor.levels() if lvl.binds_available]
    return {"type": "start", "time": time.monotonic(), "wall_time": time.time(),
            "version": status.version, "cgroup_path": status.cgroup_path,
            "directory": status.directory, "mode": status.mode, "reason": status.reason,
            "available_memory": available, "total_memory": monitor.total_memory(),
            "least_headroom": least[0].cgroup_path if least else None,
            "thresholds": [t.describe() for t in thresholds], **events.mechanisms()}


def format_start(rec: dict[str, Any]) -> str:
    if rec["version"] is None:
        where = f"no memory cgroup ({rec['reason']})"
    else:
        where = f"cgroup v{rec['version']} {rec['cgroup_path']} ({rec['mode']})"
    least = f", least headroom at {rec['least_headroom']}" if rec["least_headroom"] else ""
    lines = [f"cgwatch watch: {where}",
             f"  available {human_bytes(rec['available_memory'])} of "
             f"{human_bytes(rec['total_memory'])}{least}",
             f"  events: {rec['events']}"]
    if rec["thresholds"]:
        lines.append(f"  alerts below {', '.join(rec['thresholds'])}: {rec['alerts']}")
    return "\n".join(lines)


def json_item(item: Item) -> str:
    return json.dumps({**item.as_dict(), "wall_time": time.time()})


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_watch(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    signal.signal(signal.SIGTERM, _stop)
    with Monitor(args.root) as monitor, Events(monitor, log=False,
                                               poll_interval=args.interval,
                                               check_interval=args.interval) as events:
        for spec in args.below:
            events.alert_below(spec)
        try:
            rec = start_record(monitor, events, args.below)
            out.write((json.dumps(rec) if args.json else format_start(rec)) + "\n")
            out.flush()
            for item in events:
                if isinstance(item, Event) and item.propagated and not args.all:
                    continue
                line = json_item(item) if args.json else format_item(
                    item, events.limit_above(item))
                out.write(line + "\n")
                out.flush()
        except KeyboardInterrupt:
            pass
        except BrokenPipeError:
            pass  # `cgwatch watch | head`: the reader is gone
    return 0
