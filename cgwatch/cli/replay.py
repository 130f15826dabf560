"""Internal. `cgwatch replay FILE [--reserve ...] [--checkpoint-seconds ...] [--margin ...]
[--json] [--plot PNG]`: a guard's record (`Guard(record=)`, `cgwatch run --guard --record`)
fed to the decision again (guardreplay.py). With no option: the live decisions, each checked
(exit 1 if one differs). With options: where a guard with them would have stopped the job,
and how each of its would-be stops is judged by what the record says followed (wouldstop.py).
`--plot`: the levels' working set against their limits, the would-be stops and the lead
each kept (shaded), with other options also where the recorded guard stopped, drawn by
plot.py's `write_plot`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

from ..alerts import Threshold
from ..guardrecord import parse_record
from ..guardreplay import Replayed, replay
from ..policy import Verdict
from ..wouldstop import counts, describe, summary_line
from .observed import stop_dict

OVERRIDES = ("reserve", "checkpoint_seconds", "margin", "rise_margin")


def run_replay(args: argparse.Namespace) -> int:
    """`cgwatch replay` (the module docstring)."""
    try:
        with open(args.file, encoding="utf-8") as f:
            record = parse_record(f)
    except (OSError, ValueError) as e:
        print(f"cgwatch replay: {args.file}: {getattr(e, 'strerror', None) or e}",
              file=sys.stderr)
        return 1
    overrides = {name: getattr(args, name) for name in OVERRIDES
                 if getattr(args, name, None) is not None}
    try:
        replayed = replay(record, overrides)
    except ValueError as e:  # options the decision refuses (a margin under 1, ...)
        print(f"cgwatch replay: {e}", file=sys.stderr)
        return 2
    report = replay_report(args.file, replayed, overrides)
    if args.plot:
        from .plot import write_plot

        why = write_plot(args.plot, plot_data(replayed), f"cgwatch replay {args.file}"
                         + "".join(f" --{k.replace('_', '-')} {v}" for k, v in
                                   report["overrides"].items()))
        if why is not None:
            print(f"cgwatch replay: --plot: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(report))
    else:
        print("\n".join(format_report(report)))
    return 1 if replayed.exact and replayed.mismatches else 0


def _option(value: Any) -> Any:
    """An option as given on the command line: a reserve as "10%" or "512M"."""
    if isinstance(value, Threshold):
        if value.fraction is not None:
            return f"{value.fraction * 100:g}%"
        return f"{value.bytes}"
    return value


def _verdict(at: float, verdict: Verdict, start: float) -> dict[str, Any]:
    return {"at": round(at - start, 6), **verdict.as_dict(), "message": verdict.message()}


def replay_report(path: str, replayed: Replayed, overrides: dict[str, Any]) -> dict[str, Any]:
    """The replay as a plain dict (`--json`); times in seconds since the record's start."""
    start = replayed.start
    first = next(((t, v) for t, v in replayed.changes if v.stop), None)
    return {
        "record": path, "exact": replayed.exact,
        "overrides": {k: _option(v) for k, v in overrides.items()},
        "reproduced": (not replayed.mismatches) if replayed.exact else None,
        "mismatches": replayed.mismatches, "checks": replayed.checks,
        "samples": replayed.samples, "seconds": round(replayed.end - start, 3),
        "ended": None if replayed.ended is None else round(replayed.ended - start, 3),
        "oom_killed": replayed.oom_killed, "cut": replayed.cut,
        "first_stop": None if first is None else _verdict(first[0], first[1], start),
        "changes": [_verdict(t, v, start) for t, v in replayed.changes],
        "would_stops": {"counts": counts(replayed.judged),
                        "stops": [stop_dict(j, start) for j in replayed.judged],
                        "line": summary_line(replayed.judged)},
    }


def format_report(report: dict[str, Any]) -> list[str]:
    """The text of a replay (pure)."""
    how = "options as recorded" if report["exact"] else "with " + ", ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in report["overrides"].items())
    lines = [f"cgwatch replay: {report['record']}: {report['checks']} checks, "
             f"{report['samples']} samples over {report['seconds']:.1f} s; {how}"]
    if report["cut"]:
        lines.append("cgwatch replay: the record was cut at its size cap: replayed up to "
                     "there")
    if report["exact"]:
        if report["reproduced"]:
            lines.append(f"cgwatch replay: the live decisions reproduced: "
                         f"{len(report['changes'])} change(s), every sample equal")
        else:
            lines.append("cgwatch replay: the replay differs from the live decisions:")
            lines += [f"  {m}" for m in report["mismatches"]]
    first = report["first_stop"]
    if first is None:
        lines.append("cgwatch replay: it would not stop the job")
    else:
        lines.append(f"cgwatch replay: it would stop at {first['at']:.1f} s: "
                     f"{first['message'].removeprefix('cgwatch guard: ')}")
    lines.append(report["would_stops"]["line"].replace("cgwatch guard (observe)",
                                                       "cgwatch replay", 1))
    end = report["ended"]
    if end is not None:
        lines.append(f"cgwatch replay: the job ended at {end:.1f} s"
                     + (", killed by SIGKILL (the OOM killer)" if report["oom_killed"]
                        else ""))
    return lines


def plot_data(replayed: Replayed) -> dict[str, Any]:
    """The replay as plot.py's `write_plot` takes a run's timeline: each level's working set
    and limit at the samples, a mark per would-be stop and the end, the lead of each stop
    shaded (`spans`)."""
    start = replayed.start
    times = sorted({round(t - start, 6) for points in replayed.series.values()
                    for t, *_ in points})
    index = {t: i for i, t in enumerate(times)}
    columns: dict[str, list[Optional[int]]] = {}
    for path, points in replayed.series.items():
        ws: list[Optional[int]] = [None] * len(times)
        limit: list[Optional[int]] = [None] * len(times)
        for t, working_set, lim, _ in points:
            i = index[round(t - start, 6)]
            ws[i], limit[i] = working_set, lim
        columns[f"working_set:{path}"] = ws
        columns[f"limit:{path}"] = limit
    marks = []
    spans = []
    for j in replayed.judged:
        at = j.stop.at - start
        marks.append({"time": at, "kind": "guard", "cgroup_path": j.stop.level or None,
                      "label": f"would stop ({describe(j)})"})
        spans.append((at, at + j.stop.lead))
    stopped = False
    for t, v in replayed.live if not replayed.exact else []:
        if v.get("stop") and not stopped:  # where the guard as recorded stopped, to compare
            marks.append({"time": t - start, "kind": "forecast", "cgroup_path": None,
                          "label": f"recorded guard: {v.get('trigger')}"})
        stopped = bool(v.get("stop"))
    if replayed.ended is not None:
        marks.append({"time": replayed.ended - start, "kind": "exit", "cgroup_path": None,
                      "label": "killed by SIGKILL" if replayed.oom_killed else "end"})
    interval = replayed.options.get("interval", 0.5)
    return {"times": times, "columns": columns, "marks": marks, "spans": spans,
            "interval": interval, "stride": 1, "marks_dropped": 0}
