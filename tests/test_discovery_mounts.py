"""Which mount discovery picks: covered mounts are skipped (decided by the mount tree, not line
order), duplicates fall through to the next usable copy, /sys/fs/cgroup is preferred among
equals. Pure: mountinfo texts as runtimes leave them (the covered case is the one
tests/test_hidden_real.py makes on the real kernel; the moved mount listed before its parent
is the one tests/test_mount_tree_real.py makes)."""

from __future__ import annotations

from typing import Callable, Optional

import pytest

from cgwatch import discovery
from cgwatch.discovery import Resolved, Unresolved

ROOTFS = "22 1 8:2 / / rw,relatime - ext4 /dev/sda2 rw\n"
V1_CGROUP = "4:memory:/job/ctr\n1:cpu:/\n0::/\n"


def v1(mount_id: int, root: str, point: str) -> str:
    return f"{mount_id} 31 0:32 {root} {point} rw,relatime - cgroup cgroup rw,memory\n"


def never(_: str) -> bool:
    return False


# A hybrid host as OpenJDK's container tests lay it out (test/hotspot/jtreg/containers,
# CgroupSubsystemFactory: "mntInfoHybridFlippedOrder"), in the shape this project's 6.18
# kernel printed: the memory hierarchy is mounted on the /sys/fs/cgroup tmpfs (parent 30),
# yet its line comes first. No line for "/" (the JDK's table has none either).
HYBRID_MEMORY = ("35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:7"
                 " - cgroup cgroup rw,seclabel,memory\n")
HYBRID_REST = (
    "30 23 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:4 - tmpfs tmpfs ro,mode=755\n"
    "32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:6"
    " - cgroup cgroup rw,seclabel,xattr,name=systemd\n"
    "36 30 0:32 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:8"
    " - cgroup cgroup rw,seclabel,pids\n"
    "31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:5"
    " - cgroup2 cgroup2 rw,seclabel,nsdelegate\n")
HYBRID_FLIPPED = HYBRID_MEMORY + HYBRID_REST
# The same with its ancestry complete down to "/" (sysfs at /sys on the root file system).
ROOT_SYS = ("1 0 8:2 / / rw,relatime - ext4 /dev/sda2 rw\n"
            "23 1 0:22 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw\n")


TABLE: list[tuple[str, str, Optional[Callable[[str], bool]], Optional[str]]] = [
    # (name, mountinfo, usable(directory) or None, expected directory or None: unresolved)
    ("the full mount alone",
     ROOTFS + v1(35, "/", "/sys/fs/cgroup/memory"), None,
     "/sys/fs/cgroup/memory/job/ctr"),
    ("crun on v1: the container's own cgroup bind-mounted over the full mount",
     ROOTFS + v1(35, "/", "/sys/fs/cgroup/memory") + v1(60, "/job/ctr", "/sys/fs/cgroup/memory"),
     None, "/sys/fs/cgroup/memory"),
    ("a tmpfs mounted later over /sys/fs/cgroup hides everything below it",
     ROOTFS + v1(35, "/", "/sys/fs/cgroup/memory")
     + "61 22 0:40 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n",
     None, None),
    ("a later mount elsewhere hides nothing",
     ROOTFS + v1(35, "/", "/sys/fs/cgroup/memory") + "61 22 0:40 / /mnt rw - tmpfs tmpfs rw\n",
     None, "/sys/fs/cgroup/memory/job/ctr"),
    ("a mount below the mount point does not hide it",
     ROOTFS + v1(35, "/", "/sys/fs/cgroup/memory")
     + "61 35 0:40 / /sys/fs/cgroup/memory/job rw - tmpfs tmpfs rw\n",
     None, "/sys/fs/cgroup/memory/job/ctr"),
    ("two copies of the full mount: /sys/fs/cgroup preferred even when listed second",
     ROOTFS + v1(35, "/", "/mnt/memory") + v1(36, "/", "/sys/fs/cgroup/memory"), None,
     "/sys/fs/cgroup/memory/job/ctr"),
    ("the preferred copy is unusable: fall through to the other",
     ROOTFS + v1(35, "/", "/mnt/memory") + v1(36, "/", "/sys/fs/cgroup/memory"),
     lambda d: d.startswith("/mnt/"), "/mnt/memory/job/ctr"),
    ("the full mount unusable: fall through to the subtree mount",
     ROOTFS + v1(35, "/", "/sys/fs/cgroup/memory") + v1(36, "/job", "/run/job-memory"),
     lambda d: d.startswith("/run/"), "/run/job-memory/ctr"),
    ("no copy usable", ROOTFS + v1(35, "/", "/sys/fs/cgroup/memory"), never, None),
    # Line order is not mount order: the mount tree (mount ID, parent ID) decides.
    ("hybrid host, the memory line before the /sys/fs/cgroup tmpfs it sits on (OpenJDK)",
     HYBRID_FLIPPED, None, "/sys/fs/cgroup/memory/job/ctr"),
    ("the same with its ancestry down to / listed last",
     HYBRID_FLIPPED + ROOT_SYS, None, "/sys/fs/cgroup/memory/job/ctr"),
    ("an unusable duplicate listed first falls through to the one under /sys/fs/cgroup",
     "70 23 0:31 / /mnt/memory rw,relatime - cgroup cgroup rw,memory\n" + HYBRID_FLIPPED,
     lambda d: not d.startswith("/mnt/"), "/sys/fs/cgroup/memory/job/ctr"),
    ("crun's bind mount listed before the full mount it is stacked on",
     ROOT_SYS + "60 35 0:31 /job/ctr /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
     + HYBRID_FLIPPED, None, "/sys/fs/cgroup/memory"),
    # As 6.18 lists `mount --move` of an older mount onto a newer tmpfs over /sys/fs/cgroup
    # (tests/test_mount_tree_real.py makes it): the moved copy first, its parent after.
    ("a tmpfs over /sys/fs/cgroup listed after the memory mount moved onto it",
     ROOT_SYS + "30 23 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
     + v1(35, "/", "/sys/fs/cgroup/memory").replace(" 31 ", " 30 ", 1)
     + "63 64 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
     + "64 30 0:39 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n",
     None, "/sys/fs/cgroup/memory/job/ctr"),
    ("a tmpfs stacked on /sys/fs/cgroup hides the memory mount, though listed before it",
     ROOT_SYS + "30 23 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
     + "64 30 0:39 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
     + v1(35, "/", "/sys/fs/cgroup/memory").replace(" 31 ", " 30 ", 1), None, None),
    ("a later mount at /sys/fs under sysfs (it sits on / and sysfs hides it) hides nothing",
     ROOT_SYS + "30 23 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
     + v1(35, "/", "/sys/fs/cgroup/memory").replace(" 31 ", " 30 ", 1)
     + "62 1 0:40 / /sys/fs rw - tmpfs tmpfs rw\n", None, "/sys/fs/cgroup/memory/job/ctr"),
]


@pytest.mark.parametrize("mountinfo, usable, expected",
                         [pytest.param(m, u, e, id=name) for name, m, u, e in TABLE])
def test_mount_choice(mountinfo: str, usable: Optional[Callable[[str], bool]],
                      expected: Optional[str]) -> None:
    got = discovery.resolve(V1_CGROUP, mountinfo, lambda _: False, usable)
    if expected is None:
        assert isinstance(got, Unresolved), got
    else:
        assert isinstance(got, Resolved), got
        assert got.directory == expected


def test_covered_mounts_are_the_earlier_ones() -> None:
    text = ROOTFS + v1(35, "/", "/sys/fs/cgroup/memory") + v1(60, "/job/ctr",
                                                             "/sys/fs/cgroup/memory")
    mounts = discovery.parse_mountinfo(text)
    assert [m.root for m in discovery.covered_mounts(text, mounts)] == ["/"]


def test_covered_mounts_follow_the_tree_not_the_lines() -> None:
    # The bind mount (60) is stacked on the full mount (35) but listed first.
    text = (ROOT_SYS + "60 35 0:31 /job/ctr /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
            + HYBRID_FLIPPED)
    mounts = discovery.parse_mountinfo(text)
    assert [(m.mount_id, m.parent_id) for m in mounts] == [(60, 35), (35, 30), (32, 30),
                                                           (36, 30), (31, 30)]
    assert [m.mount_id for m in discovery.covered_mounts(text, mounts)] == [35]
    assert discovery.covered_mounts(HYBRID_FLIPPED, discovery.parse_mountinfo(HYBRID_FLIPPED)) == []


V2_NS_BIND = ("22 1 8:2 / / rw - ext4 /dev/sda2 rw\n"
              "40 22 0:30 /../.. /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n")


@pytest.mark.parametrize("proc_cgroup, mountinfo, expected", [
    # The host's cgroupfs bind-mounted into a container with a private cgroup namespace: the
    # path and the mount root are both printed relative to the namespace root.
    pytest.param("0::/../../x\n", V2_NS_BIND, "/sys/fs/cgroup/x", id="both-relative-exact"),
    pytest.param("0::/../..\n", V2_NS_BIND, "/sys/fs/cgroup", id="the-mount-root-itself"),
    # "/../..x" is a cgroup named "..x" under "/..": the root "/../.." does not contain it.
    pytest.param("0::/../..x\n", V2_NS_BIND, None, id="dotdot-x-is-a-name"),
    # A root that does not climb as far is the wrong mount, whatever the string prefix.
    pytest.param("0::/../../x\n", V2_NS_BIND.replace("/../..", "/"), None,
                 id="root-slash-does-not-contain-dotdot"),
    pytest.param("0::/../a/../x\n", V2_NS_BIND, None, id="dotdot-after-a-name-refused"),
])
def test_namespace_relative_paths(proc_cgroup: str, mountinfo: str,
                                  expected: Optional[str]) -> None:
    got = discovery.resolve(proc_cgroup, mountinfo, lambda _: True)
    if expected is None:
        assert isinstance(got, Unresolved), got
    else:
        assert isinstance(got, Resolved), got
        assert got.directory == expected
