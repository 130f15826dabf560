"""Real kernel (v1 here): a limit above the visible hierarchy. A container runtime that
bind-mounts only the container's own cgroup (crun, Docker on v1 without a cgroup namespace)
hides the parents' limits from memory.limit_in_bytes; the kernel still shows the smallest of
them as `hierarchical_memory_limit` in the top visible level's memory.stat.

Made here as a runtime makes it: a child process moves itself into an unlimited cgroup under a
300 MiB parent, enters a private mount namespace and bind-mounts its own cgroup over
/sys/fs/cgroup/memory (the original mount stays listed in mountinfo, hidden under the new one).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cgroup_helpers import (
    PROJECT,
    V1_MEMORY_MOUNT,
    MiB,
    Tree,
    real_kernel_marks,
    v1_memory_tree,
)

pytestmark = real_kernel_marks()

MOUNT_POINT = V1_MEMORY_MOUNT


@pytest.fixture
def tree() -> Iterator[Tree]:
    with v1_memory_tree("hierarchical_memory_limit is v1's; v2 shows no hidden limit") as t:
        yield t


def inside_subtree_mount(tree: Tree, cgroup: str, code: str) -> Any:
    """Run `code` (which prints one JSON line) in `cgroup`, in a private mount namespace
    where only `cgroup` is mounted at /sys/fs/cgroup/memory."""
    boot = f"""
import ctypes, json, os, subprocess, sys
sys.path.insert(0, {PROJECT!r})
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
subprocess.run(["mount", "--bind", {cgroup!r}, {MOUNT_POINT!r}], check=True)
""" + code
    proc = tree.spawn(cgroup, boot)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


QUERY = """
from cgwatch import Monitor
m = Monitor()
print(json.dumps({"total": m.total_memory(), "available": m.available_memory(),
                  "status": m.status.__dict__, "levels": [l.as_dict() for l in m.levels()]}))
"""


def test_a_parent_limit_above_the_visible_hierarchy_sets_total_memory(tree: Tree) -> None:
    parent = tree.make("parent", limit=300 * MiB)
    ctr = tree.make("parent/ctr")  # the container: no limit of its own
    got = inside_subtree_mount(tree, ctr, QUERY)
    assert got["status"]["directory"] == MOUNT_POINT  # resolved through the bind mount
    assert got["status"]["mode"] == "watching", got["status"]["reason"]
    assert got["total"] == 300 * MiB
    assert 0 < got["available"] <= 300 * MiB
    rows = got["levels"]
    assert [r["hidden"] for r in rows] == [False, True]
    assert rows[1]["limit"] == 300 * MiB and rows[1]["binds_total"]
    assert "above" in rows[1]["cgroup_path"]
    assert "hierarchical_memory_limit" in got["status"]["above"]
    assert parent


def test_a_hidden_limit_changed_from_outside_is_seen(tree: Tree) -> None:
    parent = tree.make("parent", limit=300 * MiB)
    ctr = tree.make("parent/ctr")
    code = """
import time
from cgwatch import Monitor
m = Monitor()
before = m.total_memory()
print("ready", flush=True)
sys.stdin.readline()  # the test lowers the parent's limit meanwhile
time.sleep(0.15)  # no inotify reaches the hidden level: the 0.1 s confirmation re-reads it
print(json.dumps([before, m.total_memory()]))
"""
    boot = f"""
import ctypes, json, os, subprocess, sys
sys.path.insert(0, {PROJECT!r})
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x00020000) != 0:
    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
subprocess.run(["mount", "--bind", {ctr!r}, {MOUNT_POINT!r}], check=True)
""" + code
    import subprocess

    proc = tree.spawn(ctr, boot, stdin=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    tree.set_limit(parent, 200 * MiB)
    proc.stdin.write("\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == [300 * MiB, 200 * MiB]


RUN_OOM = """
sys.argv = ["cgwatch", "run", "--json", "--", sys.executable, "-c",
            "b = []\\nwhile True:\\n    b.append(bytearray(1 << 20))\\n"]
from cgwatch.cli import main
import contextlib, io
err = io.StringIO()
with contextlib.redirect_stderr(err):
    status = main()
print(json.dumps({"status": status, "report": json.loads(err.getvalue().splitlines()[-1])}))
"""


def oom_under_subtree_mount(tree: Tree, parent_limit: int,
                            own_limit: int) -> tuple[dict[str, Any], str]:
    """`cgwatch run --json` of an allocator killed in a container (`own_limit`) under a
    parent (`parent_limit`) only the container's cgroup of which is mounted: the report and
    its explanation as one line."""
    tree.make("parent", limit=parent_limit)
    ctr = tree.make("parent/ctr", limit=own_limit)
    got = inside_subtree_mount(tree, ctr, RUN_OOM)
    assert got["status"] == 137
    report: dict[str, Any] = got["report"]
    assert report["oom_kills"] == 1
    return report, " ".join(" ".join(report["explanation"]).split())


def test_an_oom_kill_from_a_hidden_parent_is_explained_as_such(tree: Tree) -> None:
    # The container's own limit (256 MiB) is never reached; its parent's (64 MiB) is. The
    # kernel's OOM notification reaches the container anyway (mem_cgroup_oom_notify walks
    # the subtree of the memcg that ran out), while the container's failcnt stays 0.
    report, text = oom_under_subtree_mount(tree, 64 * MiB, 256 * MiB)
    assert report["cause"] == "above", text
    culprit = report["culprit"]
    assert culprit["kind"] == "above" and culprit["certain"]
    assert culprit["limit"] == 64 * MiB
    assert culprit["cgroup_path"].startswith("(above ")
    assert "without its own limit being hit" in text
    assert "limit 64.0 MiB (67108864 bytes, v1 hierarchical_memory_limit)" in text
    assert "raising this container's own limit would not help" in text
    assert "256.0 MiB" not in text


def test_an_oom_kill_at_the_containers_own_limit_names_it(tree: Tree) -> None:
    # The same shape, the other way round: the container's own limit is the smaller.
    report, text = oom_under_subtree_mount(tree, 256 * MiB, 64 * MiB)
    assert report["cause"] == "limit", text
    assert report["culprit"]["kind"] == "hit" and report["culprit"]["certain"]
    assert report["culprit"]["limit"] == 64 * MiB
    assert "raise that cgroup's memory limit" in text
