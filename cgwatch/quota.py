"""Internal. How much of the uid's inotify quota a process may take, and the switch that
keeps cgwatch off inotify.

The kernel counts inotify instances per user: fs.inotify.max_user_instances (128 by
default), or per user namespace user.max_inotify_instances, with each ancestor namespace's
count charged too (kernel/ucount.c, inc_ucount). Every process of the uid shares that count,
so cgwatch imported by every Python process of a node (8 ranks x a fork pool of 16) took all
128, and `tail -F`, an editor, the kubelet or the container runtime of that uid got EMFILE.

The rule (docs/design.md, "Sharing the uid's inotify quota"): a process holds at most one
instance, shared by all its monitors (watchhub.py), and takes it only when, with it taken,
at least `reserve(limit)` more could still be made by the uid: min(32, max(4, limit // 8)),
16 of the default 128. Whether that many are left is probed: creating reserve + 1 instances
and closing all but ours costs ~2 us each here (6.18), once per process and per retry; the
probe finds every limit on the way up the namespaces, which the sysctl alone does not show.
A process that found too few polls (exactly: tree.limit_check) and tries again after a
back-off that doubles from 1 s to 64 s, spread by half either way (a pool refused at once
must not probe at once again), so it does not take back at once what another program freed.

A probe that finds too few has, for a few microseconds, held every instance the uid had
left: 300 processes of one uid starting together probed 188 times near the limit, and a
same-uid program's inotify_init1 failed 67-86 times. So a probe is made only when the uid's
instances were *counted* (the anon_inode:inotify descriptors of its processes in /proc) and
reserve + 1 + MARGIN were free, and one process of the uid at a time decides: under a lock
on a per-uid file (`shared_path`) that also keeps the last count for FRESH seconds, lowered
by each instance a cgwatch process takes. Counting costs ~0.1 ms per process of the uid, so
a burst counts once per FRESH seconds, not once per process (`take_counted`).
"""

from __future__ import annotations

import os

from .envswitch import switch_off
from .frozen import Frozen, fill
from .ownfile import open_own

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Callable, Optional

DEFAULT_LIMIT = 128  # fs.inotify.max_user_instances when no file says otherwise
# The per-namespace file first (it is the one a namespace's root can lower), then the
# host-wide sysctl (the same count in the initial namespace).
LIMIT_FILES = ("/proc/sys/user/max_inotify_instances", "/proc/sys/fs/inotify/max_user_instances")
FIRST_BACKOFF = 1.0  # seconds before the first retry after the quota said no
MAX_BACKOFF = 64.0  # the longest wait between tries (a polling process stays exact anyway)
# Instances a count may miss by the time the probe runs (another program of the uid opening
# one meanwhile, a process whose descriptors /proc does not show): the probe then still stops
# short of the limit.
MARGIN = 2
# How long a count is trusted (seconds), lowered by every instance cgwatch takes meanwhile: a
# burst of starting processes counts about once per FRESH, and an instance freed by another
# program is seen at most FRESH later (a polling process is exact meanwhile).
FRESH = 10.0
# Where the per-uid file may live, in order (the first one that can hold it); $XDG_RUNTIME_DIR
# goes second: it differs between a login session and a service of the same uid.
SHARED_DIRS = ("/dev/shm", "$XDG_RUNTIME_DIR", "/tmp")
COUNT = "count"
PROBE = "probe"
REFUSE = "refuse"
_RECORD_TAG = "cgwatch-inotify-count 1"


def inotify_allowed(environ: Mapping[str, str]) -> bool:
    """CGWATCH_INOTIFY=0 (or no, false, off) keeps every monitor of the process off inotify:
    for an operator whose node must leave the uid's instances to other programs. Parsed as
    every CGWATCH_* switch is (envswitch.py)."""
    return not switch_off("CGWATCH_INOTIFY", environ)


def reserve(limit: int) -> int:
    """Instances left to the uid's other programs: an eighth of the limit, at least 4 (what a
    shell session's `tail -F` and an editor need) and at most 32 (probing costs one
    inotify_init1 each, and a limit raised to 8192 was raised for the other programs)."""
    return min(32, max(4, limit // 8))


def backoff(failures: int, spread: float = 0.5) -> float:
    """Seconds to wait before the next try after `failures` refusals in a row, times 0.5 to
    1.5 by `spread` (0..1): a fork pool refused at once must not probe again at once (each
    probe holds reserve + 1 instances for a few us, and many at once held all of them)."""
    base = min(MAX_BACKOFF, FIRST_BACKOFF * 2.0 ** max(0, failures - 1))
    return float(base * (0.5 + spread))


def parse_limit(text: str) -> int:
    """A max_user_instances value; ValueError on anything but a non-negative number."""
    value = int(text.strip())
    if value < 0:
        raise ValueError(f"negative limit {text.strip()!r}")
    return value


def read_limit() -> int:
    """The uid's instance limit as this namespace sees it (DEFAULT_LIMIT if unreadable)."""
    for path in LIMIT_FILES:
        try:
            with open(path) as f:
                return parse_limit(f.read())
        except (OSError, ValueError):
            continue
    return DEFAULT_LIMIT


def take_instance(init: Callable[[], int], limit: int) -> tuple[int, int]:
    """(our descriptor, or -1, and how many instances the probe found it could make, at most
    reserve + 1). `init` makes one instance and raises OSError when the uid has none left
    (the first call's error is raised: nothing could be made at all); every probed instance
    but ours is closed before returning."""
    want = reserve(limit) + 1
    made: list[int] = []
    try:
        while len(made) < want:
            try:
                made.append(init())
            except OSError:
                if not made:
                    raise
                break
        ours = made.pop(0) if len(made) == want else -1
    finally:
        for fd in made:
            try:
                os.close(fd)
            except OSError:
                pass
    return ours, (want if ours >= 0 else len(made))


class ProbeBusy(Exception):
    """Another process of the uid holds the lock: try again later (never waited for)."""


class Count(Frozen):
    """The uid's free instances, as counted at `at` (time.monotonic(), the same clock in every
    process of a time namespace) by process `by` (`process_id`), and lowered since by what
    cgwatch processes took."""

    __slots__ = _fields = ("at", "free", "limit", "by")
    at: float
    free: int
    limit: int
    by: str

    def __init__(self, at: float, free: int, limit: int, by: str) -> None:
        fill(self, locals())


def format_count(count: Count) -> str:
    return f"{_RECORD_TAG} {count.at:.6f} {count.free} {count.limit} {count.by}\n"


def parse_count(text: str) -> Optional[Count]:
    """The shared file's count, or None for anything else (empty: a new file; a write cut
    short by a crash; another version's format): the caller counts again."""
    if not text.endswith("\n") or not text.startswith(_RECORD_TAG + " "):
        return None
    fields = text[len(_RECORD_TAG) + 1:-1].split(" ")
    if len(fields) != 4 or not all(f.isascii() for f in fields):
        return None
    try:
        at, free, limit = float(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    if not at >= 0.0 or free < 0 or limit < 0:  # `not >=`: NaN too
        return None
    return Count(at, free, limit, fields[3])


def plan(count: Optional[Count], now: float, limit: int, counter_alive: bool) -> str:
    """What to do with the uid's last count: COUNT again (none, older than FRESH, from
    another clock or limit, or its counter is gone), PROBE (enough free for a probe that stops
    short of the limit), or REFUSE (too few: touch no instance).

    The counter must still run: a user namespace's inode number, in the file's name, is
    given to the next namespace once it is freed (the fleets of tests/test_nodescale_real.py
    got the same one in turn), and a count of the last one says nothing of the next."""
    if count is None or count.limit != limit or not 0.0 <= now - count.at <= FRESH \
            or not counter_alive:
        return COUNT
    return PROBE if enough(count.free, limit) else REFUSE


def enough(free: int, limit: int) -> bool:
    """Whether `free` instances leave room for a probe of reserve + 1 that stops MARGIN short
    of the limit."""
    return free >= reserve(limit) + 1 + MARGIN


def count_instances(uid: int, proc: str = "/proc") -> int:
    """The inotify instances the uid's visible processes hold: their descriptors that read
    `anon_inode:inotify` (fs/notify/inotify/inotify_user.c names it so). A descriptor shared
    by a fork counts twice (more than the kernel's count: errs toward leaving more); processes
    of another pid namespace, or whose descriptors we may not read, are not seen (MARGIN and
    the probe cover those). ~0.1 ms per process here (6.18, ~6 descriptors each)."""
    held = 0
    try:
        pids = os.listdir(proc)
    except OSError:
        return 0
    for pid in pids:
        if not pid.isdigit():
            continue
        fd_dir = f"{proc}/{pid}/fd"
        try:
            if os.stat(f"{proc}/{pid}").st_uid != uid:
                continue
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == "anon_inode:inotify":
                    held += 1
            except OSError:
                continue
    return held


def process_id(pid: str, proc: str = "/proc") -> str:
    """"PID:STARTTIME" of a running process ("self": ours), "" if there is none: a pid is
    reused, a pid and its start time (in clock ticks since boot) are not."""
    if not (pid == "self" or pid.isascii() and pid.isdigit()):
        return ""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        if pid == "self":
            pid = str(os.getpid())
        return f"{pid}:{int(fields[19])}"
    except (OSError, ValueError, IndexError):
        return ""


def shared_name(uid: int) -> str:
    """The per-uid file's name: the uid and its user namespace (the kernel counts instances
    per namespace and uid; uid 0 of a container's namespace is not the host's root)."""
    try:
        ns = os.readlink("/proc/self/ns/user").strip("user:[]")
    except OSError:
        ns = "0"
    return f"cgwatch-inotify-{uid}-{ns}"


def open_shared(uid: int, environ: Mapping[str, str],
                dirs: Sequence[str] = SHARED_DIRS) -> int:
    """The per-uid file, opened read-write (made 0600 if missing), or -1 if no directory of
    SHARED_DIRS holds one that is ours (ownfile.open_own)."""
    return open_own(shared_name(uid), uid, environ, dirs)[0]


def take_counted(init: Callable[[], int], limit: int, now: float,
                 environ: Mapping[str, str], dirs: Sequence[str] = SHARED_DIRS,
                 counter: Callable[[int], int] = count_instances) -> tuple[int, int]:
    """take_instance, made only when a count says a probe stops short of the limit: (our
    descriptor or -1, the free instances found). One process of the uid at a time, under the
    shared file's lock, which is never waited for (ProbeBusy: the caller tries later); where
    no file can be had, this process counts alone."""
    import fcntl  # here: a process that never watches never needs it

    uid = os.geteuid()
    fd = open_shared(uid, environ, dirs)
    if fd < 0:
        free = limit - counter(uid)
        if not enough(free, limit):
            return -1, max(free, 0)
        return take_instance(init, limit)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            raise ProbeBusy(str(e)) from e
        count = parse_count(os.pread(fd, 256, 0).decode("ascii", "replace"))
        alive = count is not None and process_id(count.by.partition(":")[0]) == count.by
        action = plan(count, now, limit, alive)
        if count is None or action == COUNT:
            count = Count(now, max(limit - counter(uid), 0), limit, process_id("self"))
        if not enough(count.free, limit):
            ours, found = -1, count.free
            new = count
        else:
            ours, found = take_instance(init, limit)
            if ours >= 0:
                # The count's time is kept: takers lower it, they do not make it fresher.
                new = Count(count.at, count.free - 1, limit, count.by)
                found = new.free
            else:
                # the probe made all there was: exact now
                new = Count(now, found, limit, process_id("self"))
        data = format_count(new).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        return ours, found
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def give_back(limit: int, environ: Mapping[str, str], dirs: Sequence[str] = SHARED_DIRS) -> None:
    """An instance take_counted gave was closed: raise the shared count by one (a monitor
    made and closed in a loop must not use the count up). Only if the lock is free at once:
    a count made meanwhile saw it closed anyway, and a missed one is counted again FRESH
    later."""
    import fcntl

    fd = open_shared(os.geteuid(), environ, dirs)
    if fd < 0:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        count = parse_count(os.pread(fd, 256, 0).decode("ascii", "replace"))
        if count is None or count.limit != limit:
            return
        data = format_count(Count(count.at, min(count.free + 1, limit), limit,
                                  count.by)).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError:
        pass
    finally:
        os.close(fd)
