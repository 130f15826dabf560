"""The `Event` value: a memory counter rose at one level of the path; and the one-line message
about it (pure: table-tested in tests/test_events_counters.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from . import counters
from .units import human_bytes


@dataclass(frozen=True)
class Event:
    """A memory counter rose at one level of the path."""

    cgroup_path: str  # the level's path inside the hierarchy
    directory: str  # where its files are
    level: int  # 0 = the process's own cgroup, 1 = its parent, ...
    counter: str  # "oom_kill", "max", "failcnt", ... (counters.py)
    old: int
    new: int
    limit: Optional[int]  # the level's hard limit (None: none), and its usage, when seen
    usage: Optional[int]
    time: float  # time.monotonic() of the scan that saw it
    source: str  # the file it was read from (or "cgroup.event_control" for v1 `oom`)
    version: int
    # v2: the same counter in memory.events.local (this level only), before and now.
    local_old: Optional[int] = None
    local_new: Optional[int] = None
    # v2: this rise is the same one already reported at the level below on the path
    # (hierarchical counters repeat a kill at every ancestor). The log skips these.
    propagated: bool = False
    # The smallest limit at or above this level and the path where it is (None: no limit on
    # the rest of the path), as the scanner saw the levels: a level without a limit of its own
    # names the one that binds it. Carried by the event, so a formatter needs nothing else.
    path_limit: Optional[tuple[int, str]] = None

    kind = "event"

    @property
    def delta(self) -> int:
        return self.new - self.old

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.kind, **self.__dict__}

    def message(self) -> str:
        """One line about it, naming the binding limit (`path_limit`) when this level has
        none."""
        return event_message(self)



def limit_text(limit: Optional[int], path_limit: Optional[tuple[int, str]]) -> str:
    """`64.0 MiB`, or for a level without a limit the one that binds on the path."""
    if limit is not None:
        return human_bytes(limit)
    if path_limit is not None:
        return f"none here; {human_bytes(path_limit[0])} at {path_limit[1]}"
    return "none here"


def event_message(event: Event, folded: int = 0) -> str:
    """One line about an event; `folded` rises were held back since the last such line."""
    extra = f", {folded} more rises since the last report" if folded else ""
    return (f"cgroup {event.cgroup_path}: {counters.describe(event.counter)} "
            f"({event.counter} {event.old} -> {event.new}{extra}; limit "
            f"{limit_text(event.limit, event.path_limit)}, usage {human_bytes(event.usage)})")
