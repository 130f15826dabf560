"""Real kernel: answers are never stale after a write or a move. A child process runs a Monitor
inside cgroups made under this test's own memory cgroup (v1 on this machine; the same tests run
in the v2 VM, tests/v2/run); the test writes limits and moves the child from outside, as a
runtime or an operator does, then asks the child.

- read-your-writes: a limit write that returned before the query started is seen by it, every
  time (the write queues its inotify event before write(2) returns; the query drains it);
- a move to another cgroup is answered for the new cgroup within confirm_interval (0.1 s),
  with the thread's own check 60 s away, so the query path is what sees it.
Both with the background thread and without it (CGWATCH_THREAD=0).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.cgroup_helpers import MiB, Probe, Tree, cgroup_tree, real_kernel_marks

pytestmark = real_kernel_marks()

MODES = [pytest.param({}, id="thread"), pytest.param({"CGWATCH_THREAD": "0"}, id="thread-free")]


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


@pytest.mark.parametrize("env", MODES)
def test_another_process_writes_a_limit_and_the_next_query_sees_it(tree: Tree,
                                                                   env: dict[str, str]) -> None:
    ours = tree.make("ours", limit=400 * MiB)
    probe = Probe(tree, ours, migration=60, env=env)
    assert probe.ask(op="query")["total"] == 400 * MiB
    seen = []
    for i in range(60):
        limit = (300 + i) * MiB
        tree.set_limit(ours, limit)  # returns after the kernel took it
        seen.append(probe.ask(op="total")["total"] == limit)  # the probe's first call after
    assert sum(seen) == 60, seen
    status = probe.ask(op="query")["status"]
    assert status["mode"] == "watching"
    assert status["thread"] == (env == {})


@pytest.mark.parametrize("env", MODES)
def test_a_process_moved_from_outside_answers_for_the_new_cgroup_150ms_later(
        tree: Tree, env: dict[str, str]) -> None:
    first = tree.make("first", limit=300 * MiB)
    second = tree.make("second", limit=200 * MiB)
    tree.allow_processes(second)
    probe = Probe(tree, first, migration=60, env=env)  # the thread's own check is 60 s away
    assert probe.ask(op="query")["total"] == 300 * MiB
    for target, limit in ((second, 200 * MiB), (first, 300 * MiB), (second, 200 * MiB)):
        with open(os.path.join(target, "cgroup.procs"), "w") as f:
            f.write(str(probe.proc.pid))
        moved_at = time.monotonic()
        time.sleep(0.15)
        reply = probe.ask(op="query")
        assert reply["total"] == limit, reply["status"]
        assert reply["status"]["directory"] == target
        # status says when the cgroup was last confirmed: after the move
        assert reply["status"]["confirmed_at"] >= moved_at
