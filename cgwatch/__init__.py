"""cgwatch: how much memory this process may really use, from its cgroup, kept current.

    import cgwatch
    cgwatch.total_memory()      # smallest limit on the path to the root, capped at host RAM
    cgwatch.available_memory()  # min headroom over the limited levels and the host

Both never raise. `cgwatch.Monitor` gives a private monitor, its levels and status.
`cgwatch.Events` reports memory events (OOM kills, limit hits) and headroom alerts.
`cgwatch.Guard` says when a job should save and stop, before the OOM killer acts.
"""

from __future__ import annotations

from .default import available_memory, default_monitor, set_default_monitor, total_memory
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
    from typing import Any

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

def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
