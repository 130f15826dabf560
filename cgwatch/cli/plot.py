"""Internal. The picture of a run (`cgwatch run --plot FILE`, `cgwatch watch --plot FILE`):
`Recorder` samples the monitor's levels into a timeline.py `Timeline` (bounded) and takes
marks (events, the guard's decision, the end); `write_plot` draws it with matplotlib.

matplotlib (the `plot` extra: `pip install 'cgwatch[plot]'`) is imported only by
`write_plot`, so nothing of it loads unless --plot is given. Why matplotlib: it writes PNG,
SVG and PDF from the same code with no display and no browser (a `Figure` drawn by its Agg
canvas: no pyplot, no global backend switched in the caller's process), it is maintained by
a large team with regular releases, and most training environments have it already. The
format follows FILE's suffix (.png, .svg, .pdf; anything else: PNG).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional

from ..event import Event
from ..monitor import Monitor
from ..snapshot import LevelInfo
from ..timeline import Timeline
from ..units import human_bytes

KINDS = ("usage", "working_set", "limit", "high")
MiB = 1 << 20


def column(kind: str, path: str) -> str:
    """A timeline column's name: "usage:/job" (the JSON report's spelling too)."""
    return f"{kind}:{path}"


class Recorder:
    """Samples `monitor.levels()` (the limited ones) into a Timeline, on a thread every
    `interval` seconds between start() and stop(), or when sample() is called. Times are
    seconds since the recorder was made."""

    def __init__(self, monitor: Monitor, interval: float = 0.25, max_points: int = 1024) -> None:
        self.monitor = monitor
        self.interval = interval
        self.timeline = Timeline(max_points)
        self.start_wall = time.time()
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._last_mark: dict[tuple[str, str], float] = {}  # (counter, path) -> its last mark

    def event(self, item: Any) -> None:
        """Mark a counter's rise (an Event; anything else is ignored). A counter that keeps
        rising at one level (v1 failcnt at every failed charge) is marked at most once a
        second there: the picture shows when, the report counts how many."""
        if not isinstance(item, Event) or item.propagated:
            return
        key = (item.counter, item.cgroup_path)
        now = self.now()
        with self._lock:
            if now - self._last_mark.get(key, float("-inf")) < 1.0:
                return
            self._last_mark[key] = now
            self.timeline.mark(now, "event", f"{item.counter} +{item.delta}",
                               cgroup_path=item.cgroup_path)

    def now(self) -> float:
        return time.monotonic() - self._start

    def sample(self, levels: Optional[list[LevelInfo]] = None) -> None:
        """One point: `levels` when the caller has just read them, else read now."""
        values: dict[str, Optional[int]] = {}
        if levels is None:
            try:
                levels = self.monitor.levels()
            except Exception:  # noqa: BLE001 - never raises; a picture must not stop a run
                return
        for lvl in levels:
            if lvl.hidden or (lvl.limit is None and lvl.high is None):
                continue
            ws = None if lvl.usage is None or lvl.inactive_file is None \
                else max(0, lvl.usage - lvl.inactive_file)
            for kind, value in zip(KINDS, (lvl.usage, ws, lvl.limit, lvl.high)):
                values[column(kind, lvl.cgroup_path)] = value
        with self._lock:
            self.timeline.add(self.now(), values)

    def mark(self, kind: str, label: str, final: bool = False, **extra: Any) -> None:
        with self._lock:
            self.timeline.mark(self.now(), kind, label, final, **extra)

    def start(self) -> None:
        self._stop.clear()  # started again: `run --restarts` records every attempt
        self.sample()
        self._thread = threading.Thread(target=self._run, name="cgwatch-plot", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def as_dict(self) -> dict[str, Any]:
        """The series as plain data (the JSON report's `timeline`), sizes in bytes."""
        with self._lock:
            data = self.timeline.as_dict()
        return {"start_wall_time": self.start_wall, "interval": self.interval, **data}


def _levels(columns: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for name in columns:
        path = name.partition(":")[2]
        if path not in seen:
            seen.append(path)
    return seen


MARK_COLOURS = {"event": "tab:orange", "guard": "tab:purple", "exit": "tab:red",
                "forecast": "tab:olive", "restart": "tab:cyan"}


def _grouped(marks: list[dict[str, Any]], gap: float) -> list[tuple[float, str, str]]:
    """Marks closer than `gap` seconds to the group's first as one label (time, the kind of
    the weightiest mark: exit, guard, restart, event; the labels joined)."""
    order = {"exit": 0, "guard": 1, "restart": 2}
    groups: list[list[dict[str, Any]]] = []
    for mark in sorted(marks, key=lambda m: m["time"]):
        if groups and mark["time"] - groups[-1][0]["time"] < gap:
            groups[-1].append(mark)
        else:
            groups.append([mark])
    return [(g[0]["time"], min(g, key=lambda m: order.get(m["kind"], 3))["kind"],
             ", ".join(m["label"] for m in g)) for g in groups]


def attempt_spans(marks: list[dict[str, Any]], start: float,
                  end: float) -> list[tuple[float, float]]:
    """The attempts of a `run --restarts` life as (from, to) times, split at its "restart"
    marks; one span from `start` to `end` when there is none."""
    cuts = sorted(m["time"] for m in marks if m["kind"] == "restart")
    edges = [start, *cuts, end]
    return list(zip(edges[:-1], edges[1:]))


def write_plot(path: str, data: dict[str, Any], title: str) -> Optional[str]:
    """Draw `data` (Recorder.as_dict()) to `path`; None when written, else why not (no
    matplotlib, or the file could not be written)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return "matplotlib is not installed (pip install 'cgwatch[plot]')"
    times = data["times"]
    columns = data["columns"]
    paths = _levels(columns) or [""]
    fig = Figure(figsize=(10, 2.2 + 2.6 * len(paths)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(paths), 1, sharex=True, squeeze=False)[:, 0]
    # usage wide and pale under the working set: without page cache the two are one line
    styles = {"usage": ("usage", "tab:blue", "-"),
              "working_set": ("working set (usage - inactive_file)", "tab:green", "-"),
              "limit": ("limit", "black", "--"), "high": ("memory.high", "tab:brown", ":")}
    for ax, level in zip(axes, paths):
        for kind, (label, colour, style) in styles.items():
            values = columns.get(column(kind, level))
            if values is None or all(v is None for v in values):
                continue
            ys = [float("nan") if v is None else v / MiB for v in values]
            ax.plot(times, ys, style, color=colour, label=label,
                    linewidth=4.0 if kind == "usage" else 1.4,
                    alpha=0.35 if kind == "usage" else 1.0,
                    drawstyle="steps-post" if kind in ("limit", "high") else "default")
        if times:
            # every other attempt shaded: where one life ends and the next begins
            for begin, end in attempt_spans(data["marks"], times[0], times[-1])[1::2]:
                ax.axvspan(begin, end, color="tab:cyan", alpha=0.07, linewidth=0)
        for begin, end in data.get("spans", []):  # `cgwatch replay`: each stop's lead
            ax.axvspan(begin, end, color=MARK_COLOURS["guard"], alpha=0.12, linewidth=0)
        mine = [m for m in data["marks"] if m.get("cgroup_path") in (None, level)]
        for mark in mine:
            ax.axvline(mark["time"], color=MARK_COLOURS.get(mark["kind"], "grey"),
                       linewidth=1.0 if mark["kind"] == "event" else 1.8, alpha=0.8)
        span = (times[-1] - times[0]) if len(times) > 1 else 1.0
        for i, (t, kind, label) in enumerate(_grouped(mine, span / 40)):
            # Left of the line, staggered: a kill's oom, oom_kill, failcnt and exit come
            # within milliseconds and would be drawn over each other.
            ax.annotate(label, (t, 0.96 - 0.1 * (i % 4)), xycoords=("data", "axes fraction"),
                        xytext=(-4, 0), textcoords="offset points", ha="right", va="top",
                        fontsize=7, color=MARK_COLOURS.get(kind, "grey"),
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none",
                              "alpha": 0.8})
        ax.set_ylabel("MiB")
        ax.set_title(f"cgroup {level}" if level else "no limited level", fontsize=9, loc="left")
        ax.grid(True, alpha=0.3)
        top = max((v for kind in styles for v in columns.get(column(kind, level)) or []
                   if v is not None), default=0) / MiB
        ax.set_ylim(0, max(top * 1.2, 1.0))  # room above the limit for the marks' labels
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=7)
    axes[-1].set_xlabel("seconds since start")
    stride = data.get("stride", 1)
    note = f"; one point per {stride} samples (peaks kept)" if stride > 1 else ""
    dropped = data.get("marks_dropped", 0)
    note += f"; {dropped} more events not drawn" if dropped else ""
    fig.suptitle(f"{title}\nsampled every {data['interval']:g} s{note}", fontsize=10)
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    fmt = suffix if suffix in ("png", "svg", "pdf") else "png"
    try:
        fig.savefig(path, format=fmt, dpi=110)
    except OSError as e:
        return f"cannot write {path}: {e.strerror or e}"
    return None


def describe(data: dict[str, Any]) -> str:
    """One line about what was drawn (for a verbose message or a test's failure)."""
    peaks = {name: max((v for v in values if v is not None), default=None)
             for name, values in data["columns"].items() if name.startswith("usage:")}
    shown = ", ".join(f"{n.partition(':')[2]} peak {human_bytes(v)}" for n, v in peaks.items())
    return f"{len(data['times'])} points, {len(data['marks'])} marks: {shown}"
