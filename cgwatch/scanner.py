"""Internal. The events scanner: reads the memory counters of a monitor's levels and turns
them into `Event`s, with no thread and no lock of its own (the caller serialises).

It owns, per level: the baseline of every counter, the notification descriptors (v1
eventfds on `memory.oom_control` and usage thresholds through `cgroup.event_control`, v2
PSI triggers on `memory.pressure`), the v1 OOM notifications drained but not yet scanned,
and the v2 carry (a hierarchical rise seen at a level before its ancestors show it). The
counter files themselves are read through the monitor's levels (`Level.read`: the one
descriptor per file the whole process shares, kept.py).

What is watched and how each case is noticed is in events.py's docstring.
"""

from __future__ import annotations

import select
from typing import Optional

from . import counters, names, notify, values
from .alerts import usage_thresholds
from .event import Event
from .files import close_quietly
from .names import FileNames
from .seam import Layout
from .tree import Level

# How long a lower level's rise may wait to show at its parent (the kernel raises them
# microseconds apart; scans are milliseconds apart). Past it, a parent's rise is its own: on a
# `memory_localevents` mount the parent never shows it.
CARRY_SECONDS = 1.0

# After a v1 OOM notification: when to read the counters again (seconds after it).
OOM_RESCANS = (0.002, 0.02, 0.1, 0.5)


class WatchedLevel:
    """One level being scanned, and the notification descriptors registered on it."""

    def __init__(self, index: int, level: Level, version: int) -> None:
        self.index = index
        self.level = level
        self.version = version
        self.oom_efd: Optional[int] = None
        self.threshold_efds: list[int] = []
        self.psi_fd: Optional[int] = None

    @property
    def directory(self) -> str:
        return self.level.directory

    @property
    def cgroup_path(self) -> str:
        return self.level.cgroup_path

    @property
    def limit(self) -> Optional[int]:
        return self.level.limit

    def read(self) -> dict[str, dict[str, int]]:
        """The counters of each file that can be read now (a removed cgroup gives ENODEV)."""
        result = {}
        for source in counters.counter_files(self.version):
            try:
                found = counters.parse_counters(source, self.level.read(source))
            except (OSError, ValueError):
                # Missing (a v2 level without the memory controller, the root) or unreadable
                # now: tried again next scan, since enabling the controller in the parent's
                # cgroup.subtree_control makes the files appear without a re-resolve.
                continue
            if found:  # an empty read (a file being rewritten) must not become a baseline
                result[source] = found
        return result

    def usage(self) -> Optional[int]:
        try:
            return values.parse_counter(self.level.read(FileNames.for_version(
                self.version).usage))
        except (OSError, ValueError):
            return None

    def close_thresholds(self) -> None:
        close_quietly(*self.threshold_efds)
        self.threshold_efds = []

    def close(self) -> None:
        close_quietly(*(fd for fd in (self.oom_efd, self.psi_fd) if fd is not None))
        self.close_thresholds()
        self.oom_efd = self.psi_fd = None


class Scanner:
    """Counters of the levels of one layout, their baselines and notification descriptors.

    `use_eventfd`: register v1 eventfds (off: poll only). `psi_trigger`: the v2 trigger that
    wakes headroom checks ("" for none)."""

    def __init__(self, use_eventfd: bool, psi_trigger: str) -> None:
        self.use_eventfd = use_eventfd
        self.psi_trigger = psi_trigger
        self.levels: list[WatchedLevel] = []
        self.version: Optional[int] = None
        self.generation = -1
        self.problems: dict[str, str] = {}  # mechanism -> why it is not in use
        self._last: dict[tuple[str, str], dict[str, int]] = {}
        # memory.events.local per (directory, counter), as it was when that counter of
        # memory.events was last seen (the pairing an Event's local_old comes from)
        self._local_seen: dict[tuple[str, str], int] = {}
        # v2: per counter, rises of lower levels not yet seen at the level above, and since when
        self._carry: dict[str, tuple[list[int], float]] = {}
        self._oom_own: dict[str, int] = {}
        self._notes: dict[str, int] = {}  # v1 OOM notifications drained but not yet scanned

    # ---- following the monitor's levels ----------------------------------------------------

    def resync(self, layout: Layout) -> bool:
        """Follow the monitor's levels (moved, limits changed, cgroup removed); True if they
        changed. A level seen for the first time gets a baseline, never events."""
        version = layout.version
        # A hidden v1 ancestor's files are the top level's: it has no counters of its own.
        wanted = [lvl for lvl in layout.levels if not lvl.hidden] if version is not None else []
        if version == self.version and [(w.cgroup_path, w.directory, w.limit) for w in wanted] \
                == [(lvl.cgroup_path, lvl.directory, lvl.limit) for lvl in self.levels]:
            self.levels = [self._rebind(lvl, level) for lvl, level in zip(self.levels, wanted)]
            return False
        old = {lvl.directory: lvl for lvl in self.levels} if version == self.version else {}
        for lvl in self.levels:
            if lvl.directory not in old:
                lvl.close()
        fresh: list[WatchedLevel] = []
        for index, level in enumerate(wanted):
            found = old.pop(level.directory, None)
            if found is None:
                assert version is not None
                found = WatchedLevel(index, level, version)
                self._take_baseline(found)
            else:
                found.index, found.level = index, level
            fresh.append(found)
        for lvl in old.values():
            lvl.close()
            self._forget(lvl.directory)
        self.levels = fresh
        self.version = version
        return True

    @staticmethod
    def _rebind(watched: WatchedLevel, level: Level) -> WatchedLevel:
        watched.level = level  # the same directory, maybe a new KeptDir after a re-resolve
        return watched

    def _take_baseline(self, lvl: WatchedLevel) -> None:
        self._forget(lvl.directory)
        for source, current in lvl.read().items():
            self._last[(lvl.directory, source)] = current
            if source == names.EVENTS_LOCAL:
                for counter, value in current.items():
                    self._local_seen[(lvl.directory, counter)] = value

    def _forget(self, directory: str) -> None:
        for table in (self._last, self._local_seen):
            for key in [k for k in table if k[0] == directory]:
                del table[key]
        self._oom_own.pop(directory, None)
        self._notes.pop(directory, None)

    # ---- notification descriptors ----------------------------------------------------------

    def arm(self, alert_lines: list[int], want_psi: bool) -> None:
        """(Re)register the notification descriptors the levels and alerts need:
        `alert_lines` are headroom thresholds in bytes (v1 usage eventfds sit at
        limit - line); `want_psi`: v2 PSI triggers on the limited levels."""
        if self.version == 1:
            self._arm_v1(alert_lines)
        elif self.version == 2:
            self._arm_v2(want_psi)

    def _arm_v1(self, alert_lines: list[int]) -> None:
        self.problems.pop("eventfd", None)
        limits = [lvl.limit for lvl in self.levels]
        thresholds = [usage_thresholds(limits, line) for line in alert_lines]
        for lvl in self.levels:
            lvl.close_thresholds()
            if lvl.limit is None or not self.use_eventfd:
                if lvl.oom_efd is not None:
                    close_quietly(lvl.oom_efd)
                    lvl.oom_efd = None
                continue
            try:
                if lvl.oom_efd is None:
                    lvl.oom_efd = notify.register_v1(lvl.directory, names.OOM_CONTROL)
                for per_level in thresholds:
                    usage = per_level[lvl.index]
                    if usage is not None:
                        lvl.threshold_efds.append(notify.register_v1(
                            lvl.directory, FileNames.for_version(1).usage, str(usage)))
            except OSError as e:
                self.problems["eventfd"] = (f"eventfd registration at {lvl.cgroup_path} "
                                            f"failed: {e.strerror or e}")
        if not self.use_eventfd:
            self.problems["eventfd"] = "eventfd notifications disabled by the caller"

    def _arm_v2(self, want_psi: bool) -> None:
        self.problems.pop("psi", None)
        for lvl in self.levels:
            wanted = bool(want_psi and self.psi_trigger and lvl.limit is not None)
            if not wanted and lvl.psi_fd is not None:
                close_quietly(lvl.psi_fd)
                lvl.psi_fd = None
            if wanted and lvl.psi_fd is None:
                try:
                    lvl.psi_fd = notify.psi_trigger(lvl.directory, self.psi_trigger)
                except OSError as e:
                    self.problems["psi"] = (f"PSI trigger at {lvl.cgroup_path} failed: "
                                            f"{e.strerror or e}")

    def descriptors(self) -> dict[int, tuple[str, int]]:
        """Every notification descriptor: fd -> (what, poll events)."""
        fds: dict[int, tuple[str, int]] = {}
        for lvl in self.levels:
            if lvl.oom_efd is not None:
                fds[lvl.oom_efd] = ("oom", select.POLLIN)
            for fd in lvl.threshold_efds:
                fds[fd] = ("threshold", select.POLLIN)
            if lvl.psi_fd is not None:
                fds[lvl.psi_fd] = ("psi", select.POLLPRI)
        return fds

    def on_ready(self, fd: int, revents: int) -> str:
        """A notification descriptor is ready: consume it; what it was ("oom": scan now and
        again over OOM_RESCANS; "threshold" / "psi": check the alerts; "" for unknown)."""
        for lvl in self.levels:
            if lvl.oom_efd == fd:
                self._notes[lvl.directory] = (self._notes.get(lvl.directory, 0)
                                              + notify.drain_eventfd(fd))
                return "oom"
            if fd in lvl.threshold_efds:
                notify.drain_eventfd(fd)
                return "threshold"
            if lvl.psi_fd == fd:
                if revents & (select.POLLERR | select.POLLNVAL):
                    close_quietly(fd)  # the cgroup went away; re-armed on the next resync
                    lvl.psi_fd = None
                return "psi"
        return ""

    def drain_ooms(self) -> None:
        for lvl in self.levels:
            if lvl.oom_efd is not None:
                self._notes[lvl.directory] = (self._notes.get(lvl.directory, 0)
                                              + notify.drain_eventfd(lvl.oom_efd))

    def close(self) -> None:
        for lvl in self.levels:
            lvl.close()
        self.levels = []

    def forget_descriptors(self) -> None:
        """A fork child: the notification descriptors are the parent's registrations; close
        our copies only (the kernel keeps the parent's) and stop scanning."""
        self.close()

    # ---- reading counters ------------------------------------------------------------------

    def scan(self, now: float) -> list[Event]:
        """Read every level's counters; the rises since the last scan, as Events."""
        version = self.version
        if version is None or not self.levels:
            return []
        if version == 1:
            # Every OOM eventfd first: attribution subtracts the ancestors' counts, so a scan
            # must see all of the notifications one OOM raised, not only the one that woke us.
            self.drain_ooms()
        # The top level first. The kernel raises a v2 counter from the memcg up, one level after
        # the other (memcg_memory_event(): the memcg, then each parent; 6.1), so a scan that
        # reads parents before children and sees a parent's rise also sees the child's, which
        # came first. Read leaf first, a scan that fell between the two increments saw the
        # parent rise alone and reported it as a rise of its own, before the child's (the VM
        # tier: 1 run in ~7 failed test_counter_already_nonzero_is_not_reported_later_rise_is).
        reads = [lvl.read() for lvl in reversed(self.levels)][::-1]
        rose: list[tuple[int, str, str, int, int]] = []
        if version == 1:
            # First, so an OOM reads in its order: the OOM, then the kill it led to.
            notes = [self._notes.pop(lvl.directory, 0) if lvl.oom_efd is not None else None
                     for lvl in self.levels]
            for lvl, own in zip(self.levels, counters.attribute_notifications(notes)):
                if own:
                    old = self._oom_own.get(lvl.directory, 0)
                    self._oom_own[lvl.directory] = old + own
                    rose.append((lvl.index, counters.EVENTFD, "oom", old, old + own))
        for lvl, read in zip(self.levels, reads):
            for source, current in read.items():
                key = (lvl.directory, source)
                before = self._last.get(key)
                self._last[key] = current
                if before is None:
                    continue  # the file was unreadable until now: this is its baseline
                rose.extend((lvl.index, source, c, old, new)
                            for c, old, new in counters.rises(before, current))
        # Levels that have memory.events (a baseline was read); not the v2 root.
        has_events = [(lvl.directory, names.EVENTS) in self._last for lvl in self.levels]
        propagated = self._propagation(rose, now, has_events) if version == 2 else {}
        self._pair_local_values(reads, rose)
        usages: dict[int, Optional[int]] = {}
        found = []
        for index, source, counter, old, new in rose:
            if source == names.EVENTS_LOCAL:
                continue  # folded into the memory.events event of the same level and counter
            lvl = self.levels[index]
            if index not in usages:
                usages[index] = lvl.usage()
            local_old = local_new = None
            local = reads[index].get(names.EVENTS_LOCAL)
            if local is not None and counter in local:
                local_new = local[counter]
                # No earlier local value: it did not rise as far as we know.
                local_old = self._local_seen.get((lvl.directory, counter), local_new)
                self._local_seen[(lvl.directory, counter)] = local_new
            flags = propagated.get(counter)
            found.append(Event(lvl.cgroup_path, lvl.directory, index, counter, old, new,
                               lvl.limit, usages[index], now, source, version, local_old,
                               local_new, bool(flags and flags[index]),
                               self.limit_above(index)))
        return found

    def _pair_local_values(self, reads: list[dict[str, dict[str, int]]],
                           rose: list[tuple[int, str, str, int, int]]) -> None:
        """Keep `_local_seen` (memory.events.local as it was when the same counter of
        memory.events was last seen) true where memory.events did not rise this scan: a value
        seen for the first time (a local file unreadable until now) and a reset (the cgroup
        re-created) become the pairing value; a local rise alone does not, since the kernel
        may show the local rise a scan before the hierarchical one (an event's local_old must
        be from before it)."""
        rising = {(index, counter) for index, source, counter, _, _ in rose
                  if source == names.EVENTS}
        for index, lvl in enumerate(self.levels):
            local = reads[index].get(names.EVENTS_LOCAL)
            if local is None:
                continue
            for counter, value in local.items():
                if (index, counter) in rising:
                    continue  # paired with this scan's event below
                key = (lvl.directory, counter)
                seen = self._local_seen.get(key)
                if seen is None or value < seen:
                    self._local_seen[key] = value

    def _propagation(self, rose: list[tuple[int, str, str, int, int]], now: float,
                     has_events: list[bool]) -> dict[str, list[bool]]:
        """v2: which rises only repeat the level below's. The kernel raises a counter level by
        level, so one kill can be split over two scans: what a lower level rose by is carried
        to the next scan for a while (CARRY_SECONDS)."""
        count = len(self.levels)
        deltas: dict[str, list[int]] = {}
        for index, source, counter, old, new in rose:
            if source == names.EVENTS:
                deltas.setdefault(counter, [0] * count)[index] = new - old
        propagated: dict[str, list[bool]] = {}
        for counter in set(deltas) | set(self._carry):
            carried, since = self._carry.pop(counter, ([], now))
            if now - since > CARRY_SECONDS or len(carried) != count:
                carried = []
            rises = deltas.get(counter, [0] * count)
            marks, carry = counters.propagated_across_scans(rises, carried)
            propagated[counter] = marks
            # A level that has no memory.events (the v2 root) never shows a rise: carrying
            # to it would keep the carry, and its window, alive forever.
            carry = [c if has_events[i] else 0 for i, c in enumerate(carry)]
            if any(carry):
                # The window runs from the newest rise that still waits to show above.
                self._carry[counter] = (carry, now if any(rises) else since)
        return propagated

    def limit_above(self, level: int) -> Optional[tuple[int, str]]:
        """The smallest limit at or above a level, and the path where it is."""
        limited = [(lvl.limit, lvl.cgroup_path) for lvl in self.levels[level:]
                   if lvl.limit is not None]
        return min(limited) if limited else None

    # ---- descriptions ----------------------------------------------------------------------

    def describe_events(self, watching: bool, reason: str, poll_interval: float) -> str:
        """How events are noticed right now, in words."""
        if self.version is None:
            return "none: no memory cgroup (host values only)"
        if self.version == 2:
            if watching:
                return "inotify on memory.events and memory.events.local of every level"
            return f"memory.events polled every {poll_interval:g}s (no inotify: {reason})"
        limited = sum(1 for lvl in self.levels if lvl.oom_efd is not None)
        polled = f"memory.oom_control and memory.failcnt polled every {poll_interval:g}s"
        if "eventfd" in self.problems:
            return f"{polled} ({self.problems['eventfd']})"
        return (f"memory.oom_control OOM eventfd on {limited or 'no'} limited "
                f"level{'s' * (limited != 1)}; {polled}")

    def describe_alerts(self, check_interval: float) -> str:
        """How headroom alerts are noticed right now, in words."""
        every = f"checked every {check_interval:g}s"
        if self.version == 1 and "eventfd" not in self.problems:
            return f"usage threshold eventfds on the limited levels, and {every}"
        if self.version == 2 and self.psi_trigger and "psi" not in self.problems:
            return (f"PSI trigger '{self.psi_trigger}' on memory.pressure of the limited "
                    f"levels and memory.events changes wake a check, and {every}")
        problem = "; ".join(self.problems.values())
        return every + (f" ({problem})" if problem else "")
