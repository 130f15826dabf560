"""A cgroup-aware `psutil.virtual_memory()`.

Frameworks ask psutil how much memory there is (DeepSpeed's CPU accelerator, HF accelerate's
`get_max_memory()`, many schedulers). Inside a memory-limited cgroup psutil answers for the
whole host. `virtual_memory()` here returns psutil's own named tuple type, with every field
psutil has, and with the fields that describe "how much may this process use" replaced by
cgwatch's answers:

=========  ==============================================================================
field      value in this view
=========  ==============================================================================
total      `cgwatch.total_memory()`: the smallest memory limit on the path from this
           process's cgroup to the top of the visible hierarchy, capped at host RAM.
           Host RAM when there is no limit (then the same as psutil's).
available  `cgwatch.available_memory()`: the smallest of host `MemAvailable` and, for each
           limited level, limit - (usage - inactive_file); never above `total`.
percent    `(total - available) / total * 100`, rounded to one decimal: psutil's own
           definition, applied to the two values above (0.0 when total is 0).
used       Linux: `total - available`, psutil's own Linux definition (psutil >= 6), applied
           to the values above. Elsewhere psutil's host value (it is not defined from
           total/available there, and cgwatch has no cgroup to read there anyway).
free       psutil's host `free` (never-used RAM), capped at `available`: host RAM that is
           free is of no use beyond what the cgroup lets this process have.
others     `active`, `inactive`, `buffers`, `cached`, `shared`, `slab` (Linux), `wired`
           (macOS/BSD) ...: psutil's host-wide kernel counters, unchanged. They describe the
           whole machine, not the cgroup.
=========  ==============================================================================

`patch_psutil()` replaces `psutil.virtual_memory` by this view for code you cannot edit
(it takes effect for callers that look the function up on the module at call time, as
`psutil.virtual_memory()` does; a `from psutil import virtual_memory` done before the patch
keeps the original). `unpatch_psutil()` undoes it; `patched_psutil()` is the context-manager
form. Nothing here imports torch or any framework, and nothing starts a thread: the default
monitor the view asks is thread-free, so a program that forks after it (DataLoader workers)
stays single-threaded.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

import psutil

if TYPE_CHECKING:
    from psutil._ntuples import svmem

__all__ = [
    "MemorySource",
    "virtual_memory",
    "patch_psutil",
    "unpatch_psutil",
    "patched_psutil",
    "is_patched",
    "adopt_switch",
]


class MemorySource(Protocol):
    """What the view asks: a `cgwatch.Monitor`, or anything with the same two queries."""

    def total_memory(self) -> int: ...

    def available_memory(self) -> int: ...


_lock = threading.Lock()
# What psutil.virtual_memory was before patch_psutil() replaced it; None while not patched.
_host_virtual_memory: Optional[Callable[[], svmem]] = None
# The function currently installed as psutil.virtual_memory by us (None while not patched).
_installed: Optional[Callable[[], svmem]] = None
_busy = threading.local()  # set while this thread runs the patched function


def _host() -> svmem:
    original = _host_virtual_memory
    if original is None:
        return psutil.virtual_memory()
    return original()


def _limits(monitor: Optional[MemorySource]) -> tuple[int, int]:
    if monitor is not None:
        return monitor.total_memory(), monitor.available_memory()
    from . import default  # late: the default monitor's import only when it is asked for

    return default.total_memory(), default.available_memory()


# psutil's Linux svmem, field by field (the same in psutil 5.8 to 7.2). The fast path below
# builds exactly this tuple; any other layout takes psutil's own function.
LINUX_FIELDS = ("total", "available", "percent", "used", "free", "active", "inactive",
                "buffers", "cached", "shared", "slab")
# The meminfo lines the host-wide fields come from: the fast path needs them all (psutil
# warns and substitutes 0 or a fallback when one is missing; we then let psutil answer).
_REQUIRED = (b"MemFree", b"Buffers", b"Cached", b"Shmem", b"Active", b"Inactive")


def _meminfo_kib(data: bytes, key: bytes) -> int:
    """The value of meminfo line `key` in kB, or -1 when there is no such line. Anchored on
    the line start, so `Cached` never matches `SwapCached`."""
    start = data.find(b"\n" + key + b":")
    if start < 0:
        return -1
    start += len(key) + 2
    end = data.find(b"\n", start)
    parts = data[start:end].split() if end >= 0 else data[start:].split()
    return int(parts[0]) if parts and parts[0].isdigit() else -1


def host_counters(meminfo: bytes) -> Optional[dict[str, int]]:
    """psutil's host-wide Linux fields (bytes) from the text of /proc/meminfo: `free`,
    `active`, `inactive`, `buffers`, `cached` (Cached + SReclaimable), `shared` (Shmem),
    `slab`, with psutil's definitions. None when a line the fast path needs is missing or
    malformed (old or unusual kernels: psutil's own function then answers)."""
    data = b"\n" + meminfo
    found = [_meminfo_kib(data, key) for key in _REQUIRED]
    if min(found) < 0:
        return None
    free, buffers, cached, shared, active, inactive = found
    reclaimable = max(0, _meminfo_kib(data, b"SReclaimable"))
    slab = max(0, _meminfo_kib(data, b"Slab"))
    return {"free": free << 10, "active": active << 10, "inactive": inactive << 10,
            "buffers": buffers << 10, "cached": (cached + reclaimable) << 10,
            "shared": shared << 10, "slab": slab << 10}


class _FastPath:
    """The Linux construction: psutil's svmem type built from cgwatch's two answers and one
    pread of /proc/meminfo (kept open), instead of calling psutil (which parses every
    meminfo line into a dict: ~20 us of the ~20 us it takes, psutil 7.2) and then cgwatch."""

    def __init__(self) -> None:
        self.svmem: Optional[type] = None
        self.fd = -1
        self.path = ""
        self.usable = sys.platform.startswith("linux")

    def counters(self) -> Optional[tuple[type, dict[str, int]]]:
        if not self.usable:
            return None
        path = os.path.join(getattr(psutil, "PROCFS_PATH", "/proc"), "meminfo")
        try:
            if self.svmem is None or path != self.path:
                self._open(path)
            # meminfo is ~1.5 KiB (6.x kernels); 16 KiB leaves room for any kernel's.
            counters = host_counters(os.pread(self.fd, 16384, 0))
        except (OSError, ValueError):
            counters = None
        svmem_type = self.svmem
        if counters is None or svmem_type is None:
            # psutil knows this kernel's quirks: let it answer from now on.
            self.usable = False
            return None
        return svmem_type, counters

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.svmem, self.path = -1, None, ""

    def _open(self, path: str) -> None:
        svmem_type = type(_host())
        if tuple(getattr(svmem_type, "_fields", ())) != LINUX_FIELDS:
            raise ValueError("not psutil's Linux svmem layout")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        old, self.fd, self.path, self.svmem = self.fd, fd, path, svmem_type
        if old >= 0:
            os.close(old)


_fast = _FastPath()


def _clamped(monitor: Optional[MemorySource]) -> tuple[int, int, float]:
    total, available = _limits(monitor)
    total = max(0, int(total))
    available = max(0, min(int(available), total))
    percent = round((total - available) / total * 100, 1) if total > 0 else 0.0
    return total, available, percent


def virtual_memory(monitor: Optional[MemorySource] = None) -> svmem:
    """psutil's `virtual_memory()` named tuple with cgroup-aware `total`, `available`,
    `percent`, `used` (Linux) and `free` (see the module docstring, field by field).

    `monitor`: a `cgwatch.Monitor` to ask; by default the module-level default monitor.
    """
    fast = _fast.counters()
    if fast is not None:
        svmem_type, c = fast
        total, available, percent = _clamped(monitor)
        result: svmem = svmem_type(total, available, percent, total - available,
                                   min(c["free"], available), c["active"], c["inactive"],
                                   c["buffers"], c["cached"], c["shared"], c["slab"])
        return result
    host = _host()
    total, available, percent = _clamped(monitor)
    fields: dict[str, Any] = {"total": total, "available": available, "percent": percent}
    names = type(host)._fields
    if sys.platform.startswith("linux") and "used" in names:
        fields["used"] = total - available
    if "free" in names:
        fields["free"] = min(int(host.free), available)
    return host._replace(**fields)


def is_patched() -> bool:
    """True while `psutil.virtual_memory` is this module's view (installed by `patch_psutil`
    or by the `CGWATCH_PSUTIL` switch)."""
    _adopt_pending_switch()
    return _installed is not None and psutil.virtual_memory is _installed


def _guarded(original: Callable[[], svmem],
             monitor: Optional[MemorySource]) -> Callable[[], svmem]:
    def cgwatch_virtual_memory() -> svmem:
        # cgwatch itself may ask psutil (host figures where /proc/meminfo is unusable):
        # a call from inside our own query gets psutil's original answer, not a recursion.
        if getattr(_busy, "active", False):
            return original()
        _busy.active = True
        try:
            return virtual_memory(monitor)
        finally:
            _busy.active = False

    cgwatch_virtual_memory.__doc__ = virtual_memory.__doc__
    cgwatch_virtual_memory.__wrapped__ = original  # type: ignore[attr-defined]
    return cgwatch_virtual_memory


def adopt_switch(installed: Callable[[], svmem],
                 original: Callable[[], svmem]) -> Callable[[], svmem]:
    """Adopt a forwarding function already in psutil's place as the patch, and return what it
    should forward to (the cgroup-aware view, guarded: psutil's answer if the view fails).

    For `CGWATCH_PSUTIL=1` (integrations/_autoload.py `forward_psutil`): when psutil loaded,
    the switch put `installed` in place of psutil's `original` without importing cgwatch;
    at its first call it adopts itself here. Afterwards `is_patched()` is True and
    `unpatch_psutil()` restores `original`. If a patch is in place already, that one stays."""
    global _host_virtual_memory, _installed
    with _lock:
        if _installed is None:
            _host_virtual_memory = original
            _installed = installed
        return _guarded(original, None)


def _adopt_pending_switch() -> None:
    # The switch's forwarding function adopts itself on its first call; a patch_psutil(),
    # unpatch_psutil() or is_patched() before that call must see it as the patch already.
    adopt = getattr(psutil.virtual_memory, "_cgwatch_adopt", None)
    if adopt is not None and _installed is None:
        adopt()


def patch_psutil(monitor: Optional[MemorySource] = None) -> bool:
    """Make `psutil.virtual_memory()` return the cgroup-aware view, process-wide.

    Returns True if this call installed the patch, False if it was already installed
    (idempotent; the first call's `monitor` stays in effect; with `CGWATCH_PSUTIL=1` the
    switch installed it, for the default monitor). Undo with `unpatch_psutil()`.
    """
    global _host_virtual_memory, _installed
    _adopt_pending_switch()
    with _lock:
        if _installed is not None:  # ours, possibly wrapped since by someone else
            return False
        original = psutil.virtual_memory
        _host_virtual_memory = original
        _installed = _guarded(original, monitor)
        psutil.virtual_memory = _installed
        return True


def unpatch_psutil() -> bool:
    """Restore the `psutil.virtual_memory` that `patch_psutil()` replaced.

    Returns True if it restored it, False if the patch was not installed. If someone else
    replaced `psutil.virtual_memory` after our patch, their function is left in place (we
    would otherwise drop it) and False is returned; our view then keeps answering under it.
    """
    global _host_virtual_memory, _installed
    _adopt_pending_switch()
    with _lock:
        if _installed is None or psutil.virtual_memory is not _installed:
            return False
        assert _host_virtual_memory is not None
        psutil.virtual_memory = _host_virtual_memory
        _host_virtual_memory = None
        _installed = None
        return True


@contextmanager
def patched_psutil(monitor: Optional[MemorySource] = None) -> Iterator[None]:
    """`with patched_psutil(): ...` patches psutil for the block; nests (only the outermost
    block that installed the patch removes it)."""
    installed = patch_psutil(monitor)
    try:
        yield
    finally:
        if installed:
            unpatch_psutil()
