"""Internal. Read the cgroup tree from disk: resolve the process's directory and build its
levels.

This is the I/O edge for cgroup files. A level is one directory on the path from the
process's memory cgroup up to the top of the visible hierarchy; each carries its hard limit
and the process's shared `KeptDir` of that directory (kept.py), where the limited levels
have their usage and memory.stat descriptors opened at once (the hot path reads them).
"""

from __future__ import annotations

import os

from . import discovery, names, values
from .files import read_file, under_root
from .frozen import Frozen, fill, replace
from .kept import KeptDir, kept_dir
from .names import FileNames

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional


class Level(Frozen):
    """One directory on the path; `limit` None means no hard limit at this level."""

    __slots__ = _fields = ("cgroup_path", "directory", "limit", "problem", "kept", "hidden")
    _compared = ("cgroup_path", "directory", "limit", "problem", "hidden")  # not `kept`
    cgroup_path: str
    directory: str
    limit: Optional[int]
    problem: Optional[str]  # why the limit could not be read, if so
    kept: Optional[KeptDir]
    # A v1 limit above the visible hierarchy, known only from the top visible level's
    # memory.stat; `directory` and `kept` are that top level's (its usage is a floor of the
    # hidden level's, so the headroom computed from it is an upper bound).
    hidden: bool

    def __init__(self, cgroup_path: str, directory: str, limit: Optional[int],
                 problem: Optional[str] = None, kept: Optional[KeptDir] = None,
                 hidden: bool = False) -> None:
        fill(self, locals())

    def read(self, name: str) -> bytes:
        """A file of this level through the process's kept descriptor (raises OSError)."""
        kept = self.kept if self.kept is not None else kept_dir(self.directory)
        return kept.read(name)


def v2_has_memory(root: str) -> Callable[[str], bool]:
    """A check that a cgroup2 mount lists the memory controller (hybrid hosts do not)."""

    def check(mount_point: str) -> bool:
        try:
            text = read_file(os.path.join(under_root(root, mount_point), names.CONTROLLERS))
        except OSError:
            return False
        return "memory" in text.split()

    return check


def resolve_process(root: str, pid: Optional[int] = None) -> tuple[discovery.Resolution, str]:
    """Resolve the process's memory cgroup under `root`; also return the /proc/self/cgroup text
    so the caller can later tell whether the process moved.

    Another process (`pid`) is resolved in ITS mount namespace: /proc/PID/cgroup and the
    mount roots in /proc/PID/mountinfo are both printed relative to OUR cgroup namespace
    (`proc_cgroup_show()` and `cgroup_show_path()` use the reader's, kernel/cgroup/cgroup.c;
    a sidecar in a private namespace reads "/../app" in both, checked on 6.18 v1 and 6.1 v2),
    so they agree with each other, and its mount points are paths in its own mount namespace
    (relative to its root: `show_mountinfo()`). They are read there, under /proc/PID/root,
    unless its mountinfo reads exactly as ours: then it is our namespace and our root (mount
    IDs are unique per mount, so another namespace never prints the same text), and our own
    paths serve, with no ptrace permission needed."""
    try:
        proc_cgroup = read_file(under_root(root, names.proc_file("cgroup", pid)))
    except OSError as e:
        return discovery.Unresolved(f"cannot read {names.proc_file('cgroup', pid)}: "
                                    f"{e.strerror or e}",
                                    transient=True), ""
    try:
        mountinfo = read_file(under_root(root, names.proc_file("mountinfo", pid)))
    except OSError as e:
        return discovery.Unresolved(f"cannot read {names.proc_file('mountinfo', pid)}: "
                                    f"{e.strerror or e}",
                                    transient=True), \
            proc_cgroup
    through = "" if pid is None else _other_namespace_root(root, pid, mountinfo)
    if through:
        try:
            os.stat(under_root(root, through))
        except OSError as e:
            # ptrace read access is needed (proc_root_link()); without it our own paths
            # would name OUR namespace's cgroups, not the process's.
            return discovery.Unresolved(f"process {pid} has another mount namespace, and "
                                        f"{through} cannot be reached: "
                                        f"{e.strerror or e}"), proc_cgroup
    files = under_root(root, through) if through else root

    def usable(directory: str) -> bool:
        return os.path.isdir(under_root(files, directory))

    resolution = discovery.resolve(proc_cgroup, mountinfo, v2_has_memory(files), usable)
    if through and isinstance(resolution, discovery.Resolved):
        resolution = replace(resolution, mount_point=through + resolution.mount_point,
                             directory=through + resolution.directory)
    return resolution, proc_cgroup


def _other_namespace_root(root: str, pid: int, mountinfo: str) -> str:
    """"/proc/PID/root" when the process's mountinfo differs from ours (another mount
    namespace or root), else "" (our own paths name its files)."""
    try:
        ours = read_file(under_root(root, names.PROC_MOUNTINFO))
    except OSError:
        ours = ""
    return "" if ours == mountinfo else f"/proc/{int(pid)}/root"


def level_paths(resolved: discovery.Resolved) -> list[tuple[str, str]]:
    """(cgroup path, directory) from the process's cgroup up to the mount's top, leaf first."""
    pairs = []
    cgroup_path = resolved.cgroup_path.rstrip("/") or "/"
    directory = resolved.directory.rstrip("/") or "/"
    top = resolved.mount_point.rstrip("/") or "/"
    while True:
        pairs.append((cgroup_path, directory))
        if directory == top or directory == "/":
            return pairs
        directory = os.path.dirname(directory)
        cgroup_path = os.path.dirname(cgroup_path)


def _v1_parent_accounts_children(directory: str) -> bool:
    """v1 with use_hierarchy=0 (old kernels) does not charge children to the parent, so its
    limit does not bind them. Missing file: hierarchical (v2, or kernels that dropped it)."""
    try:
        return read_file(os.path.join(directory, names.USE_HIERARCHY)).strip() != "0"
    except OSError:
        return True


def build_levels(
    root: str,
    resolved: discovery.Resolved,
    previous: tuple[Level, ...] = (),
) -> tuple[Level, ...]:
    """Read every level's limit; open the usage and memory.stat descriptors of the limited
    ones (shared per directory with every other user in the process, kept.py).

    Raises OSError only if the process's own directory is gone. `previous` is accepted for
    the caller's convenience: descriptors are shared through kept.py, so nothing is reopened.
    """
    del previous
    fnames = FileNames.for_version(resolved.version)
    levels = []
    for index, (cgroup_path, shown_dir) in enumerate(level_paths(resolved)):
        directory = under_root(root, shown_dir)
        if index == 0 and not os.path.isdir(directory):
            raise FileNotFoundError(f"cgroup directory {directory} does not exist")
        if index > 0 and resolved.version == 1 and not _v1_parent_accounts_children(directory):
            break
        kept = kept_dir(directory)
        limit, problem, _ = _read_limit(kept, fnames, cgroup_path)
        if limit is not None:
            problem = _open_usage(kept, fnames, cgroup_path)
        levels.append(Level(cgroup_path, directory, limit, problem, kept))
    if resolved.version == 1 and levels:
        hidden = hidden_v1_limit(levels[-1])
        if hidden is not None:
            levels.append(hidden)
    return tuple(levels)


def _read_limit(kept: KeptDir, fnames: FileNames,
                cgroup_path: str) -> tuple[Optional[int], Optional[str], bool]:
    """(limit, problem, read): the level's hard limit through its kept descriptor. `read` is
    False when the file could not be read or parsed now (the caller may keep what it knew).
    v2 has no memory.max where the memory controller is not enabled, and never at the root:
    no limit there. Every v1 memory cgroup has memory.limit_in_bytes: its absence is a problem
    to say."""
    try:
        return values.parse_limit(kept.read(fnames.limit), fnames.version), None, True
    except FileNotFoundError as e:
        return None, (f"{fnames.limit} at {cgroup_path}: {e}" if fnames.version == 1
                      else None), True
    except (OSError, ValueError) as e:
        return None, f"{fnames.limit} at {cgroup_path}: {e}", False


def _open_usage(kept: KeptDir, fnames: FileNames, cgroup_path: str) -> Optional[str]:
    """Open a limited level's usage and memory.stat descriptors (the hot path preads them);
    why not, if they cannot be."""
    try:
        kept.fd(fnames.usage)
        kept.fd(names.STAT)
    except OSError as e:
        return f"cannot open usage files at {cgroup_path}: {e.strerror or e}"
    return None


HIERARCHICAL_LIMIT = b"hierarchical_memory_limit"
# Only a v1 hierarchy's real root has this file, also when a cgroup namespace shows another
# cgroup as "/" (checked on 6.18).
ROOT_ONLY = "cgroup.sane_behavior"


def hidden_v1_limit(top: Level) -> Optional[Level]:
    """The limit above the top visible level, when v1 shows one lower than every visible
    limit: `hierarchical_memory_limit` in memory.stat is the smallest limit on the top
    level's whole path, including ancestors a subtree mount hides (crun, and Docker on v1
    without a cgroup namespace, bind-mount only the container's own cgroup; checked on 6.18:
    314572800 there while memory.limit_in_bytes said unlimited)."""
    if os.path.exists(os.path.join(top.directory, ROOT_ONLY)):
        return None  # the hierarchy's real root: nothing above it (and its memory.stat is slow)
    try:
        value = values.find_stat_value(top.read(names.STAT), HIERARCHICAL_LIMIT)
    except (OSError, ValueError):
        return None
    if value >= values.V1_UNLIMITED_THRESHOLD or (top.limit is not None and value >= top.limit):
        return None
    return Level(f"(above {top.cgroup_path})", top.directory, value, None, top.kept, hidden=True)


def reread_limits(root: str, resolved: discovery.Resolved,
                  old: tuple[Level, ...]) -> Optional[tuple[Level, ...]]:
    """The known levels with freshly read limits; None if the process's directory is gone.

    Through the levels' kept descriptors (a pread each), not a new walk: the levels are the
    ones resolved, and only their limits may have changed. A limit that cannot be read right
    now (a writer truncated the file and has not written yet, say) keeps its last good value
    rather than vanishing from the minimum."""
    visible = [lvl for lvl in old if not lvl.hidden]
    if not visible:
        try:
            return build_levels(root, resolved)
        except OSError:
            return None
    fnames = FileNames.for_version(resolved.version)
    fresh = []
    for index, lvl in enumerate(visible):
        kept = lvl.kept if lvl.kept is not None else kept_dir(lvl.directory)
        limit, problem, read = _read_limit(kept, fnames, lvl.cgroup_path)
        if not read:
            if index == 0 and not os.path.isdir(lvl.directory):
                return None  # our own directory was removed (ENODEV on its descriptors)
            fresh.append(replace(lvl, problem=problem))  # the last good limit stays
            continue
        if limit is not None and lvl.kept is not None:
            problem = _open_usage(lvl.kept, fnames, lvl.cgroup_path)
        fresh.append(replace(lvl, limit=limit, problem=problem))
    if resolved.version == 1:
        hidden = hidden_v1_limit(fresh[-1])
        if hidden is not None:
            fresh.append(hidden)
    return tuple(fresh)


def changed_limits(levels: tuple[Level, ...], changed: list[tuple[int, str]],
                   version: int) -> Optional[tuple[Level, ...]]:
    """The levels with only the limit files that raised an event re-read, each with one
    pread(2) through its kept descriptor: (level index, path) pairs. None when the full
    re-read is needed instead (the levels changed under the watch, a file is unreadable, a
    level becomes limited and has no usage descriptors yet)."""
    limit_name = FileNames.for_version(version).limit
    lvls = list(levels)
    for index, path in changed:
        if not (0 <= index < len(lvls) and os.path.dirname(path) == lvls[index].directory):
            return None
        lvl = lvls[index]
        try:
            limit = values.parse_limit(lvl.read(limit_name), version)
        except (OSError, ValueError):
            return None
        if (limit is not None and lvl.limit is None) or lvl.problem:
            return None
        lvls[index] = replace(lvl, limit=limit)
    return tuple(lvls)


class ProcCgroup:
    """/proc/self/cgroup as it was when the levels were resolved, and a kept descriptor to
    read it again cheaply (one pread, ~1.2 us here): nothing notifies a move to another cgroup."""

    def __init__(self, root: str, pid: Optional[int] = None) -> None:
        self.path = under_root(root, names.proc_file("cgroup", pid))
        self.seen = b""
        self._kept: Optional[KeptDir] = None

    def remember(self, text: str) -> None:
        self.seen = text.encode()

    def read_now(self) -> Optional[bytes]:
        """The file now; None when it cannot be read (no descriptor left, say)."""
        try:
            if self._kept is None:
                self._kept = kept_dir(os.path.dirname(self.path), check=False)
            return self._kept.pread(os.path.basename(self.path), 65536)
        except OSError:
            self._kept = None
            return None

    def moved(self, reads: Optional[dict[Any, Any]] = None) -> Optional[bool]:
        """Whether the process is in another cgroup now; None when it cannot tell. `reads`:
        what others read at the same moment (ticker.Reads), by path: one read serves every
        monitor of the process."""
        if reads is None:
            now = self.read_now()
        elif self.path in reads:
            now = reads[self.path]
        else:
            now = reads[self.path] = self.read_now()
        return None if now is None else now != self.seen

    def moved_unkept(self) -> Optional[bool]:
        """moved(), reading the file anew without keeping a descriptor (a closed monitor)."""
        try:
            return read_file(self.path).encode() != self.seen
        except OSError:
            return None

    def forget_descriptor(self) -> None:
        """Close (drop) the kept descriptor: after close(), and in a fork child, where a
        /proc/self descriptor opened before the fork describes the parent."""
        self._kept = None


def limit_check(levels: tuple[Level, ...], version: int) -> Callable[[float], bool]:
    """The polling hot path's check, called as `check(0)`: True when a visible level's limit
    file reads other than it did when `levels` were read, or cannot be read (then the query
    re-reads the levels and finds out why). One pread through each kept descriptor: ~1 us a
    level here (6.18), where an inotify poll(0) is ~0.3 us for any number of levels."""
    name = FileNames.for_version(version).limit
    pairs = []
    for lvl in levels:
        if lvl.hidden or lvl.kept is None or lvl.limit is None and not lvl.kept.has(name):
            continue  # no limit file (a v2 root), or a v1 limit no file of ours shows
        try:
            fd = lvl.kept.fd(name)
            seen = os.pread(fd, 64, 0)
            if not lvl.problem and values.parse_limit(seen, version) != lvl.limit:
                seen = b"\0"  # written since the levels were read: the first check says so
        except (OSError, ValueError):
            seen = b"\0"
            fd = -1
        pairs.append((fd, seen))
    frozen = tuple(pairs)
    pread = os.pread

    def changed(_timeout: float = 0.0) -> bool:
        try:
            for fd, seen in frozen:
                if pread(fd, 64, 0) != seen:
                    return True
        except OSError:
            return True
        return False

    return changed


def hidden_limit_moved(levels: tuple[Level, ...],
                       reads: Optional[dict[Any, Any]] = None) -> bool:
    """v1: whether the limit above the visible top changed (appeared, went, or moved). No
    inotify event reaches it, so the tracker asks with each confirmation (one memory.stat
    read, none at a hierarchy's real root; on the timer, one per top directory for every
    monitor: `reads`, as ProcCgroup.moved)."""
    if not levels:
        return False
    hidden = levels[-1] if levels[-1].hidden else None
    top = levels[-2] if hidden is not None and len(levels) > 1 else levels[-1]
    if top.kept is None:
        return False
    key = ("hidden", top.directory)
    if reads is not None and key in reads:
        now = reads[key]
    else:
        now = hidden_v1_limit(top)
        if reads is not None:
            reads[key] = now
    return (now.limit if now is not None else None) != (hidden.limit if hidden else None)
