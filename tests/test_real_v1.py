"""Real kernel: cgroups made under this test's own memory cgroup (v1 on this machine; the same
tests run on v2 where the process's cgroup is writable). A child process is moved into them and
runs a Monitor (tests/probe_child.py); the test writes limits from outside, as a runtime does."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cgroup_helpers import (
    PROJECT,
    MiB,
    Probe,
    Tree,
    cgroup_tree,
    real_kernel_marks,
)

pytestmark = real_kernel_marks()

@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def level(reply: Any, directory: str) -> dict[str, Any]:
    return next(lvl for lvl in reply["levels"] if lvl["directory"] == directory)


def test_limit_on_own_cgroup(tree: Tree) -> None:
    ours = tree.make("ours", limit=300 * MiB)
    probe = Probe(tree, ours)
    reply = probe.ask(op="query")
    assert reply["total"] == 300 * MiB
    assert reply["status"]["mode"] == "watching"
    assert reply["status"]["directory"] == ours
    assert 0 < reply["available"] <= 300 * MiB
    assert level(reply, ours)["binds_total"]


def test_smaller_parent_limit_wins(tree: Tree) -> None:
    parent = tree.make("parent", limit=200 * MiB)
    ours = tree.make("parent/ours", limit=500 * MiB)
    reply = Probe(tree, ours).ask(op="query")
    assert reply["total"] == 200 * MiB
    assert level(reply, parent)["binds_total"]
    assert not level(reply, ours)["binds_total"]


def test_sibling_usage_shrinks_our_headroom(tree: Tree) -> None:
    parent = tree.make("parent", limit=800 * MiB)
    sibling = tree.make("parent/sibling")
    ours = tree.make("parent/ours", limit=600 * MiB)
    hog = tree.spawn(sibling, "import sys\nb = b'x' * (500 << 20)\nprint('held', flush=True)\n"
                              "sys.stdin.read()", stdin=subprocess.PIPE)
    assert hog.stdout is not None and hog.stdout.readline().strip() == "held"
    probe = Probe(tree, ours)
    reply = probe.ask(op="query")
    assert reply["total"] == 600 * MiB
    head = probe.ask(op="headroom", directory=parent)
    # The parent binds: 800 MiB minus the sibling's 500 MiB and our own few MiB.
    assert head["available"] < 300 * MiB
    assert abs(head["available"] - head["measured"]) < 4 * MiB
    assert level(probe.ask(op="query"), parent)["binds_available"]


def test_limit_written_from_outside_is_seen_by_a_spinning_reader_and_the_next_query(
        tree: Tree) -> None:
    """A limit written from outside: a reader spinning on total_memory() sees it, and a query
    that starts after the write returned answers it at once (the write queued its inotify
    event before returning; the query's poll(0) finds it: tracker.py). The spin's delay is
    the scheduler's, not cgwatch's: it once asserted < 100 ms, which a loaded 2-core machine
    does not promise; the query after the write is the exact form of the same claim."""
    ours = tree.make("ours", limit=400 * MiB)
    probe = Probe(tree, ours)
    assert probe.ask(op="query")["total"] == 400 * MiB
    for limit in (300 * MiB, 350 * MiB, 250 * MiB):
        assert probe.proc.stdin is not None
        probe.proc.stdin.write(json.dumps({"op": "wait_total", "value": limit, "timeout": 60})
                               + "\n")
        probe.proc.stdin.flush()
        time.sleep(0.02)  # most often the probe is spinning by now; if not, it finds it at once
        written_at = time.monotonic()
        tree.set_limit(ours, limit)
        reply = probe.read()
        assert reply["seen_at"] is not None, f"never saw {limit}: still {reply['total']}"
        assert reply["seen_at"] >= written_at  # CLOCK_MONOTONIC: one clock for both processes
    for limit in (200 * MiB, 380 * MiB):  # no spin in between: the very next query
        tree.set_limit(ours, limit)
        assert probe.ask(op="query")["total"] == limit


def test_removed_and_recreated_cgroups_do_not_break_it(tree: Tree) -> None:
    parent = tree.make("parent", limit=700 * MiB)
    first = tree.make("parent/first", limit=300 * MiB)
    second = tree.make("parent/second", limit=200 * MiB)
    probe = Probe(tree, first, migration=60)  # the timer must not be what saves us
    assert probe.ask(op="query")["total"] == 300 * MiB
    for _ in range(2):
        # Move the probe from outside, then remove the cgroup it was in.
        with open(os.path.join(second, "cgroup.procs"), "w") as f:
            f.write(str(probe.proc.pid))
        os.rmdir(first)
        # The removal is noticed (IN_DELETE in the parent) and the new path is resolved.
        reply = probe.ask(op="wait_total", value=200 * MiB, timeout=10)
        assert reply["seen_at"] is not None, reply
        query = probe.ask(op="query")
        assert query["status"]["directory"] == second
        assert 0 < query["available"] <= 200 * MiB
        # Recreate the first one and go back; remove the second.
        os.mkdir(first)
        tree.set_limit(first, 300 * MiB)
        with open(os.path.join(first, "cgroup.procs"), "w") as f:
            f.write(str(probe.proc.pid))
        os.rmdir(second)
        reply = probe.ask(op="wait_total", value=300 * MiB, timeout=10)
        assert reply["seen_at"] is not None, reply
        assert probe.ask(op="query")["status"]["directory"] == first
        os.mkdir(second)
        tree.set_limit(second, 200 * MiB)
    final = probe.ask(op="query")["status"]
    assert final["mode"] == "watching", final["reason"]
    assert parent  # the parent stayed throughout


def test_available_after_own_cgroup_removed_under_it(tree: Tree) -> None:
    """available_memory() right after a removal, before the thread re-resolves, hits ENODEV on
    the kept descriptors: it must still answer correctly, not raise."""
    first = tree.make("first", limit=300 * MiB)
    second = tree.make("second", limit=200 * MiB)
    code = f"""
import json, os, sys
sys.path.insert(0, {PROJECT!r})
from cgwatch import Monitor
# Polling with a cache that outlives the test, and no move check meanwhile: nothing but the
# failing read itself can notice the removal.
m = Monitor(migration_interval=60, confirm_interval=60, poll_interval=60, use_inotify=False)
before = m.available_memory()
open({os.path.join(second, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))
os.rmdir({first!r})
after = m.available_memory()
print(json.dumps([before, after, m.total_memory(), m.status.directory]))
"""
    proc = tree.spawn(first, code)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    before, after, total, directory = json.loads(out)
    assert 0 < before <= 300 * MiB
    assert 0 < after <= 200 * MiB
    assert total == 200 * MiB
    assert directory == second
    tree.made.remove(first)


def test_command_inside_a_limited_cgroup(tree: Tree) -> None:
    parent = tree.make("parent", limit=256 * MiB)
    ours = tree.make("parent/ours", limit=512 * MiB)
    data = json.loads(tree.run_cli(ours, "--json", timeout=30))
    assert data["total_memory"] == 256 * MiB
    assert data["status"]["directory"] == ours
    binding = [lvl for lvl in data["levels"] if lvl["binds_total"]]
    assert [lvl["directory"] for lvl in binding] == [parent]
    table = tree.run_cli(ours, timeout=30)
    assert "256.0 MiB" in table and "512.0 MiB" in table
    rows = [ln for ln in table.splitlines() if binding[0]["cgroup_path"] in ln.split()]
    assert len(rows) == 1 and rows[0].startswith("T"), table
