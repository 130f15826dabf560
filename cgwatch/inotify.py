"""Internal. The inotify side of the monitor: one inotify fd, a set of watches tagged with
their meaning.

Kept apart from the monitor so the failure cases (no inotify, ENOSPC when the watch limit is
reached, EMFILE when the instance limit is) become one exception carrying a readable reason.

The three system calls are bound here with ctypes, from the C library already loaded in the
process (`ctypes.CDLL(None)`), on the first Watcher: neither `os` nor `select` offers
inotify, and a binding package finds libc with `ctypes.util.find_library`, whose import
(subprocess, tempfile, shutil, ...) cost ~5 ms of `import cgwatch` and whose search runs
`ldconfig -p` in a subprocess. Events are parsed from the bytes one read(2) returns.
"""

from __future__ import annotations

import errno
import os
import struct
import time

from . import quota
from .frozen import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Callable, Optional

# <sys/inotify.h>: the kernel's values (include/uapi/linux/inotify.h), the same on every
# architecture. IN_CLOEXEC and IN_NONBLOCK are defined as O_CLOEXEC and O_NONBLOCK, which
# do differ between architectures: os has the right ones.
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_CLOSE_NOWRITE = 0x00000010
IN_OPEN = 0x00000020
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_MASK_ADD = 0x20000000
IN_ISDIR = 0x40000000
IN_CLOEXEC = os.O_CLOEXEC
IN_NONBLOCK = os.O_NONBLOCK

# struct inotify_event { int wd; uint32_t mask; uint32_t cookie; uint32_t len; char name[]; }
# `len` counts the name's bytes including its NUL padding (0 for an event on the watched
# file itself); the next event follows the padded name.
_EVENT_HEAD = struct.Struct("=iIII")
EVENT_HEAD_SIZE = _EVENT_HEAD.size  # 16

MASKS = {
    "limit": IN_MODIFY | IN_DELETE_SELF,
    "files": IN_MODIFY | IN_DELETE_SELF,  # a subscriber's (v2 memory.events)
    "dir": IN_DELETE | IN_DELETE_SELF | IN_ONLYDIR,
    # a checkpoint directory (cli/ckptwatch.py): no IN_MODIFY, one event per write(2)
    "saves": IN_CREATE | IN_OPEN | IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_MOVED_FROM
    | IN_MOVED_TO | IN_DELETE_SELF | IN_ONLYDIR,
}


class Target(Frozen):
    """What to watch and what it means to the monitor."""

    __slots__ = _fields = ("path", "kind", "level_index")
    path: str
    kind: str  # "limit", "dir", "files" (asked for by a subscriber) or "saves"
    level_index: int  # which level (0 = the process's own cgroup)

    def __init__(self, path: str, kind: str, level_index: int) -> None:
        fill(self, locals())


class WatchEvent(Frozen):
    """An event on a target: its inotify mask, and the name of the child it concerns ("" for
    the target itself)."""

    __slots__ = _fields = ("target", "mask", "name")
    target: Target
    mask: int
    name: str

    def __init__(self, target: Target, mask: int, name: str) -> None:
        fill(self, locals())


class WatchUnavailable(Exception):
    """inotify cannot serve this monitor; str(self) says why."""


class QuotaRefused(WatchUnavailable):
    """No instance taken: the uid has too few left for its other programs (quota.py)."""


class QuotaBusy(QuotaRefused):
    """No instance taken yet: another process of the uid is deciding (quota.take_counted)."""


class TargetGone(Exception):
    """A path to watch vanished between resolving and watching (a cgroup was just removed)."""


def _describe(err: OSError, what: str) -> str:
    if err.errno == errno.ENOSPC:
        return f"inotify watch limit reached ({what}; see fs.inotify.max_user_watches)"
    if err.errno == errno.EMFILE:
        return f"inotify instance limit reached ({what}; see fs.inotify.max_user_instances)"
    return f"inotify failed ({what}): {err.strerror or err}"


# ---- the binding ------------------------------------------------------------------------------


class Libc:
    """inotify_init1, inotify_add_watch and inotify_rm_watch of the process's C library, and
    how to read the errno ctypes saved after each call (each raises AttributeError where the
    C library has no such function)."""

    def __init__(self) -> None:
        import ctypes  # here, not at import: a monitor that polls never needs it

        c = ctypes.CDLL(None, use_errno=True)  # the symbols already in this process
        init1, add, rm = c.inotify_init1, c.inotify_add_watch, c.inotify_rm_watch
        init1.argtypes = (ctypes.c_int,)
        add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        rm.argtypes = (ctypes.c_int, ctypes.c_int)
        for function in (init1, add, rm):
            function.restype = ctypes.c_int
        self.init1: Callable[[int], int] = init1
        self.add_watch: Callable[[int, bytes, int], int] = add
        self.rm_watch: Callable[[int, int], int] = rm
        self.get_errno: Callable[[], int] = ctypes.get_errno


_libc: Optional[Libc] = None


def libc() -> Libc:
    """The binding, made on first use (raises OSError, AttributeError or ImportError where
    the process has no C library with inotify, or no ctypes)."""
    global _libc
    bound = _libc
    if bound is None:
        bound = _libc = Libc()
    return bound


def _call(function: Callable[..., int], *args: Any) -> int:
    """The C function's result; OSError with its errno when it returns -1 (EINTR: again)."""
    while True:
        result = function(*args)
        if result != -1:
            return result
        err = libc().get_errno()
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err))


def inotify_init() -> int:
    """A new inotify descriptor, non-blocking and close-on-exec (raises OSError)."""
    return _call(libc().init1, IN_CLOEXEC | IN_NONBLOCK)


def add_watch(fd: int, path: str, mask: int) -> int:
    """Watch `path` on `fd` for `mask`; the watch descriptor (raises OSError: ENOENT, ENOTDIR
    for IN_ONLYDIR on a file, ENOSPC at the watch limit, ...)."""
    return _call(libc().add_watch, fd, os.fsencode(path), mask)


def rm_watch(fd: int, wd: int) -> None:
    """Drop a watch (raises OSError: EINVAL when the kernel already dropped it)."""
    _call(libc().rm_watch, fd, wd)


def parse_events(data: bytes) -> list[tuple[int, int, int, str]]:
    """(wd, mask, cookie, name) of each `struct inotify_event` in what read(2) returned; the
    name without its NUL padding ("" for an event on the watched path itself). A truncated
    tail (the kernel never returns one) is ignored."""
    events = []
    pos = 0
    end = len(data)
    unpack = _EVENT_HEAD.unpack_from
    while pos + EVENT_HEAD_SIZE <= end:
        wd, mask, cookie, size = unpack(data, pos)
        pos += EVENT_HEAD_SIZE
        if pos + size > end:
            break
        name = data[pos:pos + size].split(b"\0", 1)[0] if size else b""
        pos += size
        events.append((wd, mask, cookie, os.fsdecode(name)))
    return events


# ---- the watcher ------------------------------------------------------------------------------


class Watcher:
    """An inotify instance shared by owners (the monitors of a process, each a token), whose
    watch sets are replaced each as a whole. A path two owners watch is one kernel watch:
    inotify gives the same inode the same descriptor on one instance, so the watch is
    counted per owner and removed when its last owner lets go."""

    def __init__(self, limit: Optional[int] = None) -> None:
        """A new instance; with `limit` (the uid's max_user_instances) only if the uid keeps
        quota.reserve(limit) more after it (else QuotaRefused)."""
        self._fd = -1
        self._owned: dict[int, dict[int, list[Target]]] = {}  # owner -> wd -> its targets
        self._owners: dict[int, set[int]] = {}  # wd -> owners
        try:
            libc()
        except OSError as e:
            # Loading ctypes opens files: a process out of descriptors (EMFILE) fails here
            # before any inotify call; the caller retries.
            raise WatchUnavailable(f"inotify failed (loading ctypes): {e.strerror or e}") from e
        except (ImportError, AttributeError) as e:
            raise WatchUnavailable(f"inotify is not available on this platform ({e})") from e
        try:
            # Non-blocking: read() is one os.read(2), after poll(2) said the fd is readable.
            if limit is None:
                self._fd = inotify_init()
            else:
                self._fd, found = quota.take_counted(inotify_init, limit, time.monotonic(),
                                                     os.environ)
        except quota.ProbeBusy as e:
            raise QuotaBusy("another process of the uid is taking an inotify instance "
                            "(trying again shortly)") from e
        except OSError as e:
            raise WatchUnavailable(_describe(e, "creating an instance")) from e
        if self._fd < 0:
            raise QuotaRefused(
                f"leaving the uid's last inotify instances to other programs (only {found} "
                f"left; cgwatch takes one when {quota.reserve(limit or 0)} more "
                f"remain of fs.inotify.max_user_instances={limit})")

    def fileno(self) -> int:
        return self._fd

    @property
    def watches(self) -> int:
        """Kernel watches held (each counts against fs.inotify.max_user_watches)."""
        return len(self._owners)

    def watches_of(self, owner: int) -> int:
        return len(self._owned.get(owner, ()))

    def owners(self) -> int:
        return len(self._owned)

    def replace(self, targets: Sequence[Target], owner: int = 0) -> None:
        """Watch exactly `targets` for `owner`. New watches are added before old ones are
        dropped, so a path watched before and after is never unwatched in between (re-adding
        an inode returns its descriptor; IN_MASK_ADD keeps what other owners asked for)."""
        new: dict[int, list[Target]] = {}
        old = self._owned.get(owner, {})
        for target in targets:
            try:
                wd = add_watch(self._fd, target.path, MASKS[target.kind] | IN_MASK_ADD)
            except OSError as e:
                merged = dict(old)
                for wd, found in new.items():
                    merged[wd] = merged.get(wd, []) + found
                self._owned[owner] = merged
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise TargetGone(target.path) from e
                raise WatchUnavailable(_describe(e, f"watching {target.path}")) from e
            new.setdefault(wd, []).append(target)
            self._owners.setdefault(wd, set()).add(owner)
        self._owned[owner] = new
        for wd in set(old) - set(new):
            self._let_go(owner, wd)

    def _let_go(self, owner: int, wd: int) -> None:
        owners = self._owners.get(wd)
        if owners is None:
            return
        owners.discard(owner)
        if not owners:
            del self._owners[wd]
            try:
                rm_watch(self._fd, wd)
            except OSError:
                pass  # already gone with its file: the kernel removed it (IN_IGNORED)

    def drop(self, owner: int = 0) -> None:
        """Remove `owner`'s watches (those no other owner holds leave the kernel); events of
        them are ignored from now on."""
        for wd in self._owned.pop(owner, {}):
            self._let_go(owner, wd)

    def read_all(self) -> dict[int, tuple[list[WatchEvent], bool]]:
        """Pending changes of each owner that has some, and whether its watch set must be
        rebuilt (a watch vanished or the event queue overflowed: something may be missed)."""
        found: dict[int, tuple[list[WatchEvent], bool]] = {}
        # One read(2), no ioctl(FIONREAD) first: every syscall on the monitor thread lets the
        # GIL go, and a busy Python thread may keep it for a whole switch interval (5 ms)
        # before the monitor gets it back. What does not fit in the buffer stays queued and
        # makes the fd readable again.
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            data = b""
        for wd, mask, _, name in parse_events(data):
            if mask & IN_Q_OVERFLOW:
                for owner in self._owned:
                    found[owner] = (found.get(owner, ([], False))[0], True)
                continue
            for owner in list(self._owners.get(wd, ())):
                targets = self._owned.get(owner, {}).get(wd, [])
                changes, rebuild = found.get(owner, ([], False))
                changes.extend(WatchEvent(target, mask, name) for target in targets)
                found[owner] = (changes, rebuild or bool(mask & (IN_IGNORED | IN_DELETE_SELF)))
            if mask & IN_IGNORED:
                # The kernel dropped the watch; its number may be handed out again.
                for owner in self._owners.pop(wd, ()):
                    self._owned.get(owner, {}).pop(wd, None)
        return found

    def read(self, owner: int = 0) -> tuple[list[WatchEvent], bool]:
        """Pending changes of `owner` (those of other owners are read and dropped: for a
        watcher with one owner)."""
        return self.read_all().get(owner, ([], False))

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        # A monitor never closed (the default one at exit): close the descriptor quietly.
        if getattr(self, "_fd", -1) >= 0:
            self.close()
