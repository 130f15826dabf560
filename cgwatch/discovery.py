"""Internal. Find the process's memory cgroup directory from /proc/self/cgroup and
/proc/self/mountinfo.

Pure functions on text: no file is read here, so every rule is table-tested with real-world
inputs (tests/test_discovery.py). The I/O layer (tree.py) feeds them the files' contents.
"""

from __future__ import annotations

from . import values
from .frozen import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional, Union


class CgroupLine(Frozen):
    """One line of /proc/<pid>/cgroup: `hierarchy-ID:controller-list:path`."""

    __slots__ = _fields = ("hierarchy_id", "controllers", "path")
    hierarchy_id: int
    controllers: tuple[str, ...]
    path: str

    def __init__(self, hierarchy_id: int, controllers: tuple[str, ...], path: str) -> None:
        fill(self, locals())


class Mount(Frozen):
    """The fields of one /proc/<pid>/mountinfo line that discovery needs."""

    __slots__ = _fields = ("root", "mount_point", "fstype", "super_options", "mount_id",
                           "parent_id")
    root: str
    mount_point: str
    fstype: str
    super_options: tuple[str, ...]
    mount_id: int  # fields 1 and 2 of the line; -1 when not a number (never kernel output)
    parent_id: int

    def __init__(self, root: str, mount_point: str, fstype: str,
                 super_options: tuple[str, ...], mount_id: int = -1,
                 parent_id: int = -1) -> None:
        fill(self, locals())


class Resolved(Frozen):
    """Where the memory hierarchy's files for this process live."""

    __slots__ = _fields = ("version", "cgroup_path", "mount_point", "mount_root", "directory")
    version: int  # 1 or 2
    cgroup_path: str  # the process's path inside the hierarchy, e.g. /kubepods/pod1/ctr
    mount_point: str  # where that hierarchy (or the part of it we can see) is mounted
    mount_root: str  # the hierarchy path shown at mount_point
    directory: str  # mount_point + cgroup_path with mount_root removed

    def __init__(self, version: int, cgroup_path: str, mount_point: str, mount_root: str,
                 directory: str) -> None:
        fill(self, locals())


class Unresolved(Frozen):
    """No trustworthy memory cgroup: callers fall back to host values and report `reason`.
    `transient`: a file could not be read (descriptors exhausted, say), not a fact about the
    process's cgroup; the caller may keep what it knew and retry."""

    __slots__ = _fields = ("reason", "transient")
    reason: str
    transient: bool

    def __init__(self, reason: str, transient: bool = False) -> None:
        fill(self, locals())


if TYPE_CHECKING:
    Resolution = Union[Resolved, Unresolved]

# The kernel escapes only space, tab, newline and backslash in mountinfo paths
# (fs/proc_namespace.c show_mountinfo() calls seq_path_root() with " \\t\\n\\\\"). Any other
# escape giving a control character (NUL above all: open() refuses it) or a non-ASCII code
# point was not written by the kernel, and its line is refused.
_KERNEL_CONTROL_ESCAPES = frozenset("\t\n")
_OCTAL_DIGITS = frozenset("01234567")


def _unescape_one(digits: str) -> str:
    char = chr(int(digits, 8))
    if (char < " " and char not in _KERNEL_CONTROL_ESCAPES) or char > "~":
        raise ValueError(f"escape \\{digits} gives {char!r}, which the kernel never escapes")
    return char


def unescape_mount_path(field: str) -> str:
    """Undo the kernel's octal escapes in mountinfo paths (`\\040` space, `\\011` tab, ...):
    a backslash and exactly three octal digits; any other backslash stays as it is.

    Raises ValueError for an escape the kernel never writes (NUL, other control characters,
    non-ASCII code points)."""
    at = field.find("\\")
    if at < 0:
        return field
    parts = []
    start = 0
    while at >= 0:
        digits = field[at + 1:at + 4]
        if len(digits) == 3 and _OCTAL_DIGITS.issuperset(digits):
            parts.append(field[start:at])
            parts.append(_unescape_one(digits))
            start = at + 4
            at = field.find("\\", start)
        else:
            at = field.find("\\", at + 1)
    parts.append(field[start:])
    return "".join(parts)


# Control characters other than the tab and newline the kernel escapes, and DEL. One set
# test in C, not a Python loop over characters: this runs on every mountinfo line at each
# resolve (no `re`: its import costs ~2 ms of `import cgwatch`).
_CONTROL = frozenset([chr(c) for c in range(0x20) if c not in (0x09, 0x0A)] + ["\x7f"])


def _has_control(path: str) -> bool:
    return not _CONTROL.isdisjoint(path)


def mount_point_problem(mount_point: str) -> Optional[str]:
    """Why a mount point from mountinfo cannot be used: not absolute, a control character (NUL
    cannot be opened), or a `..` component (joined under a fake `root=`, it would name a file
    outside that root)."""
    if not mount_point.startswith("/"):
        return f"mount point {mount_point!r} is not absolute"
    if _has_control(mount_point):
        return f"mount point {mount_point!r} has a control character"
    if ".." in mount_point.split("/"):
        return f"mount point {mount_point!r} has a '..' component"
    return None


def parse_proc_cgroup(text: str) -> list[CgroupLine]:
    """Parse /proc/self/cgroup; malformed lines are skipped (the caller decides what is missing)."""
    lines = []
    for raw in text.splitlines():
        # The path may itself contain ':' so split at most twice.
        parts = raw.split(":", 2)
        if len(parts) != 3 or not values.is_number(parts[0]):
            continue
        controllers = tuple(c for c in parts[1].split(",") if c)
        lines.append(CgroupLine(int(parts[0]), controllers, parts[2]))
    return lines


def parse_mountinfo(text: str) -> list[Mount]:
    """The usable cgroup and cgroup2 mounts of /proc/self/mountinfo (see
    `parse_mountinfo_checked`, which also says why a cgroup line was refused)."""
    return parse_mountinfo_checked(text)[0]


def parse_mountinfo_checked(text: str) -> tuple[list[Mount], list[str]]:
    """Parse the cgroup and cgroup2 mounts of /proc/self/mountinfo (other mounts are skipped);
    also return why each refused cgroup line was refused (a bad escape, a `..` mount point).

    Layout (proc(5)): id parent major:minor root mount-point options [optional...] - fstype
    source super-options. The optional fields vary in number, so the fstype is found after the
    lone '-' separator rather than at a fixed index.
    """
    mounts = []
    refused = []
    for raw in text.splitlines():
        fields = raw.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 3:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        super_options = tuple(fields[sep + 3].split(",")) if len(fields) > sep + 3 else ()
        try:
            root = unescape_mount_path(fields[3])
            mount_point = unescape_mount_path(fields[4])
        except ValueError as e:
            refused.append(f"{fstype} mount line refused: {e}")
            continue
        problem = mount_point_problem(mount_point)
        if problem:
            refused.append(f"{fstype} mount refused: {problem}")
            continue
        mount_id, parent_id = _ids(fields)
        mounts.append(Mount(root=root, mount_point=mount_point, fstype=fstype,
                            super_options=super_options, mount_id=mount_id,
                            parent_id=parent_id))
    return mounts, refused


def path_contains(ancestor: str, path: str) -> bool:
    """True if `path` is `ancestor` or below it, compared on whole components."""
    if ancestor == "/":
        return path.startswith("/")
    return path == ancestor or path.startswith(ancestor.rstrip("/") + "/")


def join_under_mount(mount: Mount, cgroup_path: str) -> str:
    """The directory of `cgroup_path` seen through `mount` (which must contain it)."""
    rest = cgroup_path[len(mount.root) :] if mount.root != "/" else cgroup_path
    rest = rest.strip("/")
    base = mount.mount_point.rstrip("/") or "/"
    if not rest:
        return base
    return base + "/" + rest if base != "/" else "/" + rest


def _ids(fields: list[str]) -> tuple[int, int]:
    """The mount ID and parent ID of a split mountinfo line; -1 for one that is not a
    number of ASCII digits (never kernel output: a table row may lack them)."""
    ids = [int(f) if f.isdigit() and f.isascii() else -1 for f in fields[:2]]
    return (ids[0], ids[1]) if len(ids) == 2 else (-1, -1)


def _line_mounts(text: str) -> list[tuple[int, int, str, tuple[str, str, str]]]:
    """(mount ID, parent ID, mount point, (root, mount point, fstype)) of every mountinfo
    line, any file system, in order."""
    found = []
    for raw in text.splitlines():
        fields = raw.split(" ", 6)
        if len(fields) < 7:
            continue
        root, point = fields[3], fields[4]
        try:
            if "\\" in root:
                root = unescape_mount_path(root)
            if "\\" in point:
                point = unescape_mount_path(point)
        except ValueError:
            continue
        _, sep, after = (" " + fields[6]).partition(" - ")
        mount_id, parent_id = _ids(fields)
        found.append((mount_id, parent_id, point,
                      (root, point, after.split(" ", 1)[0] if sep else "")))
    return found


def _line_of(m: Mount, lines: list[tuple[int, int, str, tuple[str, str, str]]]) -> int:
    """The index of `m`'s own line: by its mount ID, else the last line that shows it."""
    key = (m.root, m.mount_point, m.fstype)
    if m.mount_id >= 0:
        return next((i for i, line in enumerate(lines) if line[0] == m.mount_id), -1)
    return max((i for i, line in enumerate(lines) if line[3] == key), default=-1)


def covered_mounts(text: str, mounts: list[Mount]) -> list[Mount]:
    """The mounts of `mounts` that another mount of the namespace covers, decided from the
    mount tree (mount ID and parent ID, fields 1 and 2), not from line order.

    A path resolves through the topmost mount at each directory. A mount made on a directory
    that already has one is stacked on top of it, so its parent is the mount it hides (the
    kernel's attach_recursive_mnt(); since 4.11 a mount propagated under an existing one is
    "tucked" beneath it and the existing one's parent changes to it, so the tree stays the
    stacking order). So mount N covers mount M when N's mount point is M's or above it, N is
    not one of M's ancestors, and N's parent is the mount of M's ancestry (M itself included)
    through which M's path crosses N's mount point: N sits on the path to M. A runtime
    bind-mounting a container's own cgroup over /sys/fs/cgroup/memory makes the original
    mount its parent and covers it (checked on 6.18).

    Line order is not mount order: 6.18 lists a namespace's mounts by creation, so a mount
    moved onto a newer one (`mount --move`) comes before the mount it now sits on, and
    OpenJDK's container tests use a hybrid layout whose memory line comes before the
    /sys/fs/cgroup tmpfs it is mounted on. Only where the ancestry is not all listed (it does
    not reach a mount at "/": a hand-written table, or a parent outside the process's root)
    does a later line at or above the mount point, whose parent is not listed among the
    ancestors, count as covering, the rule before mount IDs were read.
    """
    lines = _line_mounts(text)
    index: dict[int, int] = {}
    for i, line in enumerate(lines):
        if line[0] >= 0:
            index.setdefault(line[0], i)
    return [m for m in mounts if _is_covered(_line_of(m, lines), lines, index)]


def _is_covered(at: int, lines: list[tuple[int, int, str, tuple[str, str, str]]],
                index: dict[int, int]) -> bool:
    """Whether another line covers the mount of line `at` (see covered_mounts)."""
    if at < 0:
        return False
    chain = [at]  # its line, its parent's, ... as far as the lines show them
    while True:
        up = index.get(lines[chain[-1]][1], -1)
        if up < 0 or up in chain:
            break
        chain.append(up)
    ids = {lines[i][0] for i in chain if lines[i][0] >= 0}
    complete = lines[chain[-1]][2] == "/"
    own_point = lines[at][2]
    for j, (_, parent, point, _) in enumerate(lines):
        if j in chain or not path_contains(point, own_point):
            continue
        if parent in ids:
            crossing = next((lines[i][0] for i in chain if path_contains(lines[i][2], point)),
                            None)
            if parent == crossing:
                return True
        elif not complete and j > at:
            return True
    return False


def _leading_dotdots(path: str) -> list[str]:
    parts = path.split("/")[1:]
    count = 0
    while count < len(parts) and parts[count] == "..":
        count += 1
    return parts[:count]


def _contains(root: str, cgroup_path: str) -> bool:
    """path_contains for a mount root and a cgroup path that the kernel may both print relative
    to our cgroup namespace's root ("/../.." and "/../../x": the host's cgroupfs bind-mounted
    into a container with a private cgroup namespace). Both texts are relative to the same
    root, so the directory is exact, but only when the root climbs exactly as far as the path
    does: "/" does not contain "/../..x" here, whatever the string prefix says."""
    if _leading_dotdots(root) != _leading_dotdots(cgroup_path):
        return False
    return path_contains(root, cgroup_path)


def _candidates(mounts: list[Mount], cgroup_path: str) -> list[Mount]:
    """The mounts whose root contains the path, best first: the shortest root (it shows the
    most ancestors, so the walk up sees every limit it can; a delegated subtree mounted
    elsewhere, possibly listed first, loses to the full mount), then one under /sys/fs/cgroup
    (where runtimes and systemd put it; the JDK prefers it too), then mountinfo order."""
    containing = [m for m in mounts if _contains(m.root, cgroup_path)]
    return sorted(containing, key=lambda m: (len(m.root.rstrip("/")),
                                             not path_contains("/sys/fs/cgroup", m.mount_point)))


def _best_mount(mounts: list[Mount], cgroup_path: str,
                usable: Optional[Callable[[str], bool]]) -> Optional[Mount]:
    """The first candidate whose directory for the path is usable (`usable(directory)`, the
    caller's I/O; None: the first candidate). A duplicate mount whose copy is unusable (say,
    removed under us) falls through to the next."""
    candidates = _candidates(mounts, cgroup_path)
    for mount in candidates:
        if usable is None or usable(join_under_mount(mount, cgroup_path)):
            return mount
    return None


def _path_problem(path: str, version: int) -> Optional[str]:
    """Why a /proc/self/cgroup path names no directory we can read, compared on whole
    components: names like `..x`, `...` or `x (deleted)` inside the path are legal cgroups."""
    if not path.startswith("/"):
        return f"cgroup path {path!r} is not absolute"
    if _has_control(path):
        # Not kernel output (a cgroup name cannot hold NUL); open() would refuse it.
        return f"cgroup path {path!r} has a control character"
    parts = path.split("/")[1:]
    leading = len(_leading_dotdots(path))
    if ".." in parts[leading:]:
        # Only leading '..' components are kernel output: the process's cgroup is outside
        # this cgroup namespace's root, and the kernel prints the path relative to that root
        # (a mount whose root is printed the same way can still show it: see _candidates).
        return f"cgroup path {path!r} is outside the visible hierarchy"
    if version == 2 and path.endswith(" (deleted)"):
        # Only v2 appends " (deleted)" to the whole path of a removed cgroup
        # (kernel/cgroup/cgroup.c proc_cgroup_show(), cgroup_on_dfl() && cgroup_is_dead()).
        # A live cgroup whose own name ends so cannot be told apart there and is refused with
        # this reason; on v1 the kernel never appends it, so there it is a name.
        return f"cgroup path {path!r} is deleted (or its name ends with ' (deleted)')"
    return None


def _no_mount(mounts: list[Mount], cgroup_path: str, kind: str) -> str:
    """Why no mount was chosen: none contains the path, or no copy's directory exists."""
    candidates = _candidates(mounts, cgroup_path)
    if not candidates and _leading_dotdots(cgroup_path):
        return (f"cgroup path {cgroup_path!r} is outside the visible hierarchy (no mount "
                "root climbs as far)")
    if not candidates:
        return f"no {kind} mount contains {cgroup_path!r}"
    return (f"cgroup directory {join_under_mount(candidates[0], cgroup_path)} does not exist"
            + (f" (nor in {len(candidates) - 1} other mount(s))" if len(candidates) > 1 else ""))


def resolve(
    proc_cgroup: str,
    mountinfo: str,
    v2_has_memory: Callable[[str], bool],
    usable: Optional[Callable[[str], bool]] = None,
) -> Resolution:
    """Pick the memory hierarchy and the process's directory in it.

    v1 wins when a v1 line lists `memory` and a v1 mount carries it: on a hybrid host the
    cgroup2 mount lacks the memory controller. Otherwise the `0::` line is used if its mount's
    `cgroup.controllers` lists memory, which only the caller can read: `v2_has_memory` is called
    with the candidate mount point. Mounts another mount covers (`covered_mounts`) are
    skipped; `usable` (the caller's check that a candidate's directory exists) lets a
    duplicate fall through.
    """
    lines = parse_proc_cgroup(proc_cgroup)
    mounts, refused = parse_mountinfo_checked(mountinfo)
    covered = covered_mounts(mountinfo, mounts)
    mounts = [m for m in mounts if m not in covered]
    reasons = []

    v1_line = next(
        (ln for ln in lines if ln.hierarchy_id != 0 and "memory" in ln.controllers), None
    )
    if v1_line is not None:
        problem = _path_problem(v1_line.path, 1)
        v1_mounts = [m for m in mounts if m.fstype == "cgroup" and "memory" in m.super_options]
        mount = None if problem else _best_mount(v1_mounts, v1_line.path, usable)
        if problem:
            reasons.append(f"v1: {problem}")
        elif mount is None:
            reasons.append(f"v1: {_no_mount(v1_mounts, v1_line.path, 'memory')}")
        else:
            return Resolved(1, v1_line.path, mount.mount_point, mount.root,
                            join_under_mount(mount, v1_line.path))

    v2_line = next((ln for ln in lines if ln.hierarchy_id == 0 and ln.controllers == ()), None)
    if v2_line is not None:
        problem = _path_problem(v2_line.path, 2)
        v2_mounts = [m for m in mounts if m.fstype == "cgroup2"]
        mount = None if problem else _best_mount(v2_mounts, v2_line.path, usable)
        if problem:
            reasons.append(f"v2: {problem}")
        elif mount is None:
            reasons.append(f"v2: {_no_mount(v2_mounts, v2_line.path, 'cgroup2')}")
        elif not v2_has_memory(mount.mount_point):
            reasons.append(f"v2: memory controller not enabled at {mount.mount_point}")
        else:
            return Resolved(2, v2_line.path, mount.mount_point, mount.root,
                            join_under_mount(mount, v2_line.path))

    if not lines:
        reasons.append("/proc/self/cgroup is empty or unreadable")
    elif v1_line is None and v2_line is None:
        reasons.append("no memory controller in /proc/self/cgroup")
    reasons.extend(refused)
    return Unresolved("; ".join(reasons))
