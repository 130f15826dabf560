"""Internal. `cgwatch watch`: the current headroom, then one line per memory event and per headroom
threshold crossing until Ctrl-C (or SIGTERM); `--json` prints JSON lines instead. Every
`--interval` the levels are read: each limited level's working-set forecast (trends.py) is
told when its band changes (its limit under 10 min, 2 min, 30 s, 10 s away at the growth
seen, or no longer in sight), and `--plot FILE` draws them at the end (plot.py). Bursts of
one counter at one level are coalesced (coalesce.py), and a /dev/shm fuller than
`--shm-above` is warned about (and its recovery told) once per crossing."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, Optional, TextIO

from .. import trends
from ..alerts import Threshold
from ..event import Event
from ..events import Events, Item
from ..forecast import Trend
from ..monitor import Monitor
from ..shm import ShmUsage, shm_limits, shm_usage
from ..snapshot import LevelInfo
from ..units import human_bytes
from .coalesce import Coalescer, rises_suffix
from .format import format_item

if TYPE_CHECKING:
    from .plot import Recorder

# /dev/shm must drop this many points below --shm-above before "back below" is told: a
# DataLoader filling and freeing batches around the line would otherwise print every check.
SHM_HYSTERESIS = 5.0


def start_record(monitor: Monitor, events: Events, thresholds: list[Threshold],
                 shm: Optional[ShmUsage] = None) -> dict[str, Any]:
    """What `watch` prints first: where it is, the headroom now, and how it is watching."""
    status = monitor.status
    available = monitor.available_memory()
    least = [lvl for lvl in monitor.levels() if lvl.binds_available]
    return {"type": "start", "time": time.monotonic(), "wall_time": time.time(),
            "version": status.version, "cgroup_path": status.cgroup_path,
            "directory": status.directory, "mode": status.mode, "reason": status.reason,
            "available_memory": available, "total_memory": monitor.total_memory(),
            "least_headroom": least[0].cgroup_path if least else None,
            "thresholds": [t.describe() for t in thresholds],
            "dev_shm": shm.as_dict() if shm_limits(shm, available) and shm else None,
            **events.mechanisms()}


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
    shm = rec.get("dev_shm")
    if shm:
        lines.append(f"  /dev/shm {human_bytes(shm['size'])} (smaller than available), "
                     f"{shm['percent_used']:g}% used")
    return "\n".join(lines)


def shm_crossing(full: bool, usage: ShmUsage, above: float) -> Optional[bool]:
    """The new state when /dev/shm crossed `above` percent (True: now fuller), else None."""
    if not full and usage.percent_used > above:
        return True
    if full and usage.percent_used <= above - SHM_HYSTERESIS:
        return False
    return None


def shm_record(usage: ShmUsage, full: bool, above: float) -> dict[str, Any]:
    return {"type": "shm", "state": "above" if full else "below", "threshold_percent": above,
            **usage.as_dict(), "time": time.monotonic(), "wall_time": time.time()}


def format_shm(rec: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(rec["wall_time"]))
    use = (f"{rec['percent_used']:g}% full ({human_bytes(rec['used'])} of "
           f"{human_bytes(rec['size'])})")
    if rec["state"] == "above":
        return (f"{stamp} WARNING /dev/shm is {use}, above {rec['threshold_percent']:g}%: a "
                "process that maps more of it dies of SIGBUS (raise it: docker run --shm-size, "
                "a Kubernetes emptyDir with medium: Memory)")
    return f"{stamp} INFO    /dev/shm is back to {use}"


def forecast_record(level: LevelInfo, trend: Trend, band: int) -> dict[str, Any]:
    """A level's forecast when its band changed (trends.band): growth and seconds left."""
    return {"type": "forecast", "cgroup_path": level.cgroup_path, "band": band,
            **trends.fields(trend, level.limit, level.high), "limit": level.limit,
            "high": level.high, "headroom": level.headroom, "time": time.monotonic(),
            "wall_time": time.time()}


def format_forecast(rec: dict[str, Any], before: int) -> str:
    """One line: WARNING when the limit came closer (a higher band), INFO when it went away."""
    stamp = time.strftime("%H:%M:%S", time.localtime(rec["wall_time"]))
    where = rec["cgroup_path"]
    grow = f"working set growing {human_bytes(int(rec['growth']))}/s"
    left = rec["seconds_to_limit"]
    if rec["band"] == 0:
        return (f"{stamp} INFO    {where}: its limit is no longer in sight within "
                f"{trends.BANDS[0]:.0f} s ({grow})")
    level = "WARNING" if rec["band"] > before else "INFO   "
    room = f", headroom {human_bytes(rec['headroom'])}" if rec["headroom"] is not None else ""
    when = "reached" if left == 0 else f"in ~{left:.0f} s at this rate"
    return (f"{stamp} {level} {where}: {grow}: its limit ({human_bytes(rec['limit'])}) "
            f"{when}{room}")


def json_item(item: Item, rises: int = 1) -> str:
    extra = {"rises": rises} if rises > 1 else {}
    return json.dumps({**item.as_dict(), **extra, "wall_time": time.time()})


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_watch(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    # SIGINT is Python's KeyboardInterrupt unless the parent ignored it (`cmd &` in a
    # script): then it stays ignored, as a background job's should; SIGTERM always stops.
    signal.signal(signal.SIGTERM, _stop)
    with Monitor(args.root) as monitor, Events(monitor, log=False,
                                               poll_interval=args.interval,
                                               check_interval=args.interval) as events:
        for spec in args.below:
            events.alert_below(spec)
        recorder = None
        if args.plot:
            from .plot import Recorder

            recorder = Recorder(monitor, interval=args.interval)
        try:
            shm = shm_usage(args.root)
            rec = start_record(monitor, events, args.below, shm)
            out.write((json.dumps(rec) if args.json else format_start(rec)) + "\n")
            out.flush()
            _follow(args, monitor, events, out, shm, recorder)
        except KeyboardInterrupt:
            pass
        if recorder is not None and args.plot:
            from .plot import write_plot

            recorder.mark("exit", "watch ended", final=True)
            why = write_plot(args.plot, recorder.as_dict(), "cgwatch watch")
            if why is not None:
                print(f"cgwatch watch: --plot: {why}", file=sys.stderr, flush=True)
        # A closed pipe (`cgwatch watch | head`) goes up to cli.main, which ends quietly.
    return 0


def _follow(args: argparse.Namespace, monitor: Monitor, events: Events, out: TextIO,
            shm: Optional[ShmUsage], recorder: Optional[Recorder]) -> None:
    coalescer = Coalescer()
    # A forecast per limited level from the levels read every interval; a line only when a
    # level's band (trends.BANDS: 10 min, 2 min, 30 s, 10 s to its limit) changes.
    forecasts = trends.LevelTrends()
    bands: dict[str, int] = {}
    shm_full = False
    next_shm = time.monotonic()
    while not events.closed:
        now = time.monotonic()
        deadlines = [next_shm] + [t for t in [coalescer.next_due()] if t is not None]
        item = events.get(timeout=max(0.0, min(deadlines) - now))
        now = time.monotonic()
        if recorder is not None and item is not None:
            recorder.event(item)
        if isinstance(item, Event) and item.propagated and not args.all:
            item = None  # the level below's rise, repeated by v2's hierarchical counters
        lines = coalescer.offer(item, now) if item is not None else coalescer.due(now)
        for shown, rises in lines:
            out.write((json_item(shown, rises) if args.json else
                       format_item(shown) + rises_suffix(rises))
                      + "\n")
        if now >= next_shm:
            next_shm = now + args.interval
            levels = monitor.levels()
            if recorder is not None:
                recorder.sample(levels)
            _forecast(args, levels, forecasts.add(now, levels), bands, out, recorder)
            shm = shm_usage(args.root) if shm is not None else None  # none at start: none
            state = shm_crossing(shm_full, shm, args.shm_above) if shm else None
            if state is not None and shm is not None:
                shm_full = state
                rec = shm_record(shm, state, args.shm_above)
                out.write((json.dumps(rec) if args.json else format_shm(rec)) + "\n")
        out.flush()


def _forecast(args: argparse.Namespace, levels: list[LevelInfo], found: dict[str, Trend],
              bands: dict[str, int], out: TextIO, recorder: Optional[Recorder]) -> None:
    for level in levels:
        trend = found.get(level.cgroup_path)
        if trend is None:
            continue
        now_band = trends.heading(trend, level.limit)
        before = bands.get(level.cgroup_path, 0)
        bands[level.cgroup_path] = now_band
        if now_band != before:
            rec = forecast_record(level, trend, now_band)
            out.write((json.dumps(rec) if args.json else format_forecast(rec, before)) + "\n")
            if recorder is not None:
                left = rec["seconds_to_limit"]
                recorder.mark("forecast", "limit not in sight" if left is None
                              else f"limit in ~{left:.0f} s", cgroup_path=level.cgroup_path)
    for gone in [p for p in bands if p not in found]:
        del bands[gone]
