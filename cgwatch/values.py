"""Internal. Parse the values inside cgroup and /proc memory files.

Pure functions on text or bytes, table-tested in tests/test_values.py. Every parser raises
ValueError on input it cannot trust, so the caller can fall back and say why.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Union

    Text = Union[str, bytes]


# v1 writes "unlimited" as PAGE_COUNTER_MAX pages, i.e. 2^63-1 rounded down to the page size
# (9223372036854771712 with 4 KiB pages; other page sizes give other numbers). Anything this
# large cannot be a real limit, so treat it as none.
V1_UNLIMITED_THRESHOLD = 1 << 62


# What the kernel pads numbers with (a trailing newline); str.strip() would also take Unicode
# spaces and the \x1c-\x1f separators, which no kernel file holds.
_ASCII_SPACE = " \t\n\r\x0b\x0c"


_MAX_DIGITS = 20


def _as_str(data: Text) -> str:
    return data.decode("ascii", "replace") if isinstance(data, bytes) else data


def is_number(text: Union[str, bytes]) -> bool:
    """A non-empty run of ASCII digits and nothing else. `str.isdigit()` alone also takes '²'
    (which int() then refuses) and Arabic-Indic digits (which int() reads as a number); int()
    alone takes signs, spaces and underscores. The kernel writes none of these, nor more digits
    than a u64 has (20: 18446744073709551615); the bound also keeps int() cheap."""
    return len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit()


def parse_limit(data: Text, version: int) -> Optional[int]:
    """A hard limit file (v2 `memory.max`, v1 `memory.limit_in_bytes`): bytes, or None for none."""
    text = _as_str(data).strip(_ASCII_SPACE)
    if version == 2 and text == "max":
        return None
    if not is_number(text):
        raise ValueError(f"not a memory limit: {text[:40]!r}")
    value = int(text)
    if version == 1 and value >= V1_UNLIMITED_THRESHOLD:
        return None
    return value


def parse_counter(data: Text) -> int:
    """A single-number file such as `memory.current` or `memory.usage_in_bytes`."""
    text = _as_str(data).strip(_ASCII_SPACE)
    if not is_number(text):
        raise ValueError(f"not a byte count: {text[:40]!r}")
    return int(text)


def parse_flat_keyed(data: Text) -> dict[str, int]:
    """`key value` lines (memory.stat, memory.events, memory.oom_control); bad lines skipped."""
    result = {}
    for line in _as_str(data).splitlines():
        key, _, value = line.partition(" ")
        value = value.strip(_ASCII_SPACE)
        if key and is_number(value):
            result[key] = int(value)
    return result


def parse_pressure(data: Text) -> dict[str, int]:
    """The `total=` of each line of a PSI file (`memory.pressure`) by kind ("some", "full"), in
    microseconds. The kernel writes one line per kind, `some avg10=0.00 avg60=0.00 avg300=0.00
    total=12345` (Documentation/accounting/psi.rst; psi_show() in kernel/sched/psi.c prints it
    with "%llu": ASCII digits only, as is_number() takes). A line without a total is left out;
    raises ValueError when a total is not a number (a sign, an underscore, a non-ASCII digit,
    more digits than a u64: what int() would take) or when no line has one."""
    text = _as_str(data)
    totals: dict[str, int] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for item in rest.split():
            key, _, number = item.partition("=")
            if key == "total":
                if not is_number(number):
                    raise ValueError(f"not a PSI total in memory.pressure: {line[:60]!r}")
                totals[kind] = int(number)
    if not totals:
        raise ValueError(f"no total= in memory.pressure: {text[:60]!r}")
    return totals


def find_stat_value(data: bytes, key: bytes) -> int:
    """One value out of memory.stat without parsing the whole file (this is the hot path)."""
    start = data.find(b"\n" + key + b" ") + 1
    if start == 0:
        if not data.startswith(key + b" "):
            raise ValueError(f"{key.decode()} missing from memory.stat")
        start = 0
    start += len(key) + 1
    end = data.find(b"\n", start)
    field = data[start:] if end < 0 else data[start:end]
    field = field.strip(_ASCII_SPACE.encode())
    if not is_number(field):
        raise ValueError(f"bad {key.decode()} value in memory.stat: {field[:40]!r}")
    return int(field)


# v1 memory.stat: `swap` is the level's own pages, `total_swap` its whole subtree's (the
# `total_` keys are hierarchical, Documentation/admin-guide/cgroup-v1/memory.rst 5.2; on 6.18
# here `cache` read 251674624 and `total_cache` 251678720 at a level with children), which is
# what memsw.usage_in_bytes and usage_in_bytes count too. Both lines are written only with
# swap accounting on (memcg1_stat_format() skips MEMCG_SWAP unless do_memsw_account()).
V1_SWAP_KEY = b"total_swap"


def parse_v1_swap(stat: bytes) -> Optional[int]:
    """Swap used by a v1 level and its subtree (bytes): the kernel's own `total_swap` from
    memory.stat, one counter read at one moment (memsw.usage - usage, two counters read at
    two moments, showed 116-256 KiB of swap on a host without any). None: the line is not
    there (swap accounting off). Raises ValueError for a value that is not a number."""
    if not (stat.startswith(V1_SWAP_KEY + b" ") or b"\n" + V1_SWAP_KEY + b" " in stat):
        return None
    return find_stat_value(stat, V1_SWAP_KEY)


def find_meminfo_value(data: bytes, key: bytes) -> int:
    """One meminfo field in bytes, found directly (hot path for MemAvailable)."""
    start = data.find(key + b":")
    if start < 0:
        raise ValueError(f"{key.decode()} missing from meminfo")
    end = data.find(b"\n", start)
    parts = (data[start + len(key) + 1 :] if end < 0 else data[start + len(key) + 1 : end]).split()
    if not parts or not is_number(parts[0]):
        raise ValueError(f"bad {key.decode()} in meminfo")
    return int(parts[0]) * (1024 if parts[1:2] == [b"kB"] else 1)


def parse_zoneinfo_reserve_bound(data: Text) -> int:
    """An upper bound, in pages, on the kernel's `totalreserve_pages`, from /proc/zoneinfo.

    The kernel computes MemAvailable as `free - totalreserve_pages + (reclaimable cache, >= 0)`,
    and totalreserve_pages sums, per zone, the high watermark plus the largest lowmem reserve
    (`protection`), each capped at the zone's managed pages. Summing the uncapped values gives a
    number that can only be larger, so `free - bound` never exceeds the true MemAvailable.
    """
    total = 0
    high: Optional[int] = None
    in_zone = False
    for line in _as_str(data).splitlines():
        stripped = line.strip()
        if line.startswith("Node "):
            in_zone = True
            high = None
            continue
        if not in_zone:
            continue
        parts = stripped.split()
        # The zone's own watermark line is "high <n>" at one indent; per-cpu pageset lines are
        # "high: <n>" (with a colon) and must not be counted.
        if len(parts) == 2 and parts[0] == "high" and is_number(parts[1]) and high is None:
            high = int(parts[1])
            total += high
        elif stripped.startswith("protection:"):
            inner = stripped[len("protection:") :].strip().strip("()")
            values = [int(v) for v in inner.replace(",", " ").split() if is_number(v)]
            total += max(values, default=0)
    if total == 0:
        raise ValueError("no zone watermarks in zoneinfo")
    return total
