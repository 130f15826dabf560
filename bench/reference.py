"""The uncached walk: what a simple cgroup-aware fix does on every call.

Each call re-reads /proc/self/cgroup and /proc/self/mountinfo, resolves the process's memory
cgroup directory, walks up to the top of the mount reading every level's files, and reads
/proc/meminfo for the host figures. Written independently of cgwatch (no shared code), so the
bench can also use it as an oracle: cgwatch's total_memory() must equal `total_memory()` here.

It is deliberately plain but not wasteful: plain open()/read(), one dict per file, and
/proc/meminfo rather than psutil for the host figures (cheaper than psutil, so the comparison
flatters the walk, not cgwatch).
"""

from __future__ import annotations

import functools
import os
import select
from typing import Callable, Optional

V1_UNLIMITED = 1 << 62  # v1 writes "no limit" as ~2^63 rounded to the page size


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _unescape(field: str) -> str:
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _contains(root: str, path: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def resolve() -> tuple[int, str, str]:
    """(cgroup version, the process's directory, the mount point at the top of the walk)."""
    v1_path = v2_path = None
    for line in _read("/proc/self/cgroup").splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid != "0" and "memory" in controllers.split(","):
            v1_path = path
        elif hid == "0" and controllers == "":
            v2_path = path
    best: Optional[tuple[int, str, str, str]] = None  # (version, root, mount point, path)
    for line in _read("/proc/self/mountinfo").splitlines():
        fields = line.split(" ")
        sep = fields.index("-", 6)
        fstype, options = fields[sep + 1], fields[sep + 3].split(",")
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup" and "memory" in options and v1_path is not None:
            version, path = 1, v1_path
        elif fstype == "cgroup2" and v2_path is not None and v1_path is None:
            if "memory" not in _read(os.path.join(point, "cgroup.controllers")).split():
                continue
            version, path = 2, v2_path
        else:
            continue
        if _contains(root, path) and (best is None or len(root) < len(best[1])):
            best = (version, root, point, path)
    if best is None:
        raise RuntimeError("no memory cgroup mount found")
    version, root, point, path = best
    rest = path[len(root):] if root != "/" else path
    return version, os.path.join(point, rest.lstrip("/")).rstrip("/"), point.rstrip("/")


def _levels(leaf: str, top: str) -> list[str]:
    dirs = [leaf]
    while dirs[-1] != top and dirs[-1] != "/":
        dirs.append(os.path.dirname(dirs[-1]))
    return dirs


def level_count(leaf: str, top: str) -> int:
    """How many directories the walk reads, the process's own included."""
    return len(_levels(leaf, top))


def _limit(directory: str, version: int) -> Optional[int]:
    name = "memory.max" if version == 2 else "memory.limit_in_bytes"
    try:
        text = _read(os.path.join(directory, name)).strip()
    except FileNotFoundError:
        return None  # v2 root, or a level without the memory controller
    if text == "max":
        return None
    value = int(text)
    return None if version == 1 and value >= V1_UNLIMITED else value


def _meminfo() -> dict[str, int]:
    result = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        result[key] = int(rest.split()[0]) * 1024
    return result


def total_memory() -> int:
    """min(MemTotal, every limit on the path), resolved and read afresh."""
    version, leaf, top = resolve()
    limits = [_limit(d, version) for d in _levels(leaf, top)]
    return min([_meminfo()["MemTotal"]] + [x for x in limits if x is not None])


def available_memory() -> int:
    """min(MemAvailable, limit - (usage - inactive_file) at each limited level), afresh."""
    version, leaf, top = resolve()
    usage_name = "memory.current" if version == 2 else "memory.usage_in_bytes"
    inactive_key = "inactive_file" if version == 2 else "total_inactive_file"
    best = _meminfo()["MemAvailable"]
    for directory in _levels(leaf, top):
        limit = _limit(directory, version)
        if limit is None:
            continue
        usage = int(_read(os.path.join(directory, usage_name)))
        stat = dict(line.split(" ", 1) for line in
                    _read(os.path.join(directory, "memory.stat")).splitlines())
        working_set = max(0, usage - int(stat[inactive_key]))
        best = min(best, limit - working_set)
    return max(0, best)


class KeptReads:
    """The floor under any kept-descriptor available_memory(): only its syscalls, no logic.

    pread of usage and memory.stat at every limited level, then sysinfo(2) (what cgwatch's
    host bound costs), or /proc/meminfo when no level is limited. What cgwatch costs above this
    is Python; what this costs is the kernel's.
    """

    def __init__(self) -> None:
        version, leaf, top = resolve()
        usage_name = "memory.current" if version == 2 else "memory.usage_in_bytes"
        self.fds: list[tuple[int, int]] = []
        for directory in _levels(leaf, top):
            if _limit(directory, version) is not None:
                self.fds.append((os.open(os.path.join(directory, usage_name), os.O_RDONLY),
                                 os.open(os.path.join(directory, "memory.stat"), os.O_RDONLY)))
        self.meminfo = os.open("/proc/meminfo", os.O_RDONLY)

    def __call__(self) -> None:
        pread = os.pread
        for usage_fd, stat_fd in self.fds:
            pread(usage_fd, 64, 0)
            pread(stat_fd, 16384, 0)
        if self.fds:
            os.sysconf("SC_AVPHYS_PAGES")
        else:
            pread(self.meminfo, 16384, 0)

    def close(self) -> None:
        for usage_fd, stat_fd in self.fds:
            os.close(usage_fd)
            os.close(stat_fd)
        os.close(self.meminfo)


class FreshnessFloors:
    """The floors under the two checks a fresh query makes, as bare syscalls, no cgwatch:

    - `pending`: epoll_wait(0) on an epoll holding one idle inotify descriptor (what
      read-your-writes costs when nothing is queued: the check every default query makes);
    - `confirm`: pread(2) of /proc/self/cgroup through a descriptor kept open (what the
      confirm_interval slow path cannot avoid: the kernel formats that file on every read).

    Each is a functools.partial over the C function, so no Python frame is timed.
    """

    def __init__(self) -> None:
        import inotify_simple

        _, leaf, _ = resolve()
        self.inotify = inotify_simple.INotify(nonblocking=True)
        # Watched for removals only, which nothing does while calls are timed: always idle.
        self.inotify.add_watch(leaf, inotify_simple.flags.DELETE | inotify_simple.flags.CREATE)
        self.epoll = select.epoll(1)
        self.epoll.register(self.inotify.fileno(), select.EPOLLIN)
        self.proc_fd = os.open("/proc/self/cgroup", os.O_RDONLY | os.O_CLOEXEC)
        self.pending: Callable[[], object] = functools.partial(self.epoll.poll, 0)
        self.confirm: Callable[[], object] = functools.partial(os.pread, self.proc_fd, 65536, 0)

    def close(self) -> None:
        self.epoll.close()
        self.inotify.close()
        os.close(self.proc_fd)
