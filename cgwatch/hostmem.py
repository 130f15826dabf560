"""Internal. Host-wide memory: MemTotal and MemAvailable, and a cheap lower bound on
MemAvailable.

Reads <root>/proc/meminfo through the process's kept descriptor (kept.py); where there is no
/proc (not Linux) it asks psutil. The lower bound lets available_memory() skip the meminfo
read when a cgroup level is certainly tighter than the host (see
`HostMemory.available_lower_bound`).
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from . import names, values
from .files import read_fd, read_file, under_root
from .kept import KeptDir, kept_dir
from .logs import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _psutil_virtual_memory() -> Any:
    # psutil is imported here, on the fallback without a usable /proc/meminfo, not at import:
    # it costs ~10 ms of every interpreter start (psutil 7.2, -X importtime). psutil's platform
    # function, not psutil.virtual_memory: cgwatch.psutil_view may have replaced the latter by
    # one that calls back into cgwatch, which must not recurse through us. `_psplatform` has
    # held it in every psutil since 2.0; the public name is the fallback if that ever moves.
    import psutil

    platform = getattr(psutil, "_psplatform", None)
    host = getattr(platform, "virtual_memory", None)
    if host is None:
        host = psutil.virtual_memory
    return host()


def _sysinfo_free_bytes() -> int:
    # glibc answers SC_AVPHYS_PAGES with sysinfo(2)'s freeram: the kernel's NR_FREE_PAGES, the
    # same counter MemAvailable starts from. About 0.6 us, against ~5-8 us for reading meminfo.
    return os.sysconf("SC_AVPHYS_PAGES") * _PAGE_SIZE


_reported: set[str] = set()


def _report_once(reason: str) -> None:
    if reason not in _reported and len(_reported) < 100:  # bounded: a process runs for weeks
        _reported.add(reason)
        log.warning("cgwatch: %s", reason)


def _sysinfo_total_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * _PAGE_SIZE


class HostMemory:
    """Host RAM figures for one root; `source` says where they come from."""

    def __init__(self, root: str = "/", free_bytes: Optional[Callable[[], int]] = None) -> None:
        self.root = root
        self.fd = -1
        self._kept: Optional[KeptDir] = None  # holds self.fd open
        self.source = "psutil"
        self.reason = ""
        self.total = 0
        # bytes; -1 while the lower bound is not usable; _NOT_YET until the first query that
        # needs it (reading zoneinfo is a third of a Monitor()'s start-up, and a monitor that
        # only answers total_memory() never needs it)
        self.reserve_bound = _NOT_YET
        self._bound_due = 0.0  # time.monotonic() after which refresh_bound_if_due() reads again
        self._free_bytes = free_bytes
        self.path = path = under_root(root, names.MEMINFO)
        try:
            kept = kept_dir(os.path.dirname(path), check=False)
            self.fd = kept.fd(os.path.basename(path))
            self._kept = kept
            self.total = values.find_meminfo_value(read_fd(self.fd), b"MemTotal")
            self.source = "meminfo"
        except (OSError, ValueError) as e:
            self.reason = f"{path} unusable ({e}); host values from psutil"
            self.fd = -1
            self._kept = None
            try:
                self.total = int(_psutil_virtual_memory().total)
            except OSError as e2:
                # psutil reads /proc/meminfo too; with no descriptor left (EMFILE) only
                # sysinfo(2), which needs none, can answer.
                self.source = "sysinfo"
                self.reason = f"{path} unusable ({e}), psutil too ({e2}); host values " \
                              "from sysinfo(2)"
                self.total = _sysinfo_total_bytes()

    def refresh_bound_if_due(self, now: float) -> None:
        """refresh_bound() when the bound is older than BOUND_INTERVAL (and in use): called by
        every cgroup confirmation, so a thread-free monitor (the default one behind
        `cgwatch.available_memory()`) keeps it as fresh as a threaded one's timer does."""
        if now >= self._bound_due and self.reserve_bound != _NOT_YET:
            self.refresh_bound()

    def refresh_bound(self) -> None:
        """(Re)compute the reserve bound; called at start and on the monitor's slow timer,
        because an administrator may change vm.min_free_kbytes at run time."""
        self._bound_due = time.monotonic() + BOUND_INTERVAL
        if self._free_bytes is None:
            # sysinfo(2) describes the real host, so the bound is only sound when meminfo is
            # the real host's too: the real /proc, not a fake tree and not LXCFS (a FUSE file
            # that reports a container's figures while sysinfo still reports the host's).
            if self.root not in ("", "/") or self.source != "meminfo" or _meminfo_is_virtual():
                self.reserve_bound = -1
                return
            self._free_bytes = _sysinfo_free_bytes
        try:
            text = read_file(under_root(self.root, names.ZONEINFO))
            # Doubled, for the time until the next refresh: the kernel recomputes
            # totalreserve_pages on every watermark change (__setup_per_zone_wmarks() and
            # setup_per_zone_lowmem_reserve() call calculate_totalreserve_pages()), so it can
            # only move above this reading when vm.min_free_kbytes, watermark_scale_factor or
            # lowmem_reserve_ratio is raised after it (hot-added memory adds more free pages
            # than reserve). Twice the reserve covers a rise up to 2x until the slow timer
            # reads it again; a larger jump leaves the bound unsafe for up to one
            # migration_interval.
            self.reserve_bound = 2 * values.parse_zoneinfo_reserve_bound(text) * _PAGE_SIZE
        except (OSError, ValueError):
            self.reserve_bound = -1

    def available(self) -> int:
        """Host MemAvailable in bytes (psutil's figure where there is no meminfo; free pages
        when neither can be read)."""
        try:
            if self.fd >= 0:
                return values.find_meminfo_value(read_fd(self.fd), b"MemAvailable")
            if self.source == "meminfo":  # closed: read it anew each time
                # Bounded and non-blocking (files.read_file): a FIFO must not hang a query
                return values.find_meminfo_value(read_file(self.path).encode(),
                                                 b"MemAvailable")
            if self.source == "psutil":
                return int(_psutil_virtual_memory().available)
        except (OSError, ValueError) as e:
            _report_once(f"{self.path} unreadable now ({e}); host MemAvailable taken as the "
                         "free pages (never above it)")
        # Free pages alone: never above MemAvailable (which adds reclaimable cache to them).
        return min(_sysinfo_free_bytes(), self.total) if self.total > 0 else \
            _sysinfo_free_bytes()

    def available_lower_bound(self) -> int:
        """A value certainly <= MemAvailable right now, or -1 when none is known.

        The kernel computes MemAvailable = free - totalreserve + reclaimable page cache and slab
        (each term added is >= 0, mm/show_mem.c si_mem_available). So free - (an upper bound on
        totalreserve) can only be lower. `free` comes from sysinfo(2), far cheaper than meminfo.
        """
        bound = self.reserve_bound
        if bound < 0:
            if bound != _NOT_YET:
                return -1
            self.refresh_bound()
            bound = self.reserve_bound
            if bound < 0:
                return -1
        if self._free_bytes is None:
            return -1
        return self._free_bytes() - bound

    def close(self) -> None:
        """Let go of the kept descriptor (closed when its last user lets go); available()
        then opens meminfo for each call."""
        self.fd = -1
        self._kept = None

    def detached(self) -> HostMemory:
        """A copy holding no descriptor (what a closed monitor keeps: the shared one stays
        with the other monitors)."""
        copy = object.__new__(HostMemory)
        copy.__dict__.update(self.__dict__)
        copy.close()
        return copy


_NOT_YET = -2
# Seconds between re-reads of /proc/zoneinfo for the reserve bound: the default
# migration_interval, the period the bound's doubling is meant to cover.
BOUND_INTERVAL = 5.0
_shared_lock = threading.Lock()
_shared: weakref.WeakValueDictionary[str, HostMemory] = weakref.WeakValueDictionary()


def shared(root: str) -> HostMemory:
    """The process's HostMemory for `root`, made on first use: every monitor of the process
    reads the same host, so one reading of /proc/zoneinfo and mountinfo serves them all
    (a third of a Monitor()'s start-up before)."""
    with _shared_lock:
        host = _shared.get(root)
        if host is not None and host.fd >= 0:
            try:  # MemTotal moves with memory hot-plug (and in fake trees): one pread
                host.total = values.find_meminfo_value(read_fd(host.fd), b"MemTotal")
            except (OSError, ValueError):
                host = None
        if host is None or host.fd < 0:
            host = HostMemory(root)
            if host.fd >= 0:  # a usable one: share it (a failed one is retried next time)
                _shared[root] = host
        return host


def _meminfo_is_virtual() -> bool:
    try:
        mountinfo = read_file("/proc/self/mountinfo")
    except OSError:
        return True
    return any(line.split(" ")[4:5] == ["/proc/meminfo"] for line in mountinfo.splitlines())
