"""LXCFS (Debian's lxcfs 5.0.3) inside a real crun container, on the host (cgroup v1 here;
not in the VM, whose initramfs has no fuse module).

lxcfs serves a /proc/meminfo whose MemTotal is the reading process's cgroup limit; mounted
over the container's /proc/meminfo (as LXD and `docker run -v /var/lib/lxcfs/proc/meminfo:...`
do), cgwatch's host row must show that figure, and the MemAvailable shortcut (free pages from
sysinfo(2) minus the zone reserves, hostmem.py) must be off: sysinfo(2) is not virtualised and
still describes the real host, so it proves nothing about the container's meminfo.

lxcfs runs in the foreground as our child, on a private mount point; it is stopped (SIGTERM
makes it unmount its FUSE file system) and the mount point removed after the test, whatever
happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cgroup_helpers import cgroup_tree, real_kernel_marks, writable_reason
from tests.runtime.oci import MADE, Container, GiB, Shape, missing_reason

pytestmark = real_kernel_marks()

UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}  # units.human_bytes prints


def mounted(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


@pytest.fixture
def lxcfs() -> Iterator[str]:
    """A running lxcfs; yields its mount point."""
    for reason in (writable_reason(), missing_reason("crun"),
                   "" if shutil.which("lxcfs") else "lxcfs not on PATH (tests/tools unpacks it)",
                   "" if os.path.exists("/dev/fuse") else "no /dev/fuse"):
        if reason:
            pytest.skip(reason)
    top = tempfile.mkdtemp(prefix="cgwatch-lxcfs-")
    mount_point = os.path.join(top, "mnt")
    os.mkdir(mount_point)
    log = open(os.path.join(top, "log"), "w+")  # noqa: SIM115 (closed in the finally)
    proc = subprocess.Popen(["lxcfs", "-f", "-p", os.path.join(top, "pid"), mount_point],
                            stdout=log, stderr=subprocess.STDOUT)

    def left_behind() -> list[str]:
        left = [f"lxcfs process {proc.pid}"] if proc.poll() is None else []
        left += [f"lxcfs mount {mount_point}"] if mounted(mount_point) else []
        return left + ([top] if os.path.exists(top) else [])

    MADE.append(left_behind)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(mount_point, "proc", "meminfo")):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise AssertionError(f"lxcfs did not start: {log.read()}")
            time.sleep(0.05)
        yield mount_point
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)
        if mounted(mount_point):
            subprocess.run(["umount", "-l", mount_point], check=False)
        log.close()
        assert not mounted(mount_point), f"lxcfs's FUSE mount {mount_point} is still there"
        shutil.rmtree(top)


def test_lxcfs_meminfo_gives_the_host_row_and_turns_the_shortcut_off(lxcfs: str) -> None:
    with cgroup_tree() as tree:
        # crun: on v1 runc cannot run here (oci.py); lxcfs reads v1 and v2 limits alike
        ctr = Container("crun", tree.version, tree, tree.base,
                        Shape(cgroupns=False, cgroup_ro=True, lxcfs=lxcfs))
        try:
            ctr.start({"version": tree.version, "steps": [{"op": "own"}, {"op": "show"},
                                               {"op": "lxcfs"}]})
            got: dict[str, Any] = ctr.result()
        finally:
            ctr.close()
    lx = got["lxcfs"]
    # what lxcfs serves, and that it is what the container reads
    assert lx["meminfo_total"] == 1 * GiB
    assert any("fuse.lxcfs" in line for line in lx["mountinfo_meminfo"]), lx
    assert lx["sysinfo_total"] > 1 * GiB  # sysinfo(2) still reports the host's RAM
    # cgwatch's host row: lxcfs's MemTotal, from meminfo, without the sysinfo shortcut
    host = got["show"]["json"]["host"]
    assert host["mem_total"] == 1 * GiB
    assert host["source"] == lx["host_source"] == "meminfo"
    assert lx["lower_bound"] == -1  # hostmem: no lower bound on a virtual meminfo
    assert host["mem_available"] <= 1 * GiB
    # The container's limit ties with MemTotal: the cgroup level is marked, not the host
    own = got["own"]
    assert own["total"] == 1 * GiB
    marked = [lvl for lvl in own["levels"] if lvl["binds_total"]]
    assert len(marked) == 1 and marked[0]["limit"] == 1 * GiB
    assert own["available"] <= min(lx["meminfo_available"], own["files"][0]["headroom"]) \
        + 4 * (1 << 20)
    rows = got["show"]["table"].splitlines()
    assert rows[2].startswith("T"), rows  # the container's row carries the T mark
    # The table's rows: the mark column (two characters), two spaces, then the cells.
    table = [(row[:2], row[4:].split()) for row in rows
             if row[2:4] == "  " and row[4:].startswith(("/", "host "))]
    hosts = [(mark, cells) for mark, cells in table if cells[0] == "host"]
    assert len(hosts) == 1, rows
    host_mark, host_cells = hosts[0]
    # The host row is lxcfs's figures: MemTotal 1 GiB, MemAvailable at most that; the T mark
    # is the container's (its limit ties with MemTotal and the cgroup level takes the tie)
    assert host_cells[1:3] == ["1.0", "GiB"], rows
    assert "T" not in host_mark, rows
    shown, unit = host_cells[-2:]
    assert float(shown) * UNIT[unit] <= 1 * GiB, rows
    # Which row carries A is not asserted: lxcfs's MemAvailable is the container's limit minus
    # its usage, which can equal (on screen or to the byte) the container's headroom read a
    # moment apart, and then either row may take the least-headroom mark (the host row took it
    # 6 of 6 runs on one host). Only that there is at most one such mark.
    assert sum("A" in mark for mark, _ in table) <= 1, rows
