"""Internal. Kernel notifications other than inotify: v1 eventfds registered through
`cgroup.event_control`, and v2 PSI triggers on `memory.pressure`.

Each function returns a descriptor to poll (POLLIN for an eventfd, POLLPRI for a PSI trigger)
or raises OSError with the kernel's reason; closing the descriptor unregisters it. Checked on
kernel 6.18 (v1): the OOM eventfd fires when a cgroup's OOM killer is invoked, *before* the
kill (its `oom_kill` counter rises a few ms later); a usage threshold fires on crossing it in
either direction; removing the cgroup signals every eventfd registered on it. Registering an
OOM eventfd makes such kernels print a one-time "oom_control is deprecated" line in the
kernel log; usage thresholds print nothing.
"""

from __future__ import annotations

import errno
import os
from typing import Callable, Optional

from . import values
from .files import READ_FLAGS

EFD_CLOEXEC = 0o2000000  # == O_CLOEXEC on every Linux architecture Python runs on
EFD_NONBLOCK = 0o4000  # == O_NONBLOCK (asm-generic; alpha/sparc/parisc differ and use os's)

# Writes to control files never follow a symbolic link and never create a file: under a fake
# or `--root` tree a link in place of cgroup.event_control or memory.pressure would otherwise
# make us truncate or write whatever it points at (kernfs has no symlinks among these files).
WRITE_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
PRESSURE_FLAGS = os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC

_libc_eventfd: Optional[Callable[[int, int], int]] = None


def _eventfd_flags() -> int:
    return getattr(os, "EFD_CLOEXEC", EFD_CLOEXEC) | getattr(os, "EFD_NONBLOCK", EFD_NONBLOCK)


def eventfd() -> int:
    """A non-blocking, close-on-exec eventfd (os.eventfd on 3.10+, libc through ctypes on 3.9)."""
    make = getattr(os, "eventfd", None)
    if make is not None:
        return int(make(0, _eventfd_flags()))
    import ctypes  # only on 3.9, which has no os.eventfd
    import ctypes.util

    global _libc_eventfd
    if _libc_eventfd is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        func = libc.eventfd
        func.argtypes = [ctypes.c_uint, ctypes.c_int]
        func.restype = ctypes.c_int
        _libc_eventfd = func
    fd = _libc_eventfd(0, EFD_CLOEXEC | getattr(os, "O_NONBLOCK", EFD_NONBLOCK))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def drain_eventfd(fd: int) -> int:
    """The count accumulated on an eventfd since the last drain (0 if none)."""
    try:
        data = os.read(fd, 8)
    except BlockingIOError:
        return 0
    return int.from_bytes(data, "little") if len(data) == 8 else 0


def register_v1(directory: str, control_file: str, argument: str = "") -> int:
    """An eventfd the kernel signals for `control_file` of the v1 memory cgroup `directory`:
    `memory.oom_control` (no argument: every OOM of this cgroup or an ancestor) or
    `memory.usage_in_bytes` with a threshold in bytes (usage crossing it either way)."""
    efd = eventfd()
    try:
        cfd = os.open(os.path.join(directory, control_file), READ_FLAGS)
        try:
            line = f"{efd} {cfd} {argument}".strip()
            wfd = os.open(os.path.join(directory, "cgroup.event_control"), WRITE_FLAGS)
            try:
                os.write(wfd, line.encode())
            finally:
                os.close(wfd)
        finally:
            # The kernel takes its own reference during the write; ours is no longer needed.
            os.close(cfd)
    except OSError:
        os.close(efd)
        raise
    return efd


def psi_trigger(directory: str, trigger: str) -> int:
    """A descriptor on v2 `memory.pressure` that gets POLLPRI when the trigger fires, e.g.
    `some 100000 1000000`: tasks of the cgroup stalled on memory for 100 ms within 1 s.

    Without CAP_SYS_RESOURCE the kernel (6.4+, and Debian's 6.1.0-57 backport) accepts only
    windows that are whole multiples of 2 s and refuses others with EINVAL (seen in a crun
    container without that capability; 2 s was accepted there); EPERM is kept for kernels
    that refuse the unprivileged write outright. On either the same stall share is tried
    again over such a window."""
    try:
        return _psi_trigger(directory, trigger)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EINVAL):
            raise
        wider = unprivileged_trigger(trigger)
        if wider is None or wider == trigger:
            raise
        return _psi_trigger(directory, wider)


def unprivileged_trigger(trigger: str) -> Optional[str]:
    """`some 100000 1000000` -> `some 200000 2000000`: the window rounded up to a multiple of
    2 s, the stall threshold scaled with it. None for text that is not a trigger."""
    parts = trigger.split()
    if len(parts) != 3 or parts[0] not in ("some", "full") or not values.is_number(parts[1]) \
            or not values.is_number(parts[2]):
        return None
    stall, window = int(parts[1]), int(parts[2])
    # The kernel refuses a stall of 0 or one longer than the window (psi_trigger_create()).
    if not 0 < stall <= window:
        return None
    wide = -(-window // 2_000_000) * 2_000_000
    return f"{parts[0]} {stall * wide // window} {wide}"


def _psi_trigger(directory: str, trigger: str) -> int:
    fd = os.open(os.path.join(directory, "memory.pressure"), PRESSURE_FLAGS)
    try:
        os.write(fd, trigger.encode() + b"\0")
    except OSError as e:
        os.close(fd)
        if e.errno == errno.EOPNOTSUPP:
            raise OSError(e.errno, "PSI is disabled on this kernel (boot with psi=1)") from e
        raise
    return fd
