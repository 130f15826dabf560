"""Internal. The inotify side of the monitor: one inotify fd, a set of watches tagged with
their meaning.

Kept apart from the monitor so the failure cases (no inotify, ENOSPC when the watch limit is
reached, EMFILE when the instance limit is) become one exception carrying a readable reason.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

try:
    import inotify_simple
except ImportError:  # pragma: no cover - the dependency is declared; this is non-Linux safety
    inotify_simple = None


class Target(NamedTuple):
    """What to watch and what it means to the monitor."""

    path: str
    kind: str  # "limit", "dir" or "files" (asked for by a subscriber)
    level_index: int  # which level (0 = the process's own cgroup)


class Change(NamedTuple):
    target: Target
    mask: int
    name: str


class WatchUnavailable(Exception):
    """inotify cannot serve this monitor; str(self) says why."""


class TargetGone(Exception):
    """A path to watch vanished between resolving and watching (a cgroup was just removed)."""


def _describe(err: OSError, what: str) -> str:
    if err.errno == errno.ENOSPC:
        return f"inotify watch limit reached ({what}; see fs.inotify.max_user_watches)"
    if err.errno == errno.EMFILE:
        return f"inotify instance limit reached ({what}; see fs.inotify.max_user_instances)"
    return f"inotify failed ({what}): {err.strerror or err}"


if inotify_simple is not None:
    FLAGS: Any = inotify_simple.flags
    MASKS = {
        "limit": FLAGS.MODIFY | FLAGS.DELETE_SELF,
        "files": FLAGS.MODIFY | FLAGS.DELETE_SELF,  # a subscriber's (v2 memory.events)
        "dir": FLAGS.DELETE | FLAGS.DELETE_SELF | FLAGS.ONLYDIR,
    }


class Watcher:
    """An inotify instance whose watch set can be replaced as a whole."""

    def __init__(self) -> None:
        if inotify_simple is None:
            raise WatchUnavailable("inotify is not available on this platform")
        if getattr(inotify_simple, "_libc", 0) is None:
            # inotify_simple finds libc with ctypes.util.find_library("c"), which runs
            # `ldconfig -p` in a subprocess (~1.5 ms, and a fork+exec from inside a library) on
            # the first INotify(). The C library's symbols are already in this process.
            inotify_simple._libc = ctypes.CDLL(None, use_errno=True)
        try:
            self._inotify = inotify_simple.INotify()
            # Non-blocking: read() is one os.read(2), after poll(2) said the fd is readable.
            os.set_blocking(self._inotify.fileno(), False)
        except OSError as e:
            raise WatchUnavailable(_describe(e, "creating an instance")) from e
        self._targets: dict[int, Target] = {}

    def fileno(self) -> int:
        return int(self._inotify.fileno())

    def replace(self, targets: Sequence[Target]) -> None:
        """Watch exactly `targets`. New watches are added before old ones are dropped, so a
        path watched before and after is never unwatched in between (inotify gives the same
        inode the same descriptor, so re-adding it is free)."""
        new: dict[int, Target] = {}
        for target in targets:
            try:
                wd = self._inotify.add_watch(target.path, MASKS[target.kind])
            except OSError as e:
                self._targets.update(new)
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise TargetGone(target.path) from e
                raise WatchUnavailable(_describe(e, f"watching {target.path}")) from e
            new[wd] = target
        for wd in set(self._targets) - set(new):
            try:
                self._inotify.rm_watch(wd)
            except OSError:
                pass  # already gone with its file: the kernel removed it (IN_IGNORED)
        self._targets = new

    def read(self) -> tuple[list[Change], bool]:
        """Pending changes, and whether the watch set must be rebuilt (a watch vanished or the
        event queue overflowed, so something may have been missed)."""
        changes = []
        rebuild = False
        # One read(2) (inotify_simple's read() adds an ioctl(FIONREAD)): every syscall on the
        # monitor thread lets the GIL go, and a busy Python thread may keep it for a whole
        # switch interval (5 ms) before the monitor gets it back. What does not fit in the
        # buffer stays queued and makes the fd readable again.
        try:
            data = os.read(self._inotify.fileno(), 65536)
        except BlockingIOError:
            data = b""
        for event in inotify_simple.parse_events(data):
            if event.mask & FLAGS.Q_OVERFLOW:
                rebuild = True
                continue
            target = self._targets.get(event.wd)
            if target is None:
                continue  # a watch from before the last replace()
            if event.mask & (FLAGS.IGNORED | FLAGS.DELETE_SELF):
                rebuild = True
            changes.append(Change(target, event.mask, event.name))
        return changes, rebuild

    def close(self) -> None:
        try:
            self._inotify.close()
        except OSError:
            pass

    def __del__(self) -> None:
        # A monitor never closed (the default one at exit): close quietly, not with a
        # ResourceWarning from the file object's own finaliser.
        inotify = getattr(self, "_inotify", None)
        if inotify is not None:
            self.close()

