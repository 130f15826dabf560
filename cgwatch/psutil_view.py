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
form. Nothing here imports torch or any framework.
"""

from __future__ import annotations

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
    import cgwatch  # late: cgwatch/__init__ may itself import this module

    return cgwatch.total_memory(), cgwatch.available_memory()


def virtual_memory(monitor: Optional[MemorySource] = None) -> svmem:
    """psutil's `virtual_memory()` named tuple with cgroup-aware `total`, `available`,
    `percent`, `used` (Linux) and `free` (see the module docstring, field by field).

    `monitor`: a `cgwatch.Monitor` to ask; by default the module-level default monitor.
    """
    host = _host()
    total, available = _limits(monitor)
    total = max(0, int(total))
    available = max(0, min(int(available), total))
    percent = round((total - available) / total * 100, 1) if total > 0 else 0.0
    fields: dict[str, Any] = {"total": total, "available": available, "percent": percent}
    names = type(host)._fields
    if sys.platform.startswith("linux") and "used" in names:
        fields["used"] = total - available
    if "free" in names:
        fields["free"] = min(int(host.free), available)
    return host._replace(**fields)


def is_patched() -> bool:
    """True while `psutil.virtual_memory` is this module's view (installed by `patch_psutil`)."""
    return _installed is not None and psutil.virtual_memory is _installed


def patch_psutil(monitor: Optional[MemorySource] = None) -> bool:
    """Make `psutil.virtual_memory()` return the cgroup-aware view, process-wide.

    Returns True if this call installed the patch, False if it was already installed
    (idempotent; the first call's `monitor` stays in effect). Undo with `unpatch_psutil()`.
    """
    global _host_virtual_memory, _installed
    with _lock:
        if _installed is not None:  # ours, possibly wrapped since by someone else
            return False
        original = psutil.virtual_memory

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
        _host_virtual_memory = original
        _installed = cgwatch_virtual_memory
        psutil.virtual_memory = cgwatch_virtual_memory
        return True


def unpatch_psutil() -> bool:
    """Restore the `psutil.virtual_memory` that `patch_psutil()` replaced.

    Returns True if it restored it, False if the patch was not installed. If someone else
    replaced `psutil.virtual_memory` after our patch, their function is left in place (we
    would otherwise drop it) and False is returned; our view then keeps answering under it.
    """
    global _host_virtual_memory, _installed
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
