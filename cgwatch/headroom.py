"""Internal. The headroom rules on numbers: a level's headroom, the headroom before
throttling, and which level binds each answer. Pure, no I/O: the callers read the files
(`snapshot.read_levels`, `Monitor.available_memory`) and tests/test_headroom.py holds the
rules as a table.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Optional


def headroom(limit: int, usage: int, inactive_file: int) -> int:
    """limit - working set, where working set = max(usage - inactive_file, 0).

    The working set leaves out reclaimable inactive page cache (the kubelet's definition) and
    is never negative. The headroom itself is not floored: it is below 0 by as much as the
    working set is over the limit (v1 lets usage overshoot briefly; usage above memory.high is
    common), which `levels()` shows as is. The answers floor it: `available_memory()` takes
    max(0, least headroom), as `throttle_headroom` does here.
    """
    working_set = usage - inactive_file
    return limit - working_set if working_set > 0 else limit


def throttle_headroom(high_headrooms: Iterable[Optional[int]]) -> Optional[int]:
    """max(0, min(high - working set)) over the levels with a v2 memory.high (their
    `high_headroom`; None for a level without one). None when no level has one."""
    rooms = [room for room in high_headrooms if room is not None]
    return max(0, min(rooms)) if rooms else None


def binding_levels(limits: Sequence[Optional[int]], headrooms: Sequence[Optional[int]],
                   host_total: int, host_available: Optional[int],
                   ) -> tuple[Optional[int], Optional[int]]:
    """(i, j): the index of the level that binds `total_memory()` and of the one that binds
    `available_memory()`, leaf first; None where no level does (the host binds, or no level
    has a limit / a headroom).

    - total: the first level with the least limit, if that limit <= host_total (MemTotal).
    - available: the first level with the least headroom, unless host_available
      (MemAvailable; None: unknown) is below it.

    The marks follow the answers: a level binds only if the host does not bind tighter, and a
    tie with the host marks the level (it binds as much). Among equal levels only the first
    (deepest) is marked.
    """
    known_limits = [limit for limit in limits if limit is not None]
    total = min(known_limits) if known_limits else None
    if total is not None and total > host_total:
        total = None
    known_rooms = [room for room in headrooms if room is not None]
    room = min(known_rooms) if known_rooms else None
    if room is not None and host_available is not None and host_available < room:
        room = None
    return (limits.index(total) if total is not None else None,
            headrooms.index(room) if room is not None else None)
