"""Internal. Generic file helpers for kernel files: whole reads through kept descriptors,
quiet closes, and paths under a (possibly fake) root. Nothing here knows about cgroups."""

from __future__ import annotations

import os

# Big enough for memory.stat on current kernels in one read; read_fd loops if it ever is not.
READ_SIZE = 16384
READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC


def read_fd(fd: int) -> bytes:
    """The whole content of a kernfs/procfs file through a kept descriptor, from offset 0."""
    data = os.pread(fd, READ_SIZE, 0)
    if len(data) < READ_SIZE:
        return data
    chunks = [data]
    offset = READ_SIZE
    while True:
        chunk = os.pread(fd, READ_SIZE, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def close_quietly(*fds: int) -> None:
    """Close descriptors that may already be gone (-1 is skipped); never raises."""
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def read_file(path: str) -> str:
    """A whole small file as text (open, read, close: for files read once or rarely)."""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def under_root(root: str, path: str) -> str:
    """`path` (absolute, as the kernel names it) inside the tree rooted at `root`."""
    if root in ("", "/"):
        return path
    return os.path.join(root, path.lstrip("/"))
