"""Internal. Memory event counters: which files hold them, how to read them, and what counts as
a rise.

Pure functions on text and numbers, table-tested in tests/test_events_counters.py; the events
layer (events.py) does the reading and the timing.

Files per cgroup version:
- v2 `memory.events` (hierarchical: a level counts its whole subtree) with `low`, `high`,
  `max`, `oom`, `oom_kill`, `oom_group_kill` and whatever keys newer kernels add; and
  `memory.events.local` (the same keys, counting this level only).
- v1 `memory.oom_control` (`oom_kill`: processes of *this* cgroup killed by an OOM killer;
  `under_oom`: 1 while this cgroup is in an OOM state) and `memory.failcnt` (times a charge
  hit this level's limit, the analogue of v2 `max`). v1 has no hierarchical counters: on v1
  `oom_kill` rises only in the victim's own cgroup, never in its ancestors.
- v1 `oom` is not a kernel file: it counts OOM notifications delivered through
  `cgroup.event_control` eventfds since the watch began (see `attribute_notifications`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

from . import values
from .names import EVENT_CONTROL, FAILCNT, FileNames

EVENTFD = EVENT_CONTROL  # source name of the v1 `oom` counter (notification count)

# A setting, not a counter: reporting its changes as events would be wrong.
_NOT_COUNTERS = frozenset({"oom_kill_disable"})


def counter_files(version: int) -> tuple[str, ...]:
    """The files read for counters at each level, in reading order."""
    return FileNames.for_version(version).counters


def parse_counters(source: str, text: values.Text) -> dict[str, int]:
    """The counters in one file's text. Raises ValueError on a file that makes no sense."""
    if source == FAILCNT:
        return {"failcnt": values.parse_counter(text)}
    counters = values.parse_flat_keyed(text)
    for key in _NOT_COUNTERS:
        counters.pop(key, None)
    shown = text.decode("ascii", "replace") if isinstance(text, bytes) else text
    if not counters and shown.strip():
        raise ValueError(f"no counters in {source}: {shown[:40]!r}")
    return counters


def rises(before: Mapping[str, int], after: Mapping[str, int]) -> list[tuple[str, int, int]]:
    """(counter, old, new) for every counter that went up, in the file's order.

    A counter absent from `before` has no baseline (it appeared later), so it is not a rise;
    a counter that went down was reset (the cgroup was re-created, or `under_oom` cleared)
    and is not one either. The caller then takes `after` as the new baseline.
    """
    return [(key, before[key], new) for key, new in after.items()
            if key in before and new > before[key]]


def propagated(deltas: Sequence[int]) -> list[bool]:
    """For one hierarchical counter's rises in one scan, leaf level first: whether each
    level's rise is wholly the rise already seen at the level below it on the path.

    v2 `memory.events` counts a level's whole subtree, so one OOM kill raises `oom_kill` at
    every ancestor: only the deepest of those says where it happened. A level whose rise is
    larger than the level below's has a share of its own (from itself or another child),
    so it is not propagated.
    """
    return propagated_across_scans(deltas, [0] * len(deltas))[0]


def propagated_across_scans(deltas: Sequence[int],
                            carried: Sequence[int]) -> tuple[list[bool], list[int]]:
    """`propagated` for a scan that may fall between the kernel's increments.

    The kernel raises a hierarchical counter level by level, leaf first, so a scan can see a
    level's rise before its ancestors' (one scan) and the ancestors' in the next. `carried[i]`
    is what level i-1 rose by earlier and level i has not yet shown. Returns the flags and the
    new carry: a rise at level i is propagated if the rises from below (this scan's and the
    carried ones) cover it; what they cover is used up, the rest carries on.
    """
    flags = []
    carry = []
    for i, delta in enumerate(deltas):
        from_below = (carried[i] if i < len(carried) else 0) + (deltas[i - 1] if i else 0)
        flags.append(i > 0 and 0 < delta <= from_below)
        carry.append(from_below - min(delta, from_below))
    return flags, carry


def attribute_notifications(counts: Sequence[Optional[int]]) -> list[int]:
    """v1 OOM notifications read in one scan at each level of the path (leaf first; None where
    no eventfd is registered), turned into the OOMs that happened *at* each level.

    The kernel notifies an OOMing cgroup and every cgroup below it, so a level's count also
    holds its ancestors' OOMs: subtract the count of the nearest registered ancestor. Only
    limited levels can run out of memory, so only they are registered; the result is 0 for
    the others.
    """
    own = []
    for i, count in enumerate(counts):
        if count is None:
            own.append(0)
            continue
        above = next((c for c in counts[i + 1:] if c is not None), 0)
        own.append(max(0, count - above))
    return own


def severity(counter: str) -> str:
    """How loud a rise of `counter` is: "error" (a process was or is about to be killed),
    "warning" (the limit or the throttle was hit) or "info"."""
    if counter in ("oom", "oom_kill", "oom_group_kill", "under_oom"):
        return "error"
    if counter in ("high", "max", "failcnt"):
        return "warning"
    return "info"


DESCRIPTIONS = {
    "oom_kill": "a process was killed by the OOM killer",
    "oom_group_kill": "a group of processes was killed by the OOM killer",
    "oom": "the cgroup ran out of memory and the OOM killer was invoked",
    "under_oom": "the cgroup is out of memory (processes may hang if the OOM killer is off)",
    "max": "usage hit the hard limit (memory was reclaimed to make room)",
    "failcnt": "usage hit the hard limit (memory was reclaimed to make room)",
    "high": "usage went over memory.high (the cgroup is being throttled)",
    "low": "memory was reclaimed below memory.low (protection was not enough)",
}


def describe(counter: str) -> str:
    return DESCRIPTIONS.get(counter, f"counter {counter!r} rose")
