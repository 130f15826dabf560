"""Tables of real-world /proc/self/cgroup + mountinfo inputs and where memory must be found."""

from __future__ import annotations

import pytest

from cgwatch import discovery
from cgwatch.discovery import Resolved, Unresolved

# This machine (hybrid: v1 memory, a cgroup2 mount without the memory controller).
HYBRID_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/d52ac
1:cpu:/
0::/
"""
HYBRID_MOUNTINFO = """\
25 1 252:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""

# A systemd host on pure v2 (Fedora/Ubuntu 22.04+), shared:N optional fields present.
V2_CGROUP = "0::/user.slice/user-1000.slice/session-3.scope\n"
V2_MOUNTINFO = """\
22 1 8:2 / / rw,relatime shared:1 - ext4 /dev/sda2 rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
"""

# Docker with a private cgroup namespace (the default on v2 hosts): the container's own level
# is the top it can see.
V2_NAMESPACE_CGROUP = "0::/\n"
V2_NAMESPACE_MOUNTINFO = """\
651 600 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate
"""

# Kubernetes on v1 without cgroup namespaces: the container sees its own subtree mounted at
# /sys/fs/cgroup/memory (root = the pod/container path), and memory is co-mounted with cpu in
# some distributions.
K8S_V1_CGROUP = """\
11:memory:/kubepods/burstable/pod1234/abcd
4:cpu,cpuacct:/kubepods/burstable/pod1234/abcd
"""
K8S_V1_MOUNTINFO = """\
1200 1190 0:33 /kubepods/burstable/pod1234/abcd /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
1201 1190 0:30 /kubepods/burstable/pod1234/abcd /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct
"""

CO_MOUNT_CGROUP = "3:cpu,memory:/jobs/42\n"
CO_MOUNT_MOUNTINFO = "30 20 0:25 / /cgroup/cpu,memory rw - cgroup none rw,cpu,memory\n"

# A delegated subtree mounted elsewhere and listed first, then the full hierarchy.
DELEGATED_MOUNTINFO = """\
40 30 0:32 /a /delegated rw - cgroup cgroup rw,memory
41 30 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
"""

# Slurm job on v1: two bind mounts of the hierarchy, one with a deeper root.
SLURM_CGROUP = "6:memory:/slurm/uid_1000/job_77/step_0/task_0\n"
SLURM_MOUNTINFO = """\
50 1 0:40 /slurm/uid_1000 /run/slurm-user rw - cgroup cgroup rw,memory
51 1 0:40 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
"""

ESCAPED_MOUNTINFO = (
    "60 1 0:41 /my\\040jobs /mnt/cg\\040mem\\011x\\134y rw - cgroup cgroup rw,memory\n"
)
ESCAPED_CGROUP = "5:memory:/my jobs/run 1\n"

LONG_LINE = "70 1 0:99 / /" + "x" * 5000 + " rw - overlay overlay rw,lowerdir=" + "y" * 20000


def v2_yes(_: str) -> bool:
    return True


def v2_no(_: str) -> bool:
    return False


CASES = [
    ("hybrid host: memory from v1", HYBRID_CGROUP, HYBRID_MOUNTINFO, v2_no,
     Resolved(1, "/process_api/d52ac", "/sys/fs/cgroup/memory", "/",
              "/sys/fs/cgroup/memory/process_api/d52ac")),
    ("hybrid host even if cgroup2 lists memory: v1 wins", HYBRID_CGROUP, HYBRID_MOUNTINFO, v2_yes,
     Resolved(1, "/process_api/d52ac", "/sys/fs/cgroup/memory", "/",
              "/sys/fs/cgroup/memory/process_api/d52ac")),
    ("pure v2 with optional fields", V2_CGROUP, V2_MOUNTINFO, v2_yes,
     Resolved(2, "/user.slice/user-1000.slice/session-3.scope", "/sys/fs/cgroup", "/",
              "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope")),
    ("v2 cgroup namespace: 0::/", V2_NAMESPACE_CGROUP, V2_NAMESPACE_MOUNTINFO, v2_yes,
     Resolved(2, "/", "/sys/fs/cgroup", "/", "/sys/fs/cgroup")),
    ("k8s v1: mount root is the container path", K8S_V1_CGROUP, K8S_V1_MOUNTINFO, v2_no,
     Resolved(1, "/kubepods/burstable/pod1234/abcd", "/sys/fs/cgroup/memory",
              "/kubepods/burstable/pod1234/abcd", "/sys/fs/cgroup/memory")),
    ("v1 co-mount cpu,memory", CO_MOUNT_CGROUP, CO_MOUNT_MOUNTINFO, v2_no,
     Resolved(1, "/jobs/42", "/cgroup/cpu,memory", "/", "/cgroup/cpu,memory/jobs/42")),
    ("delegated subtree listed first is not chosen (does not contain /ab)",
     "4:memory:/ab/c\n", DELEGATED_MOUNTINFO, v2_no,
     Resolved(1, "/ab/c", "/sys/fs/cgroup/memory", "/", "/sys/fs/cgroup/memory/ab/c")),
    ("delegated subtree that contains the path loses to the shortest root",
     "4:memory:/a/c\n", DELEGATED_MOUNTINFO, v2_no,
     Resolved(1, "/a/c", "/sys/fs/cgroup/memory", "/", "/sys/fs/cgroup/memory/a/c")),
    ("only the delegated subtree contains the path",
     "4:memory:/a/c\n", DELEGATED_MOUNTINFO.splitlines()[0] + "\n", v2_no,
     Resolved(1, "/a/c", "/delegated", "/a", "/delegated/c")),
    ("slurm: two bind mounts, the shortest root wins", SLURM_CGROUP, SLURM_MOUNTINFO, v2_no,
     Resolved(1, "/slurm/uid_1000/job_77/step_0/task_0", "/sys/fs/cgroup/memory", "/",
              "/sys/fs/cgroup/memory/slurm/uid_1000/job_77/step_0/task_0")),
    ("octal escapes in root and mount point", ESCAPED_CGROUP, ESCAPED_MOUNTINFO, v2_no,
     Resolved(1, "/my jobs/run 1", "/mnt/cg mem\tx\\y", "/my jobs", "/mnt/cg mem\tx\\y/run 1")),
    ("very long unrelated mountinfo lines", V2_CGROUP, LONG_LINE + "\n" + V2_MOUNTINFO, v2_yes,
     Resolved(2, "/user.slice/user-1000.slice/session-3.scope", "/sys/fs/cgroup", "/",
              "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope")),
    ("v1 line but no v1 memory mount: v2 used when it has memory",
     "4:memory:/x\n0::/x\n", V2_MOUNTINFO, v2_yes,
     Resolved(2, "/x", "/sys/fs/cgroup", "/", "/sys/fs/cgroup/x")),
    # Legal names that merely look like '..' or the kernel's " (deleted)" marker: the checks
    # are on whole components (issue 11).
    ("names starting with '..' and '...' are names", "0::/..x/.../y..\n", V2_MOUNTINFO, v2_yes,
     Resolved(2, "/..x/.../y..", "/sys/fs/cgroup", "/", "/sys/fs/cgroup/..x/.../y..")),
    ("v1 never appends ' (deleted)': a name ending so resolves",
     "4:memory:/jobs/x (deleted)\n", HYBRID_MOUNTINFO, v2_no,
     Resolved(1, "/jobs/x (deleted)", "/sys/fs/cgroup/memory", "/",
              "/sys/fs/cgroup/memory/jobs/x (deleted)")),
    ("v2: ' (deleted)' inside the path is a name", "0::/x (deleted)/y\n", V2_MOUNTINFO, v2_yes,
     Resolved(2, "/x (deleted)/y", "/sys/fs/cgroup", "/", "/sys/fs/cgroup/x (deleted)/y")),
    ("a second memory mount with a refused escape does not hide the good one", V2_CGROUP,
     "36 24 0:31 / /x\\000y rw - cgroup2 cgroup2 rw\n" + V2_MOUNTINFO, v2_yes,
     Resolved(2, "/user.slice/user-1000.slice/session-3.scope", "/sys/fs/cgroup", "/",
              "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope")),
    ("hierarchy id with a superscript digit: that line is skipped, v2 used",
     "\u00b2:memory:/x\n0::/x\n", V2_MOUNTINFO, v2_yes,
     Resolved(2, "/x", "/sys/fs/cgroup", "/", "/sys/fs/cgroup/x")),
]


@pytest.mark.parametrize(("name", "cgroup", "mountinfo", "v2_check", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_resolves(name: str, cgroup: str, mountinfo: str, v2_check: object,
                  expected: Resolved) -> None:
    assert discovery.resolve(cgroup, mountinfo, v2_check) == expected  # type: ignore[arg-type]


UNRESOLVED = [
    ("hybrid without memory anywhere", "1:cpu:/\n0::/\n", HYBRID_MOUNTINFO, v2_no,
     "memory controller not enabled"),
    ("process outside the namespace root", "0::/../../other\n", V2_NAMESPACE_MOUNTINFO, v2_yes,
     "outside the visible hierarchy"),
    ("v1 path with /..", "4:memory:/../x\n", HYBRID_MOUNTINFO, v2_no, "outside"),
    ("no containing mount", "4:memory:/ab/c\n", DELEGATED_MOUNTINFO.splitlines()[0], v2_no,
     "no memory mount contains"),
    ("v2 with no cgroup2 mount", V2_CGROUP, "22 1 8:2 / / rw - ext4 /dev/sda2 rw\n", v2_yes,
     "no cgroup2 mount"),
    ("deleted cgroup", "0::/gone (deleted)\n", V2_MOUNTINFO, v2_yes, "deleted"),
    ("empty input", "", "", v2_yes, "empty"),
    ("garbage", "\x00\x01garbage\nnot:a\n", "garbage - line\n", v2_yes, "empty"),
    ("no memory in cgroup file", "1:cpu:/\n", HYBRID_MOUNTINFO, v2_yes, "no memory controller"),
    # Strict numbers: Arabic-Indic and superscript hierarchy ids are not ids.
    ("Arabic-Indic hierarchy id", "\u0664:memory:/x\n", HYBRID_MOUNTINFO, v2_no, "empty"),
    ("superscript hierarchy id", "\u00b2:memory:/x\n", HYBRID_MOUNTINFO, v2_no, "empty"),
    # A NUL (or another control character) from an escape: the line is refused, and why.
    ("NUL escape in the memory mount point", HYBRID_CGROUP,
     "35 31 0:32 / /sys/fs/cgroup/mem\\000ory rw - cgroup cgroup rw,memory\n", v2_no,
     "escape \\000"),
    ("control escape in the v2 mount point", V2_CGROUP,
     "35 24 0:30 / /sys/fs/\\001cg rw - cgroup2 cgroup2 rw\n", v2_yes, "escape \\001"),
    ("non-ASCII escape in the mount root", "4:memory:/a\n",
     "35 31 0:32 /\\777 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", v2_no,
     "escape \\777"),
    ("raw NUL in the mount point (not kernel output)", HYBRID_CGROUP,
     "35 31 0:32 / /sys/fs/cgroup/mem\x00ory rw - cgroup cgroup rw,memory\n", v2_no,
     "control character"),
    ("raw NUL in the cgroup path", "4:memory:/a\x00b\n", HYBRID_MOUNTINFO, v2_no,
     "control character"),
    # '..' in a mount point would read outside a fake root: refused.
    ("mount point with '..'", HYBRID_CGROUP,
     "35 31 0:32 / /sys/fs/cgroup/../../../etc rw - cgroup cgroup rw,memory\n", v2_no,
     "'..' component"),
    ("relative mount point", V2_CGROUP, "35 24 0:30 / sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
     v2_yes, "not absolute"),
    ("'..' as a middle component of the cgroup path", "0::/a/../b\n", V2_MOUNTINFO, v2_yes,
     "outside the visible hierarchy"),
    ("v2 ' (deleted)' suffix on the whole path", "0::/a/b (deleted)\n", V2_MOUNTINFO, v2_yes,
     "deleted"),
]


@pytest.mark.parametrize(("name", "cgroup", "mountinfo", "v2_check", "why"), UNRESOLVED,
                         ids=[c[0] for c in UNRESOLVED])
def test_unresolved_says_why(name: str, cgroup: str, mountinfo: str, v2_check: object,
                             why: str) -> None:
    result = discovery.resolve(cgroup, mountinfo, v2_check)  # type: ignore[arg-type]
    assert isinstance(result, Unresolved)
    assert why in result.reason


@pytest.mark.parametrize(("raw", "expected"), [
    ("/plain", "/plain"),
    ("/a\\040b", "/a b"),
    ("/tab\\011x", "/tab\tx"),
    ("/nl\\012x", "/nl\nx"),
    ("/back\\134slash", "/back\\slash"),
    ("/not\\08escape", "/not\\08escape"),
    ("/printable\\101", "/printableA"),  # not what the kernel writes, but harmless
])
def test_unescape(raw: str, expected: str) -> None:
    assert discovery.unescape_mount_path(raw) == expected


@pytest.mark.parametrize("raw", ["/nul\\000", "/bell\\007", "/esc\\033x", "/del\\177",
                                 "/high\\200", "/max\\777"])
def test_unescape_refuses_what_the_kernel_never_escapes(raw: str) -> None:
    with pytest.raises(ValueError, match="never escapes"):
        discovery.unescape_mount_path(raw)


def test_refused_mount_lines_say_why() -> None:
    text = ("35 31 0:32 / /a\\000 rw - cgroup cgroup rw,memory\n"
            "36 31 0:33 / /b/.. rw - cgroup2 cgroup2 rw\n"
            "37 31 0:34 / /c\\000 rw - ext4 /dev/sda rw\n"  # not cgroup: skipped, no reason
            + V2_MOUNTINFO)
    mounts, refused = discovery.parse_mountinfo_checked(text)
    assert [m.mount_point for m in mounts] == ["/sys/fs/cgroup"]
    assert len(refused) == 2
    assert "\\000" in refused[0] and "'..'" in refused[1]


@pytest.mark.parametrize(("ancestor", "path", "expected"), [
    ("/", "/a", True),
    ("/a", "/a", True),
    ("/a", "/a/b", True),
    ("/a/b", "/a/bc", False),
    ("/a/", "/a/b", True),
    ("/a/b", "/a", False),
])
def test_path_contains_whole_components(ancestor: str, path: str, expected: bool) -> None:
    assert discovery.path_contains(ancestor, path) is expected


def test_proc_cgroup_path_with_colons() -> None:
    lines = discovery.parse_proc_cgroup("0::/a:b:c\n")
    assert lines == [discovery.CgroupLine(0, (), "/a:b:c")]


def test_mountinfo_skips_non_cgroup_and_short_lines() -> None:
    text = "1 2 3\n" + V2_MOUNTINFO + "x y z w v u t - \n"
    assert [m.fstype for m in discovery.parse_mountinfo(text)] == ["cgroup2"]
