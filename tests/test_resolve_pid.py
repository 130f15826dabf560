"""Where another process's cgroup files are read (`tree.resolve_process(root, pid)`): our own
paths when its mountinfo reads as ours (the same mount namespace and root), else under
/proc/PID/root, and never our namespace's directories for another namespace's mount points.
Fake trees: the kernel's side is tests/test_sidecar_real.py."""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

import pytest

from cgwatch import discovery, tree
from tests.fake_tree import FakeHost

CTR = "/kubepods/pod1/ctr"
# A container's mountinfo (crun on v1 without a cgroup namespace: its own cgroup bound at the
# usual place); mount IDs differ from ours, as they do in every other mount namespace.
CONTAINER_MOUNTINFO = (
    "601 600 0:95 / / rw,relatime - overlay overlay rw\n"
    f"640 601 0:32 {CTR} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n")


class Row(NamedTuple):
    mountinfo: Optional[str]  # the process's; None: the same text as ours
    reachable: bool  # whether /proc/PID/root leads anywhere
    want: Optional[str]  # the directory, or None: unresolved


ROWS = [
    pytest.param(Row(None, False, f"/sys/fs/cgroup/memory{CTR}"), id="same-namespace"),
    pytest.param(Row(CONTAINER_MOUNTINFO, True, "/proc/77/root/sys/fs/cgroup/memory"),
                 id="another-namespace"),
    pytest.param(Row(CONTAINER_MOUNTINFO, False, None), id="another-namespace-no-access"),
]


@pytest.mark.parametrize("row", ROWS)
def test_where_another_process_is_read(tmp_path: str, row: Row) -> None:
    host = FakeHost(str(tmp_path), 1, cgroup_path=CTR)
    host.make_path({"/kubepods": None, "/kubepods/pod1": None, CTR: 512 << 20})
    with open(host.path("/proc/self/cgroup")) as f:
        host.write("/proc/77/cgroup", f.read())
    with open(host.path("/proc/self/mountinfo")) as f:
        host.write("/proc/77/mountinfo", f.read() if row.mountinfo is None else row.mountinfo)
    if row.reachable:
        os.makedirs(host.path("/proc/77/root/sys/fs/cgroup/memory"))
    resolution, text = tree.resolve_process(host.root, 77)
    assert text.startswith(f"4:memory:{CTR}\n")
    if row.want is None:
        assert isinstance(resolution, discovery.Unresolved)
        assert "/proc/77/root cannot be reached" in resolution.reason, resolution
    else:
        assert isinstance(resolution, discovery.Resolved), resolution
        assert resolution.directory == row.want
