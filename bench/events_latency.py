"""Event latency: an OOM kill in the process's own cgroup until the Events callback runs.

Each trial starts a small child in the deepest bench cgroup (the one this process sits in,
with a limit). The child fills memory to just under the limit, prints time.perf_counter()
(CLOCK_MONOTONIC, the same clock in every process), then asks for 16 MiB more: the cgroup's
OOM killer kills it a few ms later. Latency is from that timestamp to the callback running on
the events thread, for the first event of the trial (v1: `oom`, from the eventfd on
memory.oom_control; v2: whatever memory.events shows first) and for the `oom_kill` rise.
The time includes the kernel's reclaim attempts and the kill itself, so it is an upper bound.

The OOM killer chooses among every process in the cgroup, and this one is in it too: the child
sets its oom_score_adj to 1000, which adds the cgroup's whole limit to its score, and fills
~256 MiB, so its score is several times this process's RSS (checked before each trial). The
main thread blocks while it waits (it does not spin), like an application would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from types import ModuleType
from typing import Any, Optional

from bench import cgroups
from bench.cgroups import Nest
from bench.latency import summarize

MiB = 1 << 20
HEADROOM = 256 * MiB  # the limit is set this far above the cgroup's usage before each trial

_CHILD = r"""
import os, sys, time
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("1000")
def read(name):
    with open(os.path.join({leaf!r}, name)) as f:
        return int(f.read())
room = read({limit_name!r}) - read({usage_name!r})
keep = b"x" * max(0, room - 8 * {mib})
sys.stdout.write(repr(time.perf_counter()) + "\n")
sys.stdout.flush()
more = b"x" * (16 * {mib})
time.sleep(5)
"""


def available() -> str:
    """Empty when the installed cgwatch has the events layer; else why this is skipped."""
    try:
        import cgwatch

        cgwatch.Events  # noqa: B018 - the lazy export loads the layer
    except (ImportError, AttributeError) as e:
        return f"no events layer in this cgwatch ({e})"
    return ""


class _Recorder:
    """Callback that timestamps every event after arm(); a trial takes the first event, and
    the first oom_kill, at or after its child's timestamp. Events before it are the previous
    trial's (a rescan or poll that lands after the next trial began) and are only counted:
    taking them as this trial's first event gave negative latencies."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []  # (perf_counter() at the callback, counter)
        self.cond = threading.Condition()

    def arm(self) -> None:
        with self.cond:
            self.seen = []

    def __call__(self, item: Any) -> None:
        now = time.perf_counter()
        if getattr(item, "kind", "") != "event":
            return
        with self.cond:
            self.seen.append((now, item.counter))
            self.cond.notify_all()

    def stale(self, start: float) -> int:
        with self.cond:
            return sum(1 for t, _ in self.seen if t < start)

    def after(self, start: float, timeout: float) -> Optional[tuple[float, float]]:
        """(first event, first oom_kill) at or after `start`, waiting up to `timeout` s for
        the oom_kill; None if it did not come."""
        deadline = time.perf_counter() + timeout
        with self.cond:
            while True:
                later = [(t, counter) for t, counter in self.seen if t >= start]
                kills = [t for t, counter in later if counter == "oom_kill"]
                if kills:
                    return later[0][0], kills[0]
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    return None
                self.cond.wait(remaining)


class _Floor:
    """No cgwatch: a bare thread blocked on the kernel's own notification for the leaf (v1: an
    eventfd registered for memory.oom_control; v2: inotify on memory.events), timestamping its
    wake-ups; a trial takes the first at or after its child's timestamp. The kernel's and
    Python's share of the latency."""

    def __init__(self, nest: Nest) -> None:
        self.fds: list[int] = []
        if nest.version == 2:
            import inotify_simple

            self.inotify = inotify_simple.INotify()
            self.inotify.add_watch(os.path.join(nest.leaf, "memory.events"),
                                   inotify_simple.flags.MODIFY)
            self.fd = self.inotify.fileno()
        else:
            self.fd = os.eventfd(0)
            control = os.open(os.path.join(nest.leaf, "memory.oom_control"), os.O_RDONLY)
            cgroups.write(os.path.join(nest.leaf, "cgroup.event_control"),
                                 f"{self.fd} {control}")
            self.fds = [self.fd, control]
        self.woke: list[float] = []
        self.stop = False
        self.thread = threading.Thread(target=self._run, name="bench-floor", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import select

        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while not self.stop:
            if poller.poll(200):
                self.woke.append(time.perf_counter())
                os.read(self.fd, 65536)

    def first_after(self, start: float) -> Optional[float]:
        return next((t for t in self.woke if t >= start), None)

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        for fd in self.fds:
            os.close(fd)
        if not self.fds:
            self.inotify.close()


def _own_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def oom_latency(nest: Nest, trials: int, package: Optional[ModuleType] = None) -> dict[str, Any]:
    """`trials` OOM kills at the deepest level of `nest`; this process must be inside it.
    `package`: the cgwatch module to use (bench.ab passes copies), default `cgwatch`."""
    names = ("memory.max", "memory.current") if nest.version == 2 else (
        "memory.limit_in_bytes", "memory.usage_in_bytes")
    code = _CHILD.format(leaf=nest.leaf, limit_name=names[0], usage_name=names[1], mib=MiB)
    recorder = _Recorder()
    first: list[float] = []
    kill: list[float] = []
    floor_seconds: list[float] = []
    stale = [0]  # events of an earlier trial that arrived after the next one began
    floor = _Floor(nest)
    try:
        mechanism = _trials(package, nest, code, names, trials, recorder, floor, first, kill,
                            floor_seconds, stale)
    finally:
        floor.close()
    missed = trials - len(first)
    return {
        "mechanism": mechanism,
        "stale_events": stale[0],
        "first_event": summarize(first) if first else None,
        "oom_kill_event": summarize(kill) if kill else None,
        "floor": summarize(floor_seconds) if floor_seconds else None,
        "missed": missed,
        "first_event_seconds": first,
        "floor_seconds": floor_seconds,
    }


def _trials(package: Optional[ModuleType], nest: Nest, code: str, names: tuple[str, str],
            trials: int, recorder: _Recorder, floor: _Floor, first: list[float],
            kill: list[float], floor_seconds: list[float], stale: list[int]) -> str:
    if package is None:
        import cgwatch as package
    with package.Monitor() as monitor, package.Events(monitor, log=False) as events:
        events.subscribe(recorder)
        mechanism = events.mechanisms()
        for _ in range(trials):
            if _own_rss() > HEADROOM:
                raise RuntimeError("bench RSS too large to leave the OOM kill to the child")
            usage = int(cgroups.read(os.path.join(nest.leaf, names[1])))
            cgroups.write(nest.limit_path(nest.leaf),
                                 str((usage + HEADROOM) // 4096 * 4096))
            time.sleep(0.005)  # let the threads settle after the limit write
            recorder.arm()
            floor.woke = []
            child = subprocess.Popen([sys.executable, "-I", "-S", "-c", code],
                                     stdout=subprocess.PIPE, text=True)
            assert child.stdout is not None
            line = child.stdout.readline()
            child.wait(timeout=30)
            if not line:
                continue
            start = float(line)
            seen = recorder.after(start, timeout=2.0)
            stale[0] += recorder.stale(start)
            if seen is None:
                continue
            first.append(seen[0] - start)
            kill.append(seen[1] - start)
            woke = floor.first_after(start)
            if woke is not None:
                floor_seconds.append(woke - start)
    return str(mechanism.get("events", mechanism))
