"""Internal. Builds one monitor's snapshots: resolves the process's cgroup (tree.py,
discovery.py), reads its levels, keeps the /proc/self/cgroup it was resolved from (to tell a
move), and falls back to the levels known before or to host values when that fails.

It only builds: the Tracker publishes what it returns (one attribute store, under its lock:
design.md §3) and decides the watch state's fields (`publishable`, handed in).
"""

from __future__ import annotations

import time

from . import discovery, hostmem, snapshot, tree
from .frozen import replace
from .snapshot import POLLING, WATCHING, Snapshot
from .tree import ProcCgroup

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

    from .hostmem import HostMemory
    from .inotify import Target
    from .tree import Level

    Publishable = Callable[[discovery.Resolved, tuple[Level, ...], HostMemory], Snapshot]

RETRY_INTERVAL = 1.0  # seconds between retries of what failed (the thread, a resolve)


class Resolver:
    """Where the process is: resolved into a snapshot's levels, and whether that must be retried."""

    def __init__(self, root: str, pid: Optional[int], report: Callable[[str], None]) -> None:
        self.root = root
        self.pid = pid  # None: this process
        self.proc = ProcCgroup(root, pid)
        self.report = report
        self.failed = False  # the last resolve failed for a reason that may pass: retry it
        self.generation = 0

    def build(self, previous: Optional[Snapshot], publishable: Publishable) -> Snapshot:
        """Resolve and read everything anew; `previous` is what was published before."""
        resolution, text = tree.resolve_process(self.root, self.pid)
        if isinstance(resolution, discovery.Unresolved) and resolution.transient \
                and previous is not None \
                and isinstance(previous.resolution, discovery.Resolved):
            # Cannot read /proc/self now (EMFILE in an fd-starved process, say): the levels
            # known before are still the best answer (their descriptors are open); retry.
            self.failed = True
            self.report(f"{resolution.reason}; answering from the levels resolved before "
                        f"(retried every {RETRY_INTERVAL:g} s)")
            return replace(previous, status=replace(previous.status, reason=resolution.reason))
        self.proc.remember(text)
        self.failed = isinstance(resolution, discovery.Unresolved) and resolution.transient
        host = previous.host if previous is not None and previous.host.fd >= 0 \
            else hostmem.shared(self.root)
        if host.reason:
            self.report(host.reason)
        self.generation += 1
        if isinstance(resolution, discovery.Resolved):
            try:
                lvls = tree.build_levels(self.root, resolution)
                return publishable(resolution, lvls, host)
            except OSError as e:
                self.failed = True
                resolution = discovery.Unresolved(f"cannot read {resolution.directory}: {e}")
        assert isinstance(resolution, discovery.Unresolved)
        self.report(f"no memory cgroup, using host values: {resolution.reason}")
        return snapshot.host_only(resolution, host, self.generation)

    def fresh_limits(self, snap: Snapshot, closed: bool, poll_interval: float,
                     publishable: Publishable) -> Optional[Snapshot]:
        """`snap` with freshly read limits (a closed monitor's: without descriptors, read
        anew after `poll_interval`); None if the process's cgroup directory is gone."""
        res = snap.resolution
        if not isinstance(res, discovery.Resolved):
            return snap
        lvls = tree.reread_limits(self.root, res, snap.levels)
        if lvls is None:
            return None
        if closed:
            total = min([snap.host.total] + [lvl.limit for lvl in lvls if lvl.limit is not None])
            return snapshot.without_descriptors(
                replace(snap, levels=lvls, total=total), "monitor closed",
                time.monotonic() + poll_interval)
        return publishable(res, lvls, snap.host)

    def changed_limits(self, snap: Snapshot, targets: list[Target],
                       publishable: Publishable) -> Optional[Snapshot]:
        """`snap` with only the limit files that raised an event re-read (tree.changed_limits);
        None when anything is unusual: the caller takes the full re-read (`fresh_limits`)."""
        res = snap.resolution
        if not isinstance(res, discovery.Resolved):
            return snap
        lvls = tree.changed_limits(snap.levels, [(t.level_index, t.path) for t in targets],
                                   res.version)
        return None if lvls is None else publishable(res, lvls, snap.host)

    def closed_refresh(self, snap: Snapshot, poll_interval: float,
                       publishable: Publishable) -> Optional[Snapshot]:
        """A closed monitor's re-read (at most every poll_interval), with no descriptor kept:
        /proc/self/cgroup read anew, so a move is followed, then the limits; None if the
        process's cgroup directory is gone (nothing to publish)."""
        if self.proc.moved_unkept():
            snap = self.build(snap, publishable)
            self.proc.forget_descriptor()
            return closed(snap, time.monotonic() + poll_interval)
        return self.fresh_limits(snap, True, poll_interval, publishable)


def closed(snap: Snapshot, expires: float) -> Snapshot:
    """A closed monitor's snapshot: the host's and the levels' descriptors let go, answers
    read anew (at most once until `expires`)."""
    return snapshot.without_descriptors(replace(snap, host=snap.host.detached()),
                                        "monitor closed", expires)


def publishable(res: discovery.Resolved, lvls: tuple[Level, ...], host: HostMemory,
                generation: int, *, watching: bool, reason: str, trusted: bool,
                pending: Optional[Callable[[float], list[tuple[int, int]]]]) -> Snapshot:
    """The snapshot of these levels in the watch state given. `trusted` (watching, `fresh=False`,
    served by the thread): queries check nothing. Else a query checks `pending` (the watch's
    poll(0)) or, polling, the limit files themselves (tree.limit_check): exact all the same."""
    mode = WATCHING if watching else POLLING
    snap = snapshot.make(res, lvls, host, mode, reason, None, generation)
    if trusted:
        snap = replace(snap, trusted=True)
    elif pending is not None:
        snap = replace(snap, pending=pending)
    elif mode == POLLING:
        snap = replace(snap, pending=tree.limit_check(lvls, res.version))
    return snap
