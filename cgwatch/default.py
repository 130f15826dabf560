"""Internal. The process-wide default monitor and the module functions that answer from it
(`cgwatch.total_memory()`, `cgwatch.available_memory()`, `cgwatch.default_monitor()`,
`cgwatch.set_default_monitor()`: public through `cgwatch`).

Its own module, below the package: the events layer, the psutil view, the Prometheus
collector, the guard and the DeepSpeed accelerator ask for the default monitor when they were
given none, and importing it from `cgwatch/__init__.py` made each of them an import upward
and a circle through the package (issue 21; tests/test_layers.py).
"""

from __future__ import annotations

import threading

from .monitor import Monitor

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

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
