"""Prometheus metrics of a Monitor, read at scrape time: a collector that an application
registers in its own registry, and `start_http_server()` (what `cgwatch serve` runs).

Needs the `prometheus` extra (`pip install 'cgwatch[prometheus]'`: prometheus_client). The
collector has no thread and no timer of its own: each scrape asks the monitor for its two
answers, its status and its levels (`Monitor.levels()`: usage, memory.stat, memory.high, swap),
and reads each level's counter files once through the process's kept descriptors
(`Monitor.layout()`, `Level.read`). A file that cannot be read leaves its samples out of that
scrape and is logged once (logger `cgwatch`); a scrape never raises.

Metric names and labels are a contract (docs/prometheus.md, "Metrics"): base units, `_total`
for the kernel's counters, label `cgroup` = the path inside the hierarchy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from prometheus_client import CollectorRegistry
from prometheus_client import start_http_server as _client_start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from . import counters, names, values
from .monitor import HOST
from .names import FileNames
from .trends import LevelTrends
from .wouldstop import FALSE, NEEDED, OPEN
from .wouldstop import counts as would_stop_counts

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .forecast import Trend
    from .guard import Guard
    from .monitor import LevelInfo, Monitor, Status
    from .tree import Level

__all__ = ["DEFAULT_PORT", "GuardCollector", "MonitorCollector", "parse_pressure_totals",
           "start_http_server"]

log = logging.getLogger("cgwatch")

# Outside 9100-9999: the Prometheus wiki's "Default port allocations" page had allocated that
# whole range to exporters by 2023, so any port in it is some exporter's. 10109 is neither in
# it nor in /etc/services (Debian 12's netbase).
DEFAULT_PORT = 10109

# (LevelInfo attribute, metric name, help): one gauge per level where the value is known.
LEVEL_GAUGES = (
    ("limit", "cgwatch_cgroup_limit_bytes", "Hard memory limit of the cgroup (limited levels)."),
    ("usage", "cgwatch_cgroup_usage_bytes", "Memory charged to the cgroup and its subtree."),
    ("inactive_file", "cgwatch_cgroup_inactive_file_bytes",
     "Inactive page cache of the cgroup's subtree (reclaimable before an OOM kill)."),
    ("headroom", "cgwatch_cgroup_headroom_bytes",
     "limit - (usage - inactive_file) of a limited cgroup: what may still be allocated."),
    ("high", "cgwatch_cgroup_high_bytes",
     "memory.high of the cgroup (v2): above it allocations are throttled."),
    ("high_headroom", "cgwatch_cgroup_high_headroom_bytes",
     "memory.high - (usage - inactive_file): what may be allocated before throttling."),
    ("swap_limit", "cgwatch_cgroup_swap_limit_bytes", "Swap the cgroup may use."),
    ("swap_usage", "cgwatch_cgroup_swap_usage_bytes", "Swap the cgroup uses."),
)
EVENTS_METRIC = "cgwatch_memory_events"  # exposed with _total
PRESSURE_METRIC = "cgwatch_memory_pressure_seconds"  # exposed with _total
UNDER_OOM_METRIC = "cgwatch_cgroup_under_oom"
INFO_METRIC = "cgwatch_monitor"  # exposed with _info
GROWTH_METRIC = "cgwatch_cgroup_working_set_growth_bytes_per_second"
SECONDS_TO_LIMIT_METRIC = "cgwatch_cgroup_seconds_to_limit"
WOULD_STOP_METRIC = "cgwatch_guard_would_stop"  # exposed with _total
WOULD_STOP_OPEN_METRIC = "cgwatch_guard_would_stops_open"


def parse_pressure_totals(text: values.Text) -> dict[str, float]:
    """The `total=` stall times of a PSI file (`memory.pressure`), in seconds, by kind
    ("some", "full"): values.parse_pressure's microseconds (the one parser of the file, the
    guard's too). Lines without a total are ignored; raises ValueError when a total is not a
    number or no line has one."""
    return {kind: total / 1e6 for kind, total in values.parse_pressure(text).items()}


@dataclass
class LevelCounters:
    """What one level's counter files said in one scrape."""

    events: dict[str, int] = field(default_factory=dict)  # counter name -> value
    under_oom: Optional[int] = None  # v1 memory.oom_control, a state, not a counter
    pressure: dict[str, float] = field(default_factory=dict)  # "some"/"full" -> seconds


@dataclass(frozen=True)
class Reading:
    """Everything one scrape read, before it becomes metric families."""

    total: Optional[int]  # None: left out (another process's monitor in host mode)
    available: Optional[int]
    status: Status
    levels: Sequence[LevelInfo]
    counters: dict[str, LevelCounters]  # by cgroup path
    # The forecast of each limited level whose trend rests on enough scrapes (trends.py),
    # by cgroup path; empty before that.
    trends: dict[str, Trend] = field(default_factory=dict)


def slurm_labels(levels: Sequence[LevelInfo]) -> dict[str, str]:
    """`slurm_job` and `slurm_step` ("4", "4.0") where the monitored process is in a Slurm
    job's cgroups (LevelInfo.slurm_role), for joining with the scheduler's data; nothing
    otherwise. Not `job`: Prometheus sets `job` on every target (the scrape job) and would
    rename ours to `exported_job`."""
    labels = {}
    for level in levels:
        if level.slurm_role in ("job", "step") and level.slurm_id is not None:
            labels[f"slurm_{level.slurm_role}"] = level.slurm_id
    return labels


def families(reading: Reading) -> list[Metric]:
    """The metric families of one reading (pure: no I/O). Families without a sample are left
    out; the info metric is always there, and so are the two answers unless the reading has
    none (None)."""
    total = GaugeMetricFamily("cgwatch_total_memory_bytes",
                              "cgwatch.total_memory(): the smallest memory limit on the path "
                              "to the top, capped at host RAM.")
    if reading.total is not None:
        total.add_metric([], reading.total)
    available = GaugeMetricFamily("cgwatch_available_memory_bytes",
                                  "cgwatch.available_memory(): the least headroom of any "
                                  "limited level and the host's MemAvailable.")
    if reading.available is not None:
        available.add_metric([], reading.available)
    status = reading.status
    info = InfoMetricFamily(INFO_METRIC, "How the monitor gets its answers (value 1).",
                            value={"mode": status.mode,
                                   "version": "" if status.version is None
                                   else str(status.version),
                                   "cgroup": status.cgroup_path or "",
                                   **slurm_labels(reading.levels)})
    result: list[Metric] = [total, available, info]
    for attribute, name, doc in LEVEL_GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=["cgroup"])
        for level in reading.levels:
            value = getattr(level, attribute)
            if value is not None:
                gauge.add_metric([level.cgroup_path], value)
        result.append(gauge)
    events = CounterMetricFamily(EVENTS_METRIC,
                                 "The kernel's memory event counters of the cgroup (v2 "
                                 "memory.events, hierarchical; v1 memory.oom_control oom_kill, "
                                 "the cgroup's own, and memory.failcnt).",
                                 labels=["cgroup", "event"])
    under_oom = GaugeMetricFamily(UNDER_OOM_METRIC,
                                  "v1 memory.oom_control under_oom: 1 while the cgroup is out "
                                  "of memory.", labels=["cgroup"])
    pressure = CounterMetricFamily(PRESSURE_METRIC,
                                   "Time tasks of the cgroup stalled on memory (v2 "
                                   "memory.pressure total=): some = at least one, full = all "
                                   "non-idle tasks at once.", labels=["cgroup", "kind"])
    for level in reading.levels:
        found = reading.counters.get(level.cgroup_path)
        if found is None:
            continue
        for event, count in found.events.items():
            events.add_metric([level.cgroup_path, event], count)
        if found.under_oom is not None:
            under_oom.add_metric([level.cgroup_path], found.under_oom)
        for kind, seconds in found.pressure.items():
            pressure.add_metric([level.cgroup_path, kind], seconds)
    result += [events, under_oom, pressure, *forecast_families(reading)]
    return [f for f in result if f.samples]


def forecast_families(reading: Reading) -> list[Metric]:
    """The forecast gauges (pure): growth for every level with a trend, seconds to its limit
    only while it grows toward one (absent, not +Inf, otherwise: `< 300` alerts either way)."""
    growth = GaugeMetricFamily(GROWTH_METRIC,
                               "Lasting growth of the cgroup's working set (usage - "
                               "inactive_file), from the peaks of the samples scrapes took; 0 "
                               "when none persists.", labels=["cgroup"])
    left = GaugeMetricFamily(SECONDS_TO_LIMIT_METRIC,
                             "Seconds until the working set reaches the cgroup's limit at its "
                             "growth; absent while it does not grow.", labels=["cgroup"])
    for level in reading.levels:
        trend = reading.trends.get(level.cgroup_path)
        if trend is None:
            continue
        growth.add_metric([level.cgroup_path], trend.growth)
        seconds = trend.seconds_left(level.limit)
        if seconds is not None:
            left.add_metric([level.cgroup_path], seconds)
    return [growth, left]


class MonitorCollector(Collector):
    """A prometheus_client collector reading `monitor` (default: the process's default
    monitor, which is thread-free) at every scrape. Register it in your own registry:

        registry.register(cgwatch.prometheus.MonitorCollector())
    """

    def __init__(self, monitor: Optional[Monitor] = None) -> None:
        if monitor is None:
            from .default import default_monitor  # lazily: the monitor only when none was given

            monitor = default_monitor()
        self.monitor = monitor
        self._logged: set[tuple[str, str, str]] = set()
        self._logged_lock = threading.Lock()  # scrapes may run in several server threads
        # The forecast's history is the scrapes' own samples: a collector has no thread. With
        # 1 s buckets and scrapes every 15 s, each scrape closes a bucket: growth shows from
        # the 5th scrape and rests on the last 12 (3 min); memory: 17 numbers per level.
        self._trends = LevelTrends()
        self._trends_lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        """The family names, without reading anything (a registry asks at register())."""
        return [GaugeMetricFamily("cgwatch_total_memory_bytes", ""),
                GaugeMetricFamily("cgwatch_available_memory_bytes", ""),
                InfoMetricFamily(INFO_METRIC, ""),
                *(GaugeMetricFamily(name, "") for _, name, _ in LEVEL_GAUGES),
                CounterMetricFamily(EVENTS_METRIC, ""),
                GaugeMetricFamily(UNDER_OOM_METRIC, ""),
                CounterMetricFamily(PRESSURE_METRIC, ""),
                GaugeMetricFamily(GROWTH_METRIC, ""),
                GaugeMetricFamily(SECONDS_TO_LIMIT_METRIC, "")]

    def collect(self) -> Iterator[Metric]:
        try:
            reading = self.read()
        except Exception as e:  # noqa: BLE001 - a scrape must answer; the monitor never raises
            self._log_once("", "scrape", f"cgwatch: scrape failed: {e!r}")
            return iter([])
        return iter(families(reading))

    def read(self) -> Reading:
        """One scrape's reads: the answers, the status, the levels, then each level's counter
        files once. (`available_memory()` is the monitor's own answer, so it may pread the
        limited levels' usage and memory.stat once more, as any caller's query does.)

        Another process's monitor (`Monitor(pid=...)`) in host mode has no answer of its own:
        the host's figures under the process's name would be wrong (a sidecar whose target
        cannot be resolved), so the two answers are left out and the info metric says
        mode="host" (the reason is logged once)."""
        monitor = self.monitor
        total: Optional[int] = monitor.total_memory()
        available: Optional[int] = monitor.available_memory()
        status = monitor.status
        if status.mode == HOST and getattr(monitor, "pid", None) is not None:
            self._log_once("", "host", f"cgwatch: no cgroup for process {monitor.pid} "
                           f"({status.reason}); its memory figures are left out")
            total = available = None
        levels = monitor.levels()
        layout = monitor.layout()
        found: dict[str, LevelCounters] = {}
        if layout.version is not None:
            for level in layout.levels:
                # A v1 limit above the visible top (Level.hidden) has the top level's files:
                # its counters would repeat the top's.
                if not getattr(level, "hidden", False):
                    found[level.cgroup_path] = self._read_counters(level, layout.version)
        with self._trends_lock:
            latest = self._trends.add(time.monotonic(), levels)
            ready = {path: t for path, t in latest.items() if self._trends.ready(t)}
        return Reading(total, available, status, levels, found, ready)

    def _read_counters(self, level: Level, version: int) -> LevelCounters:
        result = LevelCounters()
        sources = list(FileNames.for_version(version).counters)
        if version == 2:
            sources = [names.EVENTS, names.PRESSURE]  # memory.events.local: not exported
        for source in sources:
            try:
                text = level.read(source)
            except FileNotFoundError:
                continue  # the v2 root has no memory.events; a level may just have gone
            except OSError as e:
                # EOPNOTSUPP: memory.pressure with PSI disabled (psi=0 on the kernel's line).
                self._log_once(level.cgroup_path, source,
                               f"cgwatch: cannot read {source} of {level.cgroup_path}: "
                               f"{e.strerror or e}; its samples are left out")
                continue
            try:
                if source == names.PRESSURE:
                    result.pressure = parse_pressure_totals(text)
                    continue
                parsed = counters.parse_counters(source, text)
            except ValueError as e:
                self._log_once(level.cgroup_path, source,
                               f"cgwatch: {source} of {level.cgroup_path} makes no sense: {e}; "
                               f"its samples are left out")
                continue
            if source == names.OOM_CONTROL:
                result.under_oom = parsed.pop("under_oom", None)
            result.events.update(parsed)
        return result

    def _log_once(self, cgroup_path: str, source: str, message: str) -> None:
        key = (cgroup_path, source, message)
        with self._logged_lock:
            if key in self._logged:
                return
            if len(self._logged) >= 1024:  # levels come and go: stay bounded, log again
                self._logged.clear()
            self._logged.add(key)
        log.warning("%s", message)


class GuardCollector(Collector):
    """Observe mode's counts of one guard in this process (`Guard(observe=True)`), read at
    each scrape: `cgwatch_guard_would_stop_total{judged="false"|"needed"}` (a would-be stop
    is counted once it is judged, and its judgement never changes after: a counter) and
    `cgwatch_guard_would_stops_open` (those not judged yet: a gauge). Register it next to a
    `MonitorCollector` in the job's own registry:

        registry.register(cgwatch.prometheus.GuardCollector(guard))

    Only in the guard's process: `cgwatch serve`, a process of its own (a sidecar), cannot
    see a guard in another; `cgwatch run --guard --observe` gives the counts in its report
    (`--json`: `observe`) instead. Past the first 1000 would-be stops, later ones are not
    counted (wouldstop.Episodes keeps that many)."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(WOULD_STOP_METRIC, ""),
                GaugeMetricFamily(WOULD_STOP_OPEN_METRIC, "")]

    def collect(self) -> Iterator[Metric]:
        counts = would_stop_counts(self.guard.would_stops())
        total = CounterMetricFamily(
            WOULD_STOP_METRIC, "Stops an observing guard would have made, by how what "
            "followed judged them: false (the job went on), needed (it reached its limit).",
            labels=["judged"])
        for judged in (FALSE, NEEDED):
            total.add_metric([judged], counts[judged])
        open_now = GaugeMetricFamily(WOULD_STOP_OPEN_METRIC, "Would-be stops not judged "
                                     "yet (standing, or cleared less than a lead ago).")
        open_now.add_metric([], counts[OPEN])
        return iter([total, open_now])


def start_http_server(port: int = DEFAULT_PORT, addr: str = "127.0.0.1", *,
                      monitor: Optional[Monitor] = None,
                      registry: Optional[CollectorRegistry] = None,
                      ) -> tuple[WSGIServer, threading.Thread, CollectorRegistry]:
    """Serve `/metrics` on addr:port (loopback unless asked; port 0: any free port, see
    `server.server_port`) from a daemon thread. Without `registry`, a new one holding only
    this monitor's collector; with one, the collector is registered in it. Returns the
    server (`shutdown()` then `server_close()` stops it), its thread and the registry."""
    if registry is None:
        registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor))
    server, thread = _client_start_http_server(port, addr=addr, registry=registry)
    return server, thread, registry
