"""The host reserve bound (hostmem.py) stays fresh without the background thread: a
thread-free monitor's cgroup confirmations call `refresh_bound_if_due`, which re-reads
/proc/zoneinfo once the bound is older than BOUND_INTERVAL, and not before. Fake tree; the
zoneinfo text is tests/test_values.py's (6.18 here, trimmed)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cgwatch import hostmem
from tests.test_values import ZONEINFO

GiB = 1 << 30
PAGE = os.sysconf("SC_PAGE_SIZE")
FREE = 10 * GiB


def _write(root: Path, name: str, text: str) -> None:
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc" / name).write_text(text)


def test_the_bound_is_read_again_once_due(tmp_path: Path) -> None:
    _write(tmp_path, "meminfo", "MemTotal: 16777216 kB\nMemAvailable: 12582912 kB\n")
    _write(tmp_path, "zoneinfo", ZONEINFO)
    host = hostmem.HostMemory(str(tmp_path), free_bytes=lambda: FREE)
    first = (67 + 5579) + (13676 + 2560)  # pages: high + max(protection) per zone
    assert host.available_lower_bound() == FREE - 2 * first * PAGE
    # An administrator raises vm.min_free_kbytes: the DMA32 zone's high mark doubles.
    _write(tmp_path, "zoneinfo", ZONEINFO.replace("high     13676", "high     27352"))
    host.refresh_bound_if_due(time.monotonic())  # read a moment ago: not due
    assert host.available_lower_bound() == FREE - 2 * first * PAGE
    host.refresh_bound_if_due(time.monotonic() + hostmem.BOUND_INTERVAL + 1)
    assert host.available_lower_bound() == FREE - 2 * (first + 13676) * PAGE
