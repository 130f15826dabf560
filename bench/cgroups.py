"""Real cgroups for the bench and the tests, made below this process's own memory cgroup and
removed afterwards (processes killed first), also on failure; and the bench moving itself
into them.

Only this process's own subtree is touched: every directory is created below the memory
cgroup that /proc/self/cgroup names. Works for v1 and v2 (the VM tier). `Tree` makes
directories, writes limits, starts processes inside and removes it all; `cgroup_tree()` is a
fresh one. tests/py builds the tests' helpers (pytest marks, probes) on these:
the bench imports nothing from tests/.

The bench moves its whole process into the deepest cgroup of a `nest()` (its pid into
cgroup.procs) and back before anything is removed; removal refuses to run while this process
is still inside, because `Tree.remove_all()` kills every member of a cgroup it removes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from cgwatch import discovery
from cgwatch import tree as cgtree

MiB = 1 << 20
GiB = 1 << 30
PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def own_memory_cgroup() -> tuple[Optional[discovery.Resolved], str]:
    """The resolved memory cgroup of this process, or None and why it cannot be used."""
    resolution, _ = cgtree.resolve_process("/")
    if not isinstance(resolution, discovery.Resolved):
        return None, resolution.reason
    return resolution, ""


def writable_reason() -> str:
    """Empty if tests can create memory cgroups under our own; else why not (the skip reason)."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if os.geteuid() != 0:
        return "not root: cannot create cgroups"
    res, why = own_memory_cgroup()
    if res is None:
        return f"no memory cgroup: {why}"
    probe = os.path.join(res.directory, f"cgwatch-probe-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as e:
        return f"cannot create a cgroup under {res.directory}: {e}"
    return ""


def limit_file(version: int) -> str:
    return "memory.max" if version == 2 else "memory.limit_in_bytes"


def write(path: str, value: str) -> None:
    """One write(2), as a runtime or kubelet does it (no truncate-then-write)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class Tree:
    """Cgroups made below a base directory; `remove_all()` kills their processes and rmdirs."""

    def __init__(self, base: str, version: int) -> None:
        self.base = base
        self.version = version
        self.made: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []

    def make(self, relative: str, limit: Optional[int] = None) -> str:
        path = os.path.join(self.base, relative)
        os.mkdir(path)
        self.made.append(path)
        if self.version == 2:
            # Let children of this level have the memory controller too.
            try:
                write(os.path.join(path, "cgroup.subtree_control"), "+memory")
            except OSError:
                pass  # a leaf that will hold processes must not enable controllers
        if limit is not None:
            self.set_limit(path, limit)
        return path

    def set_limit(self, path: str, limit: Optional[int]) -> None:
        if limit is None:
            value = "max" if self.version == 2 else "-1"
        else:
            value = str(limit)
        write(os.path.join(path, limit_file(self.version)), value)

    def spawn(self, cgroup: str, code: str, *, env: Optional[dict[str, str]] = None,
              stdout: Optional[int] = subprocess.PIPE,
              stdin: Optional[int] = None,
              pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[str]:
        """Start `python -c code` already inside `cgroup` (it moves itself in before running
        anything else, so every page it touches is charged there)."""
        self.allow_processes(cgroup)
        boot = (
            "import os\n"
            f"open({os.path.join(cgroup, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
        ) + textwrap.dedent(code)
        proc = subprocess.Popen([sys.executable, "-c", boot], stdout=stdout, stdin=stdin,
                                stderr=subprocess.PIPE, text=True, env=env,
                                pass_fds=pass_fds)
        self.procs.append(proc)
        return proc

    def run_cli(self, cgroup: str, *args: str, timeout: float = 60) -> str:
        """`cgwatch ARGS` run inside `cgroup`; its stdout (it must exit 0)."""
        code = (f"import sys; sys.path.insert(0, {PROJECT!r})\n"
                f"sys.argv = ['cgwatch', *{list(args)!r}]\n"
                "from cgwatch.cli import main; sys.exit(main())")
        proc = self.spawn(cgroup, code)
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err
        return out

    def allow_processes(self, cgroup: str) -> None:
        """v2's no-internal-processes rule: a cgroup holding processes cannot also hand
        controllers to children, so give them up before moving a process in."""
        if self.version == 2:
            try:
                write(os.path.join(cgroup, "cgroup.subtree_control"), "-memory")
            except OSError:
                pass

    def remove_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.communicate(timeout=60)
            except Exception:
                pass
        for path in reversed(self.made):
            remove_cgroup(path, tries=50)


def remove_cgroup(path: str, tries: int = 100) -> bool:
    """Kill every process in the cgroup `path` and remove it, trying `tries` times 0.1 s apart
    (members still exiting keep it busy); whether it is gone."""
    for _ in range(tries):
        _kill_members(path)
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.1)  # members still exiting
    return False


def _kill_members(path: str) -> None:
    try:
        pids = [int(p) for p in read(os.path.join(path, "cgroup.procs")).split()]
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@contextmanager
def cgroup_tree() -> Iterator[Tree]:
    """A fresh directory below our own memory cgroup, removed with all it holds on exit."""
    res, why = own_memory_cgroup()
    assert res is not None, why
    enable_memory_for_children(res.directory, res.version)
    tree = Tree(res.directory, res.version)
    top = tree.make(f"cgwatch-test-{uuid.uuid4().hex[:8]}")
    tree.base = top
    try:
        yield tree
    finally:
        tree.remove_all()


def enable_memory_for_children(directory: str, version: int) -> None:
    """v2: let `directory`'s children have the memory controller, if it does not already
    (needed where the test runs in the root cgroup, as in the VM tier). Best effort: a
    non-root cgroup that holds processes may not do it, and then cannot be a test base."""
    if version != 2:
        return
    try:
        if "memory" not in read(os.path.join(directory, "cgroup.subtree_control")).split():
            write(os.path.join(directory, "cgroup.subtree_control"), "+memory")
    except OSError:
        pass


def oom_kills(directory: str, version: int) -> int:
    """The kernel's oom_kill counter of a cgroup (v2 memory.events: its subtree; v1
    memory.oom_control: its own processes)."""
    name = "memory.events" if version == 2 else "memory.oom_control"
    counters = dict(line.split() for line in read(os.path.join(directory, name)).splitlines())
    return int(counters["oom_kill"])





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
        return os.path.join(directory, limit_file(self.version))


def unavailable_reason() -> str:
    """Empty when the bench can make cgroups here; else why the cgroup sections are skipped."""
    return writable_reason()


def _member_of(directory: str) -> bool:
    procs = read(os.path.join(directory, "cgroup.procs")).split()
    return str(os.getpid()) in procs


def move_self(directory: str) -> None:
    """Move this whole process (every thread) into `directory`."""
    write(os.path.join(directory, "cgroup.procs"), str(os.getpid()))
    if not _member_of(directory):
        raise RuntimeError(f"moving into {directory} did not take")


@contextmanager
def nest(depth: int, limited: str, limit: int = 4 * GiB) -> Iterator[Nest]:
    """`depth` nested cgroups below our own; limited = "leaf" (only the deepest has `limit`),
    "all" (every level limited, the deepest tightest) or "none"."""
    res, why = own_memory_cgroup()
    if res is None:
        raise RuntimeError(why)
    enable_memory_for_children(res.directory, res.version)  # v2 root (the VM)
    tree = Tree(res.directory, res.version)
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
            write(os.path.join(n.leaf, "cgroup.subtree_control"), "-memory")
        except OSError:
            pass
    move_self(n.leaf)
    try:
        yield
    finally:
        move_self(n.own)
