"""A real Prometheus server scraping the real `cgwatch serve` (v1 on this machine; v2 in the VM
tier), with the shipped alert rules evaluated.

`cgwatch serve` runs inside a limited cgroup (`job/serve`, below the test's own cgroup, made by
tests/cgroup_helpers.py); Prometheus (Debian's package) listens on 127.0.0.1 only, keeps its
data in a throw-away directory, scrapes every second and evaluates deploy/prometheus/
cgwatch-rules.yml every second. Through its HTTP API the test checks what an operator's
dashboards and alerts would see: the limit, then an OOM kill in that cgroup as a counter
increase and as the CgwatchOOMKill alert firing. Everything it starts is stopped, and the
data directory removed, also on failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest

from tests.cgroup_helpers import (
    PROJECT,
    MiB,
    Tree,
    cgroup_tree,
    oom_kills,
    oom_victim_cgroup,
    own_memory_cgroup,
    real_kernel_marks,
)
from tests.extras import debian_program, need
from tests.prometheus.loopback import ensure_up_in_vm

need("prometheus-client", extra="prometheus")  # `cgwatch serve` exports with it
pytestmark = real_kernel_marks()

RULES = os.path.join(PROJECT, "deploy", "prometheus", "cgwatch-rules.yml")
LIMIT = 200 * MiB
# Allocates (and touches) up to 256 MiB, 1 MiB at a time: over LIMIT, so the kernel kills it.
ALLOC = "b = []\nfor _ in range(256):\n    b.append(bytearray(1 << 20))\n"
# `cgwatch serve` on any free loopback port. As root it lowers its own oom_score_adj so that
# the OOM killer picks the victim beside it, not the exporter (as `cgwatch run` does).
SERVE = """
import sys
try:  # closed inside the try: the write's error surfaces at close (EACCES without
    # CAP_SYS_RESOURCE), and Python 3.13 reports an unclosed one on stderr
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("-500")
except OSError:
    pass
from cgwatch.cli import main
sys.exit(main(["serve", "--port", "0"]))
"""
# Under the VM tier's emulation Prometheus starts ~30x slower than here: the waits are long
# bounds, not expected durations (each returns as soon as its condition holds).
WAIT = float(os.environ.get("CGWATCH_PROMETHEUS_WAIT", "120"))


@pytest.fixture(autouse=True, scope="module")
def _loopback() -> None:
    ensure_up_in_vm()  # the v2 VM boots with lo down (tests/prometheus/loopback.py)


def prometheus_binary() -> str:
    return debian_program("prometheus", "prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(what: str, probe: Callable[[], Any], timeout: float = WAIT,
             proc: Optional[subprocess.Popen[str]] = None) -> Any:
    """Call `probe` until it returns something truthy (then return it), for at most
    `timeout` seconds; fail saying `what` otherwise, or as soon as `proc` dies."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.returncode}")
        try:
            got = probe()
        except OSError as e:  # not listening yet
            last = e
        else:
            if got:
                return got
            last = got
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


class Prometheus:
    """A Prometheus server on 127.0.0.1 with a throw-away data directory."""

    def __init__(self, target: str) -> None:
        binary = prometheus_binary()  # before anything is made: it may skip
        self.dir = tempfile.mkdtemp(prefix="cgwatch-prometheus-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    f"rule_files:\n  - {RULES}\n"
                    "scrape_configs:\n  - job_name: cgwatch\n"
                    f"    static_configs:\n      - targets: ['{target}']\n")
        # Closed by stop(), which the test calls in a finally.
        self.log = open(os.path.join(self.dir, "log"), "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.load(reply)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def first_value(self, expr: str) -> Optional[float]:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as reply:
            return reply.status == 200

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=60)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def cgroup_label(directory: str) -> str:
    """The `cgroup` label of a directory we made: its path inside the hierarchy."""
    res, why = own_memory_cgroup()
    assert res is not None, why
    return os.path.join(res.cgroup_path, os.path.relpath(directory, res.directory))


def start_serve(tree: Tree, cgroup: str) -> tuple[subprocess.Popen[str], str]:
    proc = tree.spawn(cgroup, SERVE)
    assert proc.stderr is not None
    seen = []
    for _ in range(20):  # its first line; never read() a server that runs until killed
        line = proc.stderr.readline()
        if not line or line.startswith("cgwatch serve: http://127.0.0.1:"):
            break
        seen.append(line)
    assert line.startswith("cgwatch serve: http://127.0.0.1:"), "".join(seen) + line
    return proc, line.split()[2]


def test_prometheus_sees_the_limit_and_an_oom_kill(tree: Tree) -> None:
    limited = tree.make("job", limit=LIMIT)
    serve, metrics_url = start_serve(tree, tree.make("job/serve"))
    job = cgroup_label(limited)
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        metrics = reply.read().decode()
    print(f"\n--- /metrics of `cgwatch serve` in {job} (limit {LIMIT}) ---\n{metrics}")
    prometheus = Prometheus(urllib.parse.urlparse(metrics_url).netloc)
    try:
        started = time.monotonic()
        wait_for("prometheus ready", prometheus.ready, proc=prometheus.proc)
        total = wait_for("first scrape queryable",
                         lambda: prometheus.first_value("cgwatch_total_memory_bytes"),
                         proc=prometheus.proc)
        print(f"cgwatch_total_memory_bytes = {total:.0f} "
              f"({time.monotonic() - started:.1f} s after prometheus started)")
        assert total == LIMIT
        assert prometheus.first_value(f'cgwatch_cgroup_limit_bytes{{cgroup="{job}"}}') == LIMIT
        up = prometheus.first_value('up{job="cgwatch"}')
        assert up == 1
        before = oom_kills(limited, tree.version)
        # Let Prometheus hold a sample of the counter before the kill (increase() needs two).
        wait_for("oom_kill counter scraped", lambda: prometheus.query(
            f'cgwatch_memory_events_total{{cgroup="{job}",event="oom_kill"}}'),
            proc=prometheus.proc)

        victim = tree.spawn(oom_victim_cgroup(tree, limited), ALLOC)
        victim.wait(timeout=60)
        assert victim.returncode == -9, victim.stderr.read() if victim.stderr else ""
        assert oom_kills(limited, tree.version) == before + 1
        killed = time.monotonic()
        assert serve.poll() is None, "the OOM killer took the exporter"

        expr = f'increase(cgwatch_memory_events_total{{cgroup="{job}",event="oom_kill"}}[1m])'
        increase = wait_for("the kill in increase()",
                            lambda: (prometheus.first_value(expr) or 0) >= 1
                            and prometheus.first_value(expr), proc=prometheus.proc)
        print(f"{expr} = {increase} ({time.monotonic() - killed:.1f} s after the kill)")
        alert = wait_for("CgwatchOOMKill firing", lambda: prometheus.query(
            f'ALERTS{{alertname="CgwatchOOMKill",alertstate="firing",cgroup="{job}"}}'),
            proc=prometheus.proc)
        print(f"ALERTS{{alertname=\"CgwatchOOMKill\"}} = {alert[0]['metric']} "
              f"({time.monotonic() - killed:.1f} s after the kill)")
        assert alert[0]["metric"]["severity"] == "critical"
        assert alert[0]["metric"]["event"] == "oom_kill"
    except BaseException:
        print(f"--- prometheus output ---\n{prometheus.output()}")
        raise
    finally:
        prometheus.stop()
        serve.send_signal(signal.SIGTERM)
        try:
            _, err = serve.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.communicate(timeout=60)
            raise
    assert serve.returncode == 0, err
    assert not os.path.exists(prometheus.dir)
