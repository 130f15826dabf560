"""Real cgroups for tests: made under the test process's own memory cgroup, removed afterwards.

Only this process's own subtree is touched: every directory is created below the memory cgroup
that /proc/self/cgroup names, and removed (processes killed first) even when a test fails.
Works for v1 (this machine) and v2 (the VM tier).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

import pytest

from cgwatch import discovery, tree
from tests.kernel_files import read

MiB = 1 << 20


def own_memory_cgroup() -> tuple[Optional[discovery.Resolved], str]:
    """The resolved memory cgroup of this process, or None and why it cannot be used."""
    resolution, _ = tree.resolve_process("/")
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


def real_kernel_marks() -> list[pytest.MarkDecorator]:
    """The marks of a real-kernel test module: `realkernel`, and a skip (with the reason)
    where real cgroups cannot be made here (conftest.py turns that skip into a failure when
    CGWATCH_REQUIRE_REAL=1)."""
    reason = writable_reason()
    return [pytest.mark.realkernel,
            pytest.mark.skipif(bool(reason), reason=f"real cgroups not writable: {reason}")]


def limit_file(version: int) -> str:
    return "memory.max" if version == 2 else "memory.limit_in_bytes"


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether `condition()` came true within `timeout` seconds (checked every 5 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


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
            _kill_members(path)
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # members still exiting


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


V1_MEMORY_MOUNT = "/sys/fs/cgroup/memory"


@contextmanager
def v1_memory_tree(why_v1: str) -> Iterator[Tree]:
    """cgroup_tree() on a host whose v1 memory hierarchy is mounted at V1_MEMORY_MOUNT (the
    tests that remount it in a private mount namespace); skipped otherwise, `why_v1` saying
    why v2 cannot stand in."""
    with cgroup_tree() as t:
        if t.version != 1:
            pytest.skip(why_v1)
        if not os.path.isdir(V1_MEMORY_MOUNT):
            pytest.skip(f"the v1 memory hierarchy is not at {V1_MEMORY_MOUNT}")
        yield t


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


def oom_victim_cgroup(tree: Tree, limited: str) -> str:
    """Where to run a process that `limited`'s limit will OOM-kill so that the kill counts at
    `limited` itself: v1 counts `oom_kill` only in the victim's own cgroup, so the victim
    runs in `limited`; v2 counts it hierarchically, and a cgroup that hands the memory
    controller to children (as `limited` does, for a monitor's cgroup beside the victim)
    may not hold processes, so the victim runs in a leaf below it (made on first use)."""
    if tree.version == 1:
        return limited
    leaf = os.path.join(limited, "victim")
    if not os.path.isdir(leaf):
        tree.make(os.path.relpath(leaf, tree.base))
    return leaf


def oom_kills(directory: str, version: int) -> int:
    """The kernel's oom_kill counter of a cgroup (v2 memory.events: its subtree; v1
    memory.oom_control: its own processes)."""
    name = "memory.events" if version == 2 else "memory.oom_control"
    counters = dict(line.split() for line in read(os.path.join(directory, name)).splitlines())
    return int(counters["oom_kill"])


PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_child.py")
PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Probe:
    """A Monitor running inside a cgroup, in a child process."""

    def __init__(self, tree: Tree, cgroup: str, migration: float = 5.0,
                 env: Optional[dict[str, str]] = None) -> None:
        env = dict(os.environ, PROBE_MIGRATION=str(migration), **(env or {}))
        self.proc = tree.spawn(cgroup, f"import runpy; runpy.run_path({PROBE!r}, "
                                       "run_name='__main__')",
                               stdin=subprocess.PIPE, env=env)
        assert self.read() == {"ready": True}

    def read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"probe died: {err}")
        return json.loads(line)

    def ask(self, **request: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.read()
