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
"""

from __future__ import annotations

import os

from .envswitch import switch_off

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Callable

DEFAULT_LIMIT = 128  # fs.inotify.max_user_instances when no file says otherwise
# The per-namespace file first (it is the one a namespace's root can lower), then the
# host-wide sysctl (the same count in the initial namespace).
LIMIT_FILES = ("/proc/sys/user/max_inotify_instances", "/proc/sys/fs/inotify/max_user_instances")
FIRST_BACKOFF = 1.0  # seconds before the first retry after the quota said no
MAX_BACKOFF = 64.0  # the longest wait between tries (a polling process stays exact anyway)


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
