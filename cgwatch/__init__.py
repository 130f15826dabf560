"""cgwatch: how much memory this process may really use, from its cgroup, kept current.

    import cgwatch
    cgwatch.total_memory()      # smallest limit on the path to the root, capped at host RAM
    cgwatch.available_memory()  # min headroom over the limited levels and the host

Both never raise. `cgwatch.Monitor` gives a private monitor, its levels and status.
`cgwatch.Events` reports memory events (OOM kills, limit hits) and headroom alerts.
`cgwatch.Guard` says when a job should save and stop, before the OOM killer acts.
"""

from __future__ import annotations

import threading

from .monitor import (
    HOST,
    POLLING,
    WATCHING,
    Change,
    Layout,
    LevelInfo,
    Monitor,
    Status,
    Subscription,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

    from .alerts import HeadroomAlert, Threshold
    from .event import Event
    from .events import Events
    from .guard import GUARD_EXIT_STATUS, Guard, Verdict
    from .shm import ShmUsage, shm_usage

# The events layer loads on first use, so `import cgwatch` stays as cheap as the queries.
_LAZY = {"Event": "event", "Events": "events", "HeadroomAlert": "alerts",
         "Threshold": "alerts", "shm_usage": "shm", "ShmUsage": "shm", "Guard": "guard",
         "GUARD_EXIT_STATUS": "guard", "Verdict": "guard"}

__all__ = [
    "HOST",
    "POLLING",
    "WATCHING",
    "Change",
    "Event",
    "Events",
    "GUARD_EXIT_STATUS",
    "Guard",
    "HeadroomAlert",
    "Layout",
    "LevelInfo",
    "Monitor",
    "Status",
    "ShmUsage",
    "Subscription",
    "Threshold",
    "Verdict",
    "available_memory",
    "default_monitor",
    "set_default_monitor",
    "shm_usage",
    "total_memory",
]
__version__ = "0.1.0"

_default: Optional[Monitor] = None
_default_lock = threading.Lock()


def default_monitor() -> Monitor:
    """The process-wide monitor behind the module functions, created on first use.

    Thread-free (`Monitor(thread=False)`): its queries stay exact without the background
    thread (docs/design.md section 4), and a process that only asks (the module functions,
    the psutil view and switch, the Prometheus collector) keeps a single thread, so a later
    fork() is safe (Python 3.12+ warns "multi-threaded, use of fork() may lead to
    deadlocks" otherwise: DataLoader workers). `subscribe()` and `Events` start the thread
    when they are used."""
    global _default
    monitor = _default
    if monitor is None:
        with _default_lock:
            if _default is None:
                _default = Monitor(thread=False)
            monitor = _default
    return monitor


def set_default_monitor(monitor: Optional[Monitor]) -> Optional[Monitor]:
    """Put `monitor` behind the module functions (None: a new default is made on next use),
    e.g. `set_default_monitor(Monitor(thread=False))`; returns the one it replaces, which the
    caller may close."""
    global _default
    with _default_lock:
        previous, _default = _default, monitor
    return previous


def total_memory() -> int:
    """Bytes this process may use at most: min(host RAM, every memory limit on its path)."""
    # One call less than default_monitor().total_memory() once the monitor exists: this is
    # the function users call in loops, and the call is half its cost.
    monitor = _default
    return (monitor if monitor is not None else default_monitor()).total_memory()


def available_memory() -> int:
    """Bytes this process can still allocate: min(host MemAvailable, each limited level's
    limit - (usage - inactive_file))."""
    return default_monitor().available_memory()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
