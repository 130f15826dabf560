"""Real cgroups for the bench, made below its own memory cgroup, and moving itself into them.

Built on tests/cgroup_helpers.py (Tree makes directories and writes limits). The bench moves
its whole process into the deepest cgroup (its pid into cgroup.procs) and back before anything
is removed; removal refuses to run while this process is still inside, because the helpers'
clean-up kills every member of a cgroup it removes.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from tests import cgroup_helpers

GiB = 1 << 30


@dataclass(frozen=True)
class Nest:
    """A chain of cgroups we made: `dirs[0]` is the top one, `dirs[-1]` the deepest."""

    version: int
    dirs: tuple[str, ...]
    own: str  # the directory this process started in

    @property
    def leaf(self) -> str:
        return self.dirs[-1]

    def limit_path(self, directory: str) -> str:
        return os.path.join(directory, cgroup_helpers.limit_file(self.version))


def unavailable_reason() -> str:
    """Empty when the bench can make cgroups here; else why the cgroup sections are skipped."""
    return cgroup_helpers.writable_reason()


def _member_of(directory: str) -> bool:
    procs = cgroup_helpers.read(os.path.join(directory, "cgroup.procs")).split()
    return str(os.getpid()) in procs


def move_self(directory: str) -> None:
    """Move this whole process (every thread) into `directory`."""
    cgroup_helpers.write(os.path.join(directory, "cgroup.procs"), str(os.getpid()))
    if not _member_of(directory):
        raise RuntimeError(f"moving into {directory} did not take")


@contextmanager
def nest(depth: int, limited: str, limit: int = 4 * GiB) -> Iterator[Nest]:
    """`depth` nested cgroups below our own; limited = "leaf" (only the deepest has `limit`),
    "all" (every level limited, the deepest tightest) or "none"."""
    res, why = cgroup_helpers.own_memory_cgroup()
    if res is None:
        raise RuntimeError(why)
    cgroup_helpers.enable_memory_for_children(res.directory, res.version)  # v2 root (the VM)
    tree = cgroup_helpers.Tree(res.directory, res.version)
    path = f"cgwatch-bench-{uuid.uuid4().hex[:8]}"
    dirs = []
    try:
        for i in range(depth):
            own_limit: Optional[int] = None
            if limited == "all" or (limited == "leaf" and i == depth - 1):
                own_limit = limit + (depth - 1 - i) * (1 << 20)
            dirs.append(tree.make(path, own_limit))
            path = os.path.join(path, f"l{i + 2}")
        yield Nest(res.version, tuple(dirs), res.directory)
    finally:
        if _member_of_any(tree.made):
            raise RuntimeError("still inside a bench cgroup: not removing them (would kill us)")
        tree.remove_all()


def _member_of_any(dirs: list[str]) -> bool:
    for directory in dirs:
        try:
            if _member_of(directory):
                return True
        except OSError:
            pass
    return False


@contextmanager
def inside(n: Nest) -> Iterator[None]:
    """Run the block with this process in the deepest cgroup of `n`, then move back."""
    if n.version == 2:
        # v2: a cgroup that hands controllers to children may not hold processes.
        try:
            cgroup_helpers.write(os.path.join(n.leaf, "cgroup.subtree_control"), "-memory")
        except OSError:
            pass
    move_self(n.leaf)
    try:
        yield
    finally:
        move_self(n.own)
