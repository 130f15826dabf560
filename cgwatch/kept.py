"""Internal. Descriptors kept open on the files of one directory (a cgroup's, or /proc's),
one owner per directory for the whole process.

The monitor, the events layer and the exporter all read the same cgroup files; `kept_dir()`
hands every one of them the same `KeptDir`, which opens each file once, on first use, and
closes them all when its last user drops it (garbage collection of the object, never an
explicit close by one user while another may still be reading: a closed descriptor number can
be reused by an unrelated open, and a pread on it would read the wrong file).

A cgroup removed and re-created under the same path is a new directory (kernfs gives it a new
inode) and its old descriptors answer ENODEV: `kept_dir()` compares the inode and hands out a
fresh KeptDir then. /proc/self files opened before a fork describe the parent, so a fork child
forgets the registry (`after_fork_in_child`).
"""

from __future__ import annotations

import os
import threading
import weakref

from .files import KEPT_READ_LIMIT, close_quietly, open_regular, read_fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional


class KeptDir:
    """Open descriptors on files of `directory`, opened on first use."""

    __slots__ = ("directory", "identity", "_fds", "__weakref__")

    def __init__(self, directory: str, identity: Optional[tuple[int, int]]) -> None:
        self.directory = directory
        self.identity = identity  # (st_dev, st_ino) when made
        self._fds: dict[str, int] = {}

    def fd(self, name: str) -> int:
        """The descriptor of `name` in this directory; raises OSError if it cannot be opened or
        is not a regular file (checked once, here: the hot path preads it unchecked)."""
        fd = self._fds.get(name)
        if fd is None:
            with _lock:
                fd = self._fds.get(name)
                if fd is None:
                    fd = open_regular(os.path.join(self.directory, name))
                    self._fds[name] = fd
        return fd

    def read(self, name: str) -> bytes:
        """The whole file, through its kept descriptor (OSError past KEPT_READ_LIMIT)."""
        return read_fd(self.fd(name), KEPT_READ_LIMIT, os.path.join(self.directory, name))

    def pread(self, name: str, size: int) -> bytes:
        return os.pread(self.fd(name), size, 0)

    def has(self, name: str) -> bool:
        return name in self._fds

    def open_count(self) -> int:
        return len(self._fds)

    def __del__(self) -> None:
        fds = getattr(self, "_fds", None)
        if fds:
            close_quietly(*fds.values())
            fds.clear()

    def __repr__(self) -> str:
        return f"KeptDir({self.directory!r}, {sorted(self._fds)})"


_lock = threading.Lock()
_dirs: weakref.WeakValueDictionary[str, KeptDir] = weakref.WeakValueDictionary()


def _identity(directory: str) -> Optional[tuple[int, int]]:
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def kept_dir(directory: str, check: bool = True) -> KeptDir:
    """The process's KeptDir for `directory`; a new one if the directory was re-created since
    (`check=False` skips that stat, for directories that are never re-created, like /proc)."""
    identity = _identity(directory) if check else None
    with _lock:
        found = _dirs.get(directory)
        if found is not None and (not check or found.identity == identity):
            return found
        made = KeptDir(directory, identity)
        _dirs[directory] = made
        return made


def open_descriptors() -> int:
    """How many descriptors the registry's live directories hold (for tests and status)."""
    with _lock:
        return sum(d.open_count() for d in list(_dirs.values()))


def after_fork_in_child() -> None:
    """Forget every KeptDir: objects still referenced by a forked copy keep their (inherited)
    descriptors until that copy drops them; new lookups open the child's own."""
    global _lock
    _lock = threading.Lock()
    _dirs.clear()
