"""Internal. /dev/shm's size and use (statvfs), for the table, `cgwatch watch` and `cgwatch run`.

/dev/shm is a tmpfs with its own size: Docker's default is 64 MiB whatever `--memory` says.
POSIX shared memory (PyTorch DataLoader workers pass batches through it) lives there, and a
process that touches a page of a mapped /dev/shm file when the tmpfs is full gets SIGBUS
("Bus error"), not ENOSPC and not the OOM killer. Its pages are also charged to the memory
cgroup of the process that first touched them (shmem in memory.stat).
"""

from __future__ import annotations

import os

from .files import under_root
from .frozen import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

SHM_PATH = "/dev/shm"


class ShmUsage(Frozen):
    """One statvfs of /dev/shm, in bytes (`available`: what an unprivileged writer may still
    use, f_bavail; tmpfs reserves nothing for root, so it is size - used there)."""

    _fields = ("path", "size", "used", "available")
    path: str
    size: int
    used: int
    available: int

    def __init__(self, path: str, size: int, used: int, available: int) -> None:
        fill(self, locals())

    @property
    def percent_used(self) -> float:
        return 100.0 * self.used / self.size if self.size else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "used": self.used,
                "available": self.available, "percent_used": round(self.percent_used, 1)}


def shm_usage(root: str = "/") -> Optional[ShmUsage]:
    """/dev/shm under `root` (a fake tree's in tests) now; None when there is none (not
    mounted, or not a directory) or statvfs fails. Never raises."""
    path = under_root(root, SHM_PATH)
    try:
        st = os.statvfs(path)
    except (OSError, ValueError):
        return None
    size = st.f_blocks * st.f_frsize
    if size <= 0:
        return None
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return ShmUsage(path, size, used, st.f_bavail * st.f_frsize)


def shm_limits(usage: Optional[ShmUsage], available_memory: int) -> bool:
    """Whether /dev/shm is worth showing: smaller than the memory the process may still use,
    so shared memory runs out before the memory does."""
    return usage is not None and usage.size < available_memory
