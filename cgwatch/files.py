"""Internal. Generic file helpers for kernel files: checked non-blocking opens, bounded whole
reads (through kept descriptors or open-read-close), quiet closes, and paths under a (possibly
fake) root. Nothing here knows about cgroups."""

from __future__ import annotations

import errno
import os
import stat

# Big enough for memory.stat on current kernels in one read (~1.5 KiB on 6.1 v2, ~1 KiB on
# 6.18 v1; under 8 KiB with every counter newer kernels add); read_fd loops if it ever is not.
READ_SIZE = 16384
# O_NONBLOCK: a FIFO put in place of a kernel file (possible under a fake or `--root` tree)
# would otherwise block open() until a writer appears. kernfs and procfs files ignore it.
READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK

# The bounds of a whole read. cgroup and /proc files are small: through a kept descriptor we
# read memory.stat (< 8 KiB), meminfo (~1.5 KiB), limits, counters and memory.events (< 200
# B), so 64 KiB is 8x the largest. read_file also reads /proc/self/mountinfo (~150 B a
# mount: 4 MiB is ~28000 mounts, more than busy Kubernetes nodes show) once per resolve.
# Past the bound the read fails with EFBIG instead of taking seconds and gigabytes.
KEPT_READ_LIMIT = 64 * 1024
FILE_READ_LIMIT = 4 * 1024 * 1024


def _too_large(limit: int, name: str = "") -> OSError:
    message = f"larger than {limit // 1024} KiB, not a kernel file"
    return OSError(errno.EFBIG, message, name) if name else OSError(errno.EFBIG, message)


def open_regular(path: str) -> int:
    """A read descriptor on `path`, opened without blocking; raises OSError unless it is a
    regular file (cgroupfs/kernfs and procfs files are: a FIFO, a directory or a device in
    their place is not something the kernel made)."""
    fd = os.open(path, READ_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "a directory, not a file", path)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise OSError(errno.EINVAL, f"{kind}, not a kernel file", path)
    return fd


def read_fd(fd: int, limit: int = KEPT_READ_LIMIT, name: str = "") -> bytes:
    """The whole content of a kernfs/procfs file through a kept descriptor, from offset 0;
    OSError(EFBIG) past `limit` bytes (naming `name`, the file, if given)."""
    data = os.pread(fd, READ_SIZE, 0)
    if len(data) < READ_SIZE:
        return data
    chunks = [data]
    offset = READ_SIZE
    while True:
        if offset > limit:
            raise _too_large(limit, name)
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


def read_file(path: str, limit: int = FILE_READ_LIMIT) -> str:
    """A whole small file as text (open, read, close: for files read once or rarely); raises
    OSError for what is not a regular file and, with EFBIG, past `limit` bytes."""
    fd = open_regular(path)
    try:
        chunks = []
        size = 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise _too_large(limit, path)
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def under_root(root: str, path: str) -> str:
    """`path` (absolute, as the kernel names it) inside the tree rooted at `root`."""
    if root in ("", "/"):
        return path
    return os.path.join(root, path.lstrip("/"))
