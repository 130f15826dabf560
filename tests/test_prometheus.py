"""The exporter on fake trees (v1 and v2): the metric set and its values, as a scrape returns
them through prometheus_client's own text format and parser; the PSI parser on real files;
`start_http_server` and `cgwatch serve` over real loopback HTTP. The kernel's side (real
counters, an OOM kill, a real Prometheus) is tests/test_prometheus_real.py."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any, Optional

import pytest

from tests.extras import need

need("prometheus-client", extra="prometheus")  # the dev extra has it; the test extra not

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from cgwatch import Monitor  # noqa: E402
from cgwatch import prometheus as exporter  # noqa: E402
from tests.cgroup_helpers import PROJECT  # noqa: E402
from tests.fake_tree import FakeHost, GiB, MiB  # noqa: E402
from tests.prometheus.loopback import ensure_up_in_vm  # noqa: E402
from tests.test_values import PRESSURE_TIGHTENED  # noqa: E402

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Real memory.events / memory.pressure / memory.oom_control texts (6.1 v2 in the VM, 6.18 v1
# here), with the numbers changed.
V2_EVENTS = "low 0\nhigh 17\nmax 4\noom 2\noom_kill 1\noom_group_kill 0\n"
V2_PRESSURE = ("some avg10=0.00 avg60=0.12 avg300=0.03 total=1500000\n"
               "full avg10=0.00 avg60=0.05 avg300=0.01 total=250000\n")
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"


@pytest.fixture(autouse=True, scope="module")
def _loopback() -> None:
    ensure_up_in_vm()  # the v2 VM boots with lo down (tests/prometheus/loopback.py)


def scrape(source: Monitor | exporter.MonitorCollector) -> tuple[Samples, set[str]]:
    """One scrape through a registry, as a Prometheus server gets it: (sample name, sorted
    labels) -> value, and the families' types."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(source if isinstance(source, exporter.MonitorCollector)
                      else exporter.MonitorCollector(source))
    text = generate_latest(registry).decode()
    samples: Samples = {}
    kinds = set()
    for family in text_string_to_metric_families(text):
        kinds.add(f"{family.name} {family.type}")
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = s.value
    return samples, kinds


def value(samples: Samples, name: str, **labels: str) -> Optional[float]:
    return samples.get((name, tuple(sorted(labels.items()))))


def names_of(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


@pytest.fixture
def job(host: FakeHost) -> FakeHost:
    """/a (4 GiB) > /a/b (no limit) > /a/b/c (2 GiB), each 100 MiB used, 10 MiB inactive."""
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": 2 * GiB})
    return host


def monitor_of(host: FakeHost, opened: list[Any]) -> Monitor:
    m = Monitor(host.root, thread=False)
    opened.append(m)
    return m


def test_answers_and_info(job: FakeHost, opened: list[Any]) -> None:
    samples, kinds = scrape(monitor_of(job, opened))
    assert value(samples, "cgwatch_total_memory_bytes") == 2 * GiB
    assert value(samples, "cgwatch_available_memory_bytes") == 2 * GiB - 90 * MiB
    assert value(samples, "cgwatch_monitor_info", mode="watching", version=str(job.version),
                 cgroup="/a/b/c") == 1
    assert "cgwatch_total_memory_bytes gauge" in kinds
    assert "cgwatch_monitor_info gauge" in kinds  # the text format has no info type


def test_level_gauges_where_known(job: FakeHost, opened: list[Any]) -> None:
    samples, _ = scrape(monitor_of(job, opened))
    for path, limit in (("/a/b/c", 2 * GiB), ("/a", 4 * GiB)):
        assert value(samples, "cgwatch_cgroup_limit_bytes", cgroup=path) == limit
        assert value(samples, "cgwatch_cgroup_usage_bytes", cgroup=path) == 100 * MiB
        assert value(samples, "cgwatch_cgroup_inactive_file_bytes", cgroup=path) == 10 * MiB
        assert value(samples, "cgwatch_cgroup_headroom_bytes", cgroup=path) == limit - 90 * MiB
    # No limit at /a/b: usage, but neither a limit nor a headroom sample.
    assert value(samples, "cgwatch_cgroup_usage_bytes", cgroup="/a/b") == 100 * MiB
    assert value(samples, "cgwatch_cgroup_limit_bytes", cgroup="/a/b") is None
    assert value(samples, "cgwatch_cgroup_headroom_bytes", cgroup="/a/b") is None


def test_v2_memory_high_and_swap(host: FakeHost, opened: list[Any]) -> None:
    if host.version != 2:
        pytest.skip("memory.high and memory.swap.* are v2 files")
    host.make_path({"/a": None, "/a/b": None, "/a/b/c": 2 * GiB})
    leaf = host.level_dir("/a/b/c")
    host.write(leaf + "/memory.high", f"{GiB}\n")
    host.write(leaf + "/memory.swap.max", f"{512 * MiB}\n")
    host.write(leaf + "/memory.swap.current", f"{3 * MiB}\n")
    host.write(host.level_dir("/a") + "/memory.high", "max\n")
    samples, _ = scrape(monitor_of(host, opened))
    assert value(samples, "cgwatch_cgroup_high_bytes", cgroup="/a/b/c") == GiB
    assert value(samples, "cgwatch_cgroup_high_headroom_bytes", cgroup="/a/b/c") == \
        GiB - 90 * MiB
    assert value(samples, "cgwatch_cgroup_swap_limit_bytes", cgroup="/a/b/c") == 512 * MiB
    assert value(samples, "cgwatch_cgroup_swap_usage_bytes", cgroup="/a/b/c") == 3 * MiB
    assert value(samples, "cgwatch_cgroup_high_bytes", cgroup="/a") is None  # "max"


def test_v2_counters_and_pressure(host: FakeHost, opened: list[Any]) -> None:
    if host.version != 2:
        pytest.skip("memory.events and memory.pressure are v2 files")
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": 2 * GiB})
    leaf = host.level_dir("/a/b/c")
    host.write(leaf + "/memory.events", V2_EVENTS)
    host.write(leaf + "/memory.events.local", "low 0\nhigh 99\nmax 99\noom 99\noom_kill 99\n")
    host.write(leaf + "/memory.pressure", V2_PRESSURE)
    host.write(host.level_dir("/a") + "/memory.events", V2_EVENTS.replace("oom_kill 1",
                                                                          "oom_kill 5"))
    samples, kinds = scrape(monitor_of(host, opened))
    expected = {"low": 0, "high": 17, "max": 4, "oom": 2, "oom_kill": 1, "oom_group_kill": 0}
    for event, count in expected.items():
        assert value(samples, "cgwatch_memory_events_total", cgroup="/a/b/c",
                     event=event) == count
    assert value(samples, "cgwatch_memory_events_total", cgroup="/a", event="oom_kill") == 5
    # memory.events.local is not exported (its 99s would show up here).
    assert {v for (n, _), v in samples.items() if n == "cgwatch_memory_events_total"} \
        <= {0, 1, 2, 4, 5, 17}
    # /a/b and the root have no memory.events in this tree: no samples, no failure.
    assert value(samples, "cgwatch_memory_events_total", cgroup="/a/b", event="oom") is None
    assert value(samples, "cgwatch_memory_pressure_seconds_total", cgroup="/a/b/c",
                 kind="some") == 1.5
    assert value(samples, "cgwatch_memory_pressure_seconds_total", cgroup="/a/b/c",
                 kind="full") == 0.25
    assert "cgwatch_memory_events counter" in kinds
    assert "cgwatch_memory_pressure_seconds counter" in kinds
    assert "cgwatch_cgroup_under_oom" not in names_of(samples)


def test_v1_counters(host: FakeHost, opened: list[Any]) -> None:
    if host.version != 1:
        pytest.skip("memory.oom_control and memory.failcnt are v1 files")
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": 2 * GiB})
    leaf = host.level_dir("/a/b/c")
    host.write(leaf + "/memory.oom_control", V1_OOM_CONTROL.replace("under_oom 0",
                                                                    "under_oom 1"))
    host.write(leaf + "/memory.failcnt", "42\n")
    host.write(host.level_dir("/a") + "/memory.failcnt", "7\n")
    samples, _ = scrape(monitor_of(host, opened))
    assert value(samples, "cgwatch_memory_events_total", cgroup="/a/b/c", event="oom_kill") == 3
    assert value(samples, "cgwatch_memory_events_total", cgroup="/a/b/c", event="failcnt") == 42
    assert value(samples, "cgwatch_memory_events_total", cgroup="/a", event="failcnt") == 7
    assert value(samples, "cgwatch_cgroup_under_oom", cgroup="/a/b/c") == 1
    # A setting, not a counter; a state, not a counter.
    events = {dict(labels)["event"] for (n, labels) in samples
              if n == "cgwatch_memory_events_total"}
    assert events == {"oom_kill", "failcnt"}
    assert not any(n.startswith("cgwatch_memory_pressure") or n.startswith("cgwatch_cgroup_high")
                   for n in names_of(samples))


def test_unreadable_counter_file_is_left_out_and_logged_once(
        job: FakeHost, opened: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    source = "memory.events" if job.version == 2 else "memory.oom_control"
    job.write(job.level_dir("/a/b/c") + "/" + source, "this is not a counter file\n")
    collector = exporter.MonitorCollector(monitor_of(job, opened))
    with caplog.at_level(logging.WARNING, logger="cgwatch"):
        samples, _ = scrape(collector)
        scrape(collector)  # the same problem again: no second record
    assert value(samples, "cgwatch_total_memory_bytes") == 2 * GiB  # the rest is there
    assert not any(dict(labels).get("cgroup") == "/a/b/c"
                   and n == "cgwatch_memory_events_total" and dict(labels)["event"] == "oom_kill"
                   for (n, labels) in samples)
    records = [r for r in caplog.records if source in r.getMessage()]
    assert len(records) == 1, [r.getMessage() for r in caplog.records]
    assert "/a/b/c" in records[0].getMessage()


def test_host_mode_exports_the_answers_only(tmp_path: Any, opened: list[Any]) -> None:
    host = FakeHost(str(tmp_path), 2, mem_total=16 * GiB, mem_available=9 * GiB)
    os.remove(host.path("/proc/self/mountinfo"))  # no hierarchy to be found
    samples, _ = scrape(monitor_of(host, opened))
    assert value(samples, "cgwatch_total_memory_bytes") == 16 * GiB
    assert value(samples, "cgwatch_available_memory_bytes") == 9 * GiB
    assert value(samples, "cgwatch_monitor_info", mode="host", version="", cgroup="") == 1
    assert names_of(samples) == {"cgwatch_total_memory_bytes", "cgwatch_available_memory_bytes",
                                 "cgwatch_monitor_info"}


def test_another_process_in_host_mode_exports_no_answer(tmp_path: Any,
                                                       opened: list[Any]) -> None:
    """A sidecar's monitor of another process that has no cgroup it can find: the host's
    figures would be published under that process's name, so only the info metric is."""
    host = FakeHost(str(tmp_path), 2, mem_total=16 * GiB, mem_available=9 * GiB)
    m = Monitor(host.root, pid=4242, thread=False)  # no /proc/4242 in the fake tree
    opened.append(m)
    samples, _ = scrape(m)
    assert value(samples, "cgwatch_monitor_info", mode="host", version="", cgroup="") == 1
    assert names_of(samples) == {"cgwatch_monitor_info"}


def test_describe_names_every_family_collect_yields(job: FakeHost, opened: list[Any]) -> None:
    collector = exporter.MonitorCollector(monitor_of(job, opened))
    described = {f.name for f in collector.describe()}
    assert {f.name for f in collector.collect()} <= described
    # A second collector in the same registry is refused (the names are taken), not doubled.
    registry = CollectorRegistry()
    registry.register(collector)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(exporter.MonitorCollector(collector.monitor))


@pytest.mark.parametrize("text, expected", [
    # 6.1 v2 cgroup file: both lines
    ("some avg10=0.00 avg60=0.00 avg300=0.00 total=1500000\n"
     "full avg10=0.00 avg60=0.00 avg300=0.00 total=250000\n", {"some": 1.5, "full": 0.25}),
    # one line only (the "full" line of /proc/pressure/cpu came in 5.13; same format)
    ("some avg10=1.23 avg60=0.40 avg300=0.10 total=7\n", {"some": 7e-6}),
    (b"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
     b"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", {"some": 0.0, "full": 0.0}),
])
def test_pressure_totals(text: str, expected: dict[str, float]) -> None:
    assert exporter.parse_pressure_totals(text) == expected


@pytest.mark.parametrize("text", ["", "some avg10=0.00\n", "garbage\n"])
def test_pressure_without_a_total_is_an_error(text: str) -> None:
    with pytest.raises(ValueError):
        exporter.parse_pressure_totals(text)


@pytest.mark.parametrize("text", PRESSURE_TIGHTENED)
def test_pressure_total_that_int_took_is_an_error(text: str) -> None:
    """The collector's parser is values.parse_pressure now: what its int() took before
    (a sign, an underscore, a non-ASCII digit, 21 digits) is refused (the rows and their
    traps: tests/test_values.py)."""
    with pytest.raises(ValueError):
        exporter.parse_pressure_totals(text)


def test_start_http_server_serves_metrics_on_loopback(job: FakeHost, opened: list[Any]) -> None:
    server, thread, _ = exporter.start_http_server(0, monitor=monitor_of(job, opened))
    try:
        assert server.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = reply.read().decode()
        assert "cgwatch_total_memory_bytes 2.147483648e+09\n" in body
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_cli_defaults_are_loopback_and_the_documented_port() -> None:
    done = subprocess.run([sys.executable, "-m", "cgwatch.cli", "serve", "--help"],
                          cwd=PROJECT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert f"(default {exporter.DEFAULT_PORT}," in text
    assert "(default 127.0.0.1: loopback only)" in text


@pytest.fixture
def serve_procs() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def start_serve(procs: list[subprocess.Popen[str]], *args: str) -> tuple[subprocess.Popen[str],
                                                                         str]:
    """`cgwatch serve --port 0 ARGS` in a child; its /metrics URL from its first stderr line."""
    proc = subprocess.Popen([sys.executable, "-m", "cgwatch.cli", "serve", "--port", "0", *args],
                            cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    procs.append(proc)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("cgwatch serve: http://127.0.0.1:"), line + proc.stderr.read()
    return proc, line.split()[2]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_exits_cleanly_on_a_signal(job: FakeHost, signum: int,
                                         serve_procs: list[subprocess.Popen[str]]) -> None:
    proc, url = start_serve(serve_procs, "--root", job.root)
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert b"cgwatch_cgroup_limit_bytes{cgroup=\"/a/b/c\"}" in reply.read()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_serve_exits_when_the_pid_exits(serve_procs: list[subprocess.Popen[str]]) -> None:
    target = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE, text=True)
    serve_procs.append(target)
    proc, url = start_serve(serve_procs, "--pid", str(target.pid))
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert b"cgwatch_total_memory_bytes" in reply.read()
    assert target.stdin is not None
    target.stdin.close()  # it exits
    target.wait(timeout=60)
    started = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"process {target.pid} exited" in err
    assert time.monotonic() - started < 5


def test_serve_refuses_a_missing_pid() -> None:
    done = subprocess.run([sys.executable, "-m", "cgwatch.cli", "serve", "--port", "0",
                           "--pid", "999999999"], cwd=PROJECT, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2
    assert "no process 999999999" in done.stderr


def test_forecast_gauges_from_a_reading() -> None:
    """The forecast families (pure): growth for each level with a trend, seconds to the limit
    only while it grows toward one; a level without a trend (not enough scrapes yet) has
    neither."""
    from cgwatch.forecast import Trend
    from cgwatch.snapshot import LevelInfo

    def level(path: str, limit: Optional[int]) -> LevelInfo:
        return LevelInfo(path, "/d" + path, limit, 600 * MiB, 0, None if limit is None
                         else limit - 600 * MiB, False, False, None)

    levels = [level("/job", GiB), level("/team", 4 * GiB), level("/new", GiB)]
    reading = exporter.Reading(GiB, 424 * MiB, None, levels, {},  # type: ignore[arg-type]
                               {"/job": Trend(4.0 * MiB, 600 * MiB, 12),
                                "/team": Trend(0.0, 600 * MiB, 12)})
    got = {(s.name, s.labels["cgroup"]): s.value
           for f in exporter.forecast_families(reading) for s in f.samples}
    assert got == {(exporter.GROWTH_METRIC, "/job"): 4.0 * MiB,
                   (exporter.SECONDS_TO_LIMIT_METRIC, "/job"): 106.0,
                   (exporter.GROWTH_METRIC, "/team"): 0.0}


def test_forecast_gauges_appear_after_enough_scrapes(job: FakeHost, opened: list[Any]) -> None:
    """The collector's own history: none before 4 closed 1 s buckets, then growth for each
    limited level (0 here: the fake tree's usage does not move), never seconds to a limit."""
    collector = exporter.MonitorCollector(monitor_of(job, opened))
    samples, _ = scrape(collector)
    assert exporter.GROWTH_METRIC not in names_of(samples)
    for _ in range(6):
        time.sleep(1.05)
        samples, _ = scrape(collector)
    assert value(samples, exporter.GROWTH_METRIC, cgroup="/a/b/c") == 0.0
    assert value(samples, exporter.GROWTH_METRIC, cgroup="/a") == 0.0
    assert value(samples, exporter.GROWTH_METRIC, cgroup="/a/b") is None  # no limit
    assert exporter.SECONDS_TO_LIMIT_METRIC not in names_of(samples)


def test_slurm_job_labels_on_the_info_metric(host: FakeHost, opened: list[Any]) -> None:
    """A process in a Slurm job's cgroups (v1 and v2 layouts of Slurm 22.05): the info metric
    carries slurm_job and slurm_step (not `job`, which Prometheus sets on every target)."""
    if host.version == 1:
        job_path = "/slurm_vm/uid_0/job_4"
        host.make_path({"/slurm_vm": None, "/slurm_vm/uid_0": None, job_path: 256 * MiB,
                        job_path + "/step_0": 256 * MiB, job_path + "/step_0/task_0": None})
        leaf = job_path + "/step_0/task_0"
    else:
        job_path = "/system.slice/vm_slurmstepd.scope/job_4"
        host.make_path({"/system.slice": None, "/system.slice/vm_slurmstepd.scope": None,
                        job_path: 256 * MiB, job_path + "/step_0": None,
                        job_path + "/step_0/user": 256 * MiB,
                        job_path + "/step_0/user/task_0": None})
        leaf = job_path + "/step_0/user/task_0"
    host.move_to(leaf)
    samples, _ = scrape(monitor_of(host, opened))
    assert value(samples, "cgwatch_monitor_info", mode="watching", version=str(host.version),
                 cgroup=leaf, slurm_job="4", slurm_step="4.0") == 1
