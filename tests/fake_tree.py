"""A fake /proc + /sys tree in a temp dir, for parser and walk logic (not kernel behaviour)."""

from __future__ import annotations

import os
from typing import Optional

GiB = 1 << 30
MiB = 1 << 20
V1_UNLIMITED = 9223372036854771712


class FakeHost:
    """proc/self/{cgroup,mountinfo}, proc/meminfo and a memory hierarchy under `root`."""

    def __init__(self, root: str, version: int, cgroup_path: str = "/a/b/c",
                 mem_total: int = 64 * GiB, mem_available: int = 60 * GiB) -> None:
        self.root = root
        self.version = version
        self.mount_point = "/sys/fs/cgroup" if version == 2 else "/sys/fs/cgroup/memory"
        os.makedirs(os.path.join(root, "proc/self"), exist_ok=True)
        self.set_meminfo(mem_total, mem_available)
        self.move_to(cgroup_path)
        if version == 2:
            self.write(self.mount_point + "/cgroup.controllers", "cpu io memory pids\n")
            mount = f"35 24 0:30 / {self.mount_point} rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
        else:
            mount = (f"35 31 0:32 / {self.mount_point} rw,relatime - cgroup cgroup rw,memory\n"
                     "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
        self.write("/proc/self/mountinfo", "22 1 8:2 / / rw - ext4 /dev/sda2 rw\n" + mount)
        # The root level exists in every hierarchy.
        self.make_level("/", None)

    def path(self, absolute: str) -> str:
        return os.path.join(self.root, absolute.lstrip("/"))

    def write(self, absolute: str, text: str) -> None:
        path = self.path(absolute)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # On the existing inode, as the kernel's files behave, so inotify watches and kept
        # descriptors on it stay valid. Written over the old text and then cut to length, not
        # truncated first: a monitor thread reading between O_TRUNC and the write sees an empty
        # memory.stat and answers limit - usage, a torn state no kernel file shows (the likely
        # cause of one failure of the v1 headroom-alert test, whose 84 MiB would then be 74).
        # A shorter text can still show the old tail for the instant before the cut.
        data = text.encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def level_dir(self, cgroup_path: str) -> str:
        return self.mount_point + ("" if cgroup_path == "/" else cgroup_path)

    def move_to(self, cgroup_path: str) -> None:
        line = f"0::{cgroup_path}\n" if self.version == 2 else \
            f"4:memory:{cgroup_path}\n1:cpu:/\n0::/\n"
        self.write("/proc/self/cgroup", line)

    def set_meminfo(self, total: int, available: int) -> None:
        self.write("/proc/meminfo", f"MemTotal: {total // 1024} kB\nMemFree: "
                   f"{available // 2048} kB\nMemAvailable: {available // 1024} kB\n")

    def make_level(self, cgroup_path: str, limit: Optional[int], usage: int = 100 * MiB,
                   inactive: int = 10 * MiB) -> None:
        directory = self.level_dir(cgroup_path)
        os.makedirs(self.path(directory), exist_ok=True)
        if self.version == 2 and cgroup_path == "/":
            return  # the v2 root has no memory.max / memory.current
        self.set_limit(cgroup_path, limit)
        self.set_usage(cgroup_path, usage, inactive)

    def set_limit(self, cgroup_path: str, limit: Optional[int]) -> None:
        directory = self.level_dir(cgroup_path)
        if self.version == 2:
            self.write(directory + "/memory.max", "max\n" if limit is None else f"{limit}\n")
        else:
            value = V1_UNLIMITED if limit is None else limit
            self.write(directory + "/memory.limit_in_bytes", f"{value}\n")

    def set_usage(self, cgroup_path: str, usage: int, inactive: int) -> None:
        directory = self.level_dir(cgroup_path)
        if self.version == 2:
            self.write(directory + "/memory.current", f"{usage}\n")
            self.write(directory + "/memory.stat",
                       f"anon {usage - inactive}\nfile {inactive}\ninactive_file {inactive}\n")
        else:
            self.write(directory + "/memory.usage_in_bytes", f"{usage}\n")
            self.write(directory + "/memory.stat",
                       f"cache {inactive}\ninactive_file 1\ntotal_inactive_file {inactive}\n")

    def make_path(self, limits: dict[str, Optional[int]]) -> None:
        for cgroup_path, limit in limits.items():
            self.make_level(cgroup_path, limit)
