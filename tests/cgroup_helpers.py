"""Real cgroups for tests: made under the test process's own memory cgroup, removed afterwards.

Only this process's own subtree is touched: every directory is created below the memory cgroup
that /proc/self/cgroup names, and removed (processes killed first) even when a test fails.
Works for v1 (this machine) and v2 (the VM tier). The tree itself (`Tree`, `cgroup_tree()`,
the reads and writes) is bench/cgroups.py's, shared with the bench; here are what only tests
use: pytest's marks and skips, waiting, a script run in a cgroup, the OOM victim's place,
the probe.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

import pytest

from bench.cgroups import (  # noqa: F401 - the tests' names for them
    PROJECT,
    MiB,
    Tree,
    cgroup_tree,
    enable_memory_for_children,
    limit_file,
    oom_kills,
    own_memory_cgroup,
    read,
    writable_reason,
    write,
)


def real_kernel_marks() -> list[pytest.MarkDecorator]:
    """The marks of a real-kernel test module: `realkernel`, and a skip (with the reason)
    where real cgroups cannot be made here (conftest.py turns that skip into a failure when
    CGWATCH_REQUIRE_REAL=1)."""
    reason = writable_reason()
    return [pytest.mark.realkernel,
            pytest.mark.skipif(bool(reason), reason=f"real cgroups not writable: {reason}")]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether `condition()` came true within `timeout` seconds (checked every 5 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def run_script(tree: Tree, cgroup: str, script: str, *args: str,
               timeout: float) -> tuple[int, str, str]:
    """Run the Python file `script` with `args` as its arguments in `cgroup` (Tree.spawn: the
    child is in the cgroup before the script's first allocation), until it ends, at most
    `timeout` seconds; (returncode, stdout, stderr)."""
    code = (f"import runpy, sys\nsys.argv = [{script!r}, *{list(args)!r}]\n"
            f"runpy.run_path({script!r}, run_name='__main__')\n")
    proc = tree.spawn(cgroup, code)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


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


PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_child.py")


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
