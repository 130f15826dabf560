"""Read the cgroup tree from disk: resolve the process's directory and build its levels.

This is the I/O edge for cgroup files. A level is one directory on the path from the
process's memory cgroup up to the top of the visible hierarchy; each carries its hard limit
and, when it has one, descriptors kept open for the files the hot path re-reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from . import discovery, values
from .files import close_quietly, read_file, under_root
from .names import FileNames


class KeptFiles:
    """Open descriptors for a limited level's usage and memory.stat files.

    Closed when the last snapshot that references it is dropped (not when a newer snapshot is
    published), so a query still holding an older snapshot never reads a reused descriptor.
    """

    __slots__ = ("usage_fd", "stat_fd", "__weakref__")

    def __init__(self, directory: str, names: FileNames) -> None:
        self.usage_fd = -1
        self.stat_fd = -1
        self.usage_fd = os.open(os.path.join(directory, names.usage), os.O_RDONLY | os.O_CLOEXEC)
        self.stat_fd = os.open(os.path.join(directory, "memory.stat"), os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        close_quietly(self.usage_fd, self.stat_fd)
        self.usage_fd = self.stat_fd = -1

    def __del__(self) -> None:
        self.close()


@dataclass(frozen=True)
class Level:
    """One directory on the path; `limit` None means no hard limit at this level."""

    cgroup_path: str
    directory: str
    limit: Optional[int]
    problem: Optional[str] = None  # why the limit could not be read, if so
    kept: Optional[KeptFiles] = field(default=None, compare=False, repr=False)


def v2_has_memory(root: str) -> Callable[[str], bool]:
    """A check that a cgroup2 mount lists the memory controller (hybrid hosts do not)."""

    def check(mount_point: str) -> bool:
        try:
            text = read_file(os.path.join(under_root(root, mount_point), "cgroup.controllers"))
        except OSError:
            return False
        return "memory" in text.split()

    return check


def resolve_process(root: str) -> tuple[discovery.Resolution, str]:
    """Resolve the process's memory cgroup under `root`; also return the /proc/self/cgroup text
    so the caller can later tell whether the process moved."""
    try:
        proc_cgroup = read_file(under_root(root, "/proc/self/cgroup"))
    except OSError as e:
        return discovery.Unresolved(f"cannot read /proc/self/cgroup: {e.strerror or e}"), ""
    try:
        mountinfo = read_file(under_root(root, "/proc/self/mountinfo"))
    except OSError as e:
        return discovery.Unresolved(f"cannot read /proc/self/mountinfo: {e.strerror or e}"), \
            proc_cgroup
    return discovery.resolve(proc_cgroup, mountinfo, v2_has_memory(root)), proc_cgroup


def level_paths(resolved: discovery.Resolved) -> list[tuple[str, str]]:
    """(cgroup path, directory) from the process's cgroup up to the mount's top, leaf first."""
    pairs = []
    cgroup_path = resolved.cgroup_path.rstrip("/") or "/"
    directory = resolved.directory.rstrip("/") or "/"
    top = resolved.mount_point.rstrip("/") or "/"
    while True:
        pairs.append((cgroup_path, directory))
        if directory == top or directory == "/":
            return pairs
        directory = os.path.dirname(directory)
        cgroup_path = os.path.dirname(cgroup_path)


def _v1_parent_accounts_children(directory: str) -> bool:
    """v1 with use_hierarchy=0 (old kernels) does not charge children to the parent, so its
    limit does not bind them. Missing file: hierarchical (v2, or kernels that dropped it)."""
    try:
        return read_file(os.path.join(directory, "memory.use_hierarchy")).strip() != "0"
    except OSError:
        return True


def build_levels(
    root: str,
    resolved: discovery.Resolved,
    previous: tuple[Level, ...] = (),
) -> tuple[Level, ...]:
    """Read every level's limit and keep descriptors for the limited ones.

    Descriptors already open for a level in `previous` are reused, so a limit change does not
    reopen files. Raises OSError only if the process's own directory is gone.
    """
    names = FileNames.for_version(resolved.version)
    reuse = {lvl.directory: lvl.kept for lvl in previous if lvl.kept is not None}
    levels = []
    for index, (cgroup_path, shown_dir) in enumerate(level_paths(resolved)):
        directory = under_root(root, shown_dir)
        if index == 0 and not os.path.isdir(directory):
            raise FileNotFoundError(f"cgroup directory {directory} does not exist")
        if index > 0 and resolved.version == 1 and not _v1_parent_accounts_children(directory):
            break
        limit: Optional[int] = None
        problem: Optional[str] = None
        try:
            limit = values.parse_limit(read_file(os.path.join(directory, names.limit)),
                                       resolved.version)
        except FileNotFoundError:
            # v2: no memory.max where the memory controller is not enabled, and never at the
            # root. Such a level has no limit and no usage of its own to read.
            pass
        except (OSError, ValueError) as e:
            problem = f"{names.limit} at {cgroup_path}: {e}"
        kept = None
        if limit is not None:
            kept = reuse.get(directory)
            if kept is None:
                try:
                    kept = KeptFiles(directory, names)
                except OSError as e:
                    problem = f"cannot open usage files at {cgroup_path}: {e.strerror or e}"
        levels.append(Level(cgroup_path, directory, limit, problem, kept))
    return tuple(levels)
