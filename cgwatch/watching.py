"""Internal. What a monitor watches with inotify, and the descriptors that watch it: a
Watcher (watcher.py) over the levels' limit files, their parents and the files subscribers
asked for, and the epoll over it that queries poll(0) for pending changes."""

from __future__ import annotations

import os
import select

from .names import FileNames
from .seam import Layout, Subscription
from .watcher import Change, Target, Watcher, WatchUnavailable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Callable, Optional


def watch_targets(layout: Layout, subscriptions: Iterable[Subscription]) -> list[Target]:
    """Every level's limit file, every parent directory (for the removal of a level), and the
    files each subscriber names for this layout (those that exist)."""
    if layout.version is None:
        return []
    limit_name = FileNames.for_version(layout.version).limit
    targets = []
    for index, lvl in enumerate(layout.levels):
        if lvl.hidden:
            continue  # no file of a hidden ancestor can be watched (tracker re-reads it)
        limit_path = os.path.join(lvl.directory, limit_name)
        if os.path.exists(limit_path):
            targets.append(Target(limit_path, "limit", index))
        if index > 0:
            # rmdir of a cgroup raises no event on its own files on some kernels (seen on
            # 6.18, v1), only IN_DELETE in the parent directory: watch parents for that.
            targets.append(Target(lvl.directory, "dir", index))
    for sub in subscriptions:
        if sub.files is None:
            continue
        try:
            paths = sub.files(layout)
        except Exception:  # noqa: BLE001 - a subscriber's list must not stop the watch
            paths = []
        # A file that does not exist (v2 memory.events at the root, or where the memory
        # controller is off) is not watched; it appears only with a re-resolve anyway.
        targets.extend(Target(path, "files", -1) for path in paths if os.path.exists(path))
    return targets


def level_removed(changes: Sequence[Change], layout: Layout) -> bool:
    """A "dir" watch sits on level i; only the removal of level i-1 (our path) matters
    there, not a sibling's."""
    lvls = layout.levels
    return any(c.target.kind == "dir" and 0 < c.target.level_index < len(lvls)
               and c.name == os.path.basename(lvls[c.target.level_index - 1].directory)
               for c in changes)


# Watchers whose watches were dropped at interpreter shutdown, kept from closing until the
# module itself is torn down (Tracker.release_at_exit).
_released: list[Watcher] = []


class LevelWatch:
    """The inotify instance of one monitor and the epoll that queries poll."""

    def __init__(self) -> None:
        self.watcher: Optional[Watcher] = None
        # epoll, not poll: a select.poll object refuses concurrent poll() calls (RuntimeError),
        # and queries from several threads check it at once. epoll_wait(0) is ~0.2 us.
        self._epoll: Optional[select.epoll] = None

    @property
    def active(self) -> bool:
        return self.watcher is not None

    def fileno(self) -> int:
        return self.watcher.fileno() if self.watcher is not None else -1

    @property
    def pending(self) -> Optional[Callable[[float], list[tuple[int, int]]]]:
        """epoll.poll: non-empty when inotify has changes queued (None when not watching)."""
        return self._epoll.poll if self._epoll is not None else None

    def start(self) -> None:
        """Create the instance and its epoll if missing; raises WatchUnavailable."""
        if self.watcher is not None:
            return
        watcher = Watcher()
        try:
            epoll = select.epoll(1)
            epoll.register(watcher.fileno(), select.EPOLLIN)
        except OSError as e:
            watcher.close()
            raise WatchUnavailable(f"cannot create an epoll descriptor: {e}") from e
        self.watcher, self._epoll = watcher, epoll

    def replace(self, targets: Sequence[Target]) -> None:
        """Watch exactly `targets` (raises TargetGone, WatchUnavailable)."""
        assert self.watcher is not None
        self.watcher.replace(targets)

    def read(self) -> tuple[list[Change], bool]:
        if self.watcher is None:
            return [], False
        return self.watcher.read()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
        # Not closed here: a query may still hold the snapshot whose `pending` is its poll();
        # it closes when the last such snapshot is dropped (and watches nothing meanwhile).
        self._epoll = None

    def release_at_exit(self) -> None:
        """Interpreter shutdown: drop the watches now and stop watching, but leave the
        descriptor open until the shutdown's end (`_released`; the kernel closes it at exit
        if nothing does before)."""
        if self.watcher is not None:
            self.watcher.drop_watches()
            _released.append(self.watcher)
            self.watcher = None
        self._epoll = None

    def forget_after_fork(self) -> None:
        """A fork child: the inotify instance and the epoll are the parent's; close our
        copies (the parent's stay open) and start afresh later."""
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
