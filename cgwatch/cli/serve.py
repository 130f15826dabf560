"""Internal. `cgwatch serve`: the Prometheus exporter (cgwatch/prometheus.py) as a command.

Serves `/metrics` on loopback unless another address is asked for, until SIGTERM or SIGINT
(exit 0), or until the `--pid` process exits (exit 0, said on stderr). A `--pid` process whose
memory cgroup cannot be found is refused at start (exit 1, the reason on stderr): never the
host's figures under its name. The main thread sleeps
in one select() on a signal wake-up pipe and, with --pid, a pidfd (Linux 5.3+): no timer
runs while nobody scrapes. Where pidfd_open is missing, the pid is checked once a second.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from types import FrameType
from typing import Optional


def run_serve(args: argparse.Namespace) -> int:
    try:
        from .. import prometheus
    except ImportError as e:
        print(f"cgwatch serve: needs prometheus_client ({e}); install cgwatch[prometheus]",
              file=sys.stderr)
        return 2
    from ..monitor import HOST, Monitor

    pid: Optional[int] = args.pid
    pidfd = -1
    if pid is not None:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            print(f"cgwatch serve: no process {pid}", file=sys.stderr)
            return 2
        except (AttributeError, OSError):
            pidfd = -1  # Python < 3.9 or kernel < 5.3: checked by polling instead
            if not _alive(pid):
                print(f"cgwatch serve: no process {pid}", file=sys.stderr)
                return 2
    # Thread-free: the exporter adds no idle wake-up; each scrape's queries stay exact.
    monitor = Monitor(args.root, pid=pid, thread=False)
    if pid is not None and monitor.status.mode == HOST:
        # Host values under the process's name would be a lie (a sidecar in another cgroup
        # namespace whose view cannot be mapped to the process's: its mount root climbs
        # further than its cgroup path, "/../../.." against "/../app").
        reason = monitor.status.reason
        monitor.close()
        if pidfd >= 0:
            os.close(pidfd)
        print(f"cgwatch serve: cannot find the memory cgroup of process {pid}: {reason}. "
              "From a sidecar in its own cgroup namespace, the process must have its own "
              "cgroup mount (a container's), or run this in the process's cgroup namespace "
              f"(nsenter --cgroup --target {pid} cgwatch serve --pid {pid})", file=sys.stderr)
        return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    stop = {"signal": 0}

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        stop["signal"] = signum

    old_wakeup = signal.set_wakeup_fd(wake_w)
    old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    server = None
    try:
        try:
            server, thread, _ = prometheus.start_http_server(args.port, args.host,
                                                             monitor=monitor)
        except OSError as e:
            print(f"cgwatch serve: cannot listen on {args.host}:{args.port}: "
                  f"{e.strerror or e}", file=sys.stderr)
            return 2
        status = monitor.status
        whose = f"process {pid}" if pid is not None else "this process"
        print(f"cgwatch serve: http://{_url_host(args.host)}:{server.server_port}/metrics "
              f"({whose}, cgroup v{status.version} {status.cgroup_path}, mode {status.mode})",
              file=sys.stderr, flush=True)
        watched = [wake_r] + ([pidfd] if pidfd >= 0 else [])
        timeout = 1.0 if pid is not None and pidfd < 0 else None
        while not stop["signal"]:
            readable, _, _ = select.select(watched, [], [], timeout)
            if pid is not None and (pidfd in readable or (pidfd < 0 and not _alive(pid))):
                print(f"cgwatch serve: process {pid} exited; stopping", file=sys.stderr,
                      flush=True)
                return 0
            if wake_r in readable:
                os.read(wake_r, 512)
        return 0
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        monitor.close()
        for signum, handler in old_handlers.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(old_wakeup)
        for fd in (wake_r, wake_w, pidfd):
            if fd >= 0:
                os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
