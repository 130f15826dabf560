"""Real kernel (v1 here): mountinfo's line order is not the mount tree. A mount moved with
`mount --move` onto a newer mount keeps its place in the list (6.18 here lists a namespace's
mounts by creation), so its line comes before the line of the mount it
now sits on. Whether a mount is covered must come from the mount and parent IDs; by line
order, the memory mount looked hidden and the monitor answered host values.

Made here in a private mount namespace of a child process: the memory hierarchy is bind-mounted
aside, a tmpfs is mounted over /sys/fs/cgroup (covering the original memory mount for real),
and the bind is moved to /sys/fs/cgroup/memory on that tmpfs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

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
    with v1_memory_tree("the v1 memory hierarchy is moved here; v2 is the VM tier's") as t:
        yield t


CODE = """
import ctypes, json, os, subprocess, sys
sys.path.insert(0, {project!r})
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS: every mount below dies with this process
    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
def sh(*args):
    subprocess.run(args, check=True)
sh("mount", "--make-rprivate", "/")
sh("mount", "-t", "tmpfs", "tmpfs", {aside!r})
os.mkdir({aside!r} + "/memory")
sh("mount", "--bind", {point!r}, {aside!r} + "/memory")
sh("mount", "-t", "tmpfs", "tmpfs", "/sys/fs/cgroup")
os.mkdir({point!r})
sh("mount", "--move", {aside!r} + "/memory", {point!r})
lines = [ln.split() for ln in open("/proc/self/mountinfo").read().splitlines()]
from cgwatch import Monitor
m = Monitor()
print(json.dumps({{"lines": lines, "total": m.total_memory(), "status": m.status.__dict__}}))
"""


def test_a_memory_mount_listed_before_the_mount_it_sits_on_is_used(tree: Tree,
                                                                      tmp_path: str) -> None:
    ctr = tree.make("ctr", limit=300 * MiB)
    aside = str(tmp_path)
    proc = tree.spawn(ctr, CODE.format(project=PROJECT, aside=aside, point=MOUNT_POINT))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    got = json.loads(out.strip().splitlines()[-1])
    # The shape this test is about, as the kernel printed it: the moved memory mount's line
    # comes before the line of the tmpfs over /sys/fs/cgroup that is its parent.
    lines = got["lines"]
    at = {int(f[0]): i for i, f in enumerate(lines)}  # mount ID -> line index
    moved = [i for i, f in enumerate(lines) if f[4] == MOUNT_POINT and int(f[1]) in at
             and lines[at[int(f[1])]][4] == "/sys/fs/cgroup" and at[int(f[1])] > i]
    assert moved, "the kernel listed the moved mount after its parent: " + repr(lines)
    status = got["status"]
    assert status["mode"] == "watching", status["reason"]
    assert status["directory"] == MOUNT_POINT + status["cgroup_path"]
    assert got["total"] == 300 * MiB
