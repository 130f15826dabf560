"""Property tests (hypothesis) of every parser, and of the public queries on fake roots with any
one file replaced by arbitrary bytes (issue 11).

The parsers raise nothing but ValueError, and what they accept is what the kernel writes; the
queries raise nothing at all and answer 0 <= available <= total <= host MemTotal. Example
counts are kept moderate so the whole file runs in a few seconds; `CGWATCH_FUZZ_EXAMPLES`
multiplies them for a longer hunt.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgwatch import Monitor, counters, discovery, notify, values
from tests.fake_tree import FakeHost, GiB

SCALE = int(os.environ.get("CGWATCH_FUZZ_EXAMPLES", "1"))
PARSER = settings(max_examples=300 * SCALE, deadline=None, database=None)
QUERY = settings(max_examples=30 * SCALE, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])

# Pieces of real kernel files and of the near misses issue 11 found (superscript and
# Arabic-Indic digits, NUL escapes, '..', signs), so generated text reaches deep into the
# parsers instead of failing at the first byte.
PIECES = [
    "max", "-1", "0", "1", "4096", "18446744073709551615", "9223372036854771712", "9" * 30,
    " ", "\n", "\t", "\x00", "\u00b2", "\u0661\u0662\u0663", "1_000", "+5", ":", "/", "..",
    "inactive_file ", "total_inactive_file ", "anon ", "oom_kill ", "max ", "under_oom ",
    "MemTotal:", "MemAvailable:", " kB", "0::", "4:memory:", "1:cpu:", "/a/b/c", "/..",
    " (deleted)", "\\000", "\\040", "\\011", "\\777", "35 24 0:30 / ", "/sys/fs/cgroup",
    "/sys/fs/cgroup/memory", " rw,relatime shared:9 - cgroup2 cgroup2 rw",
    " rw - cgroup cgroup rw,memory", "Node 0, zone DMA\n", "  high 67\n",
    "  protection: (0, 3019)\n",
]
kernelish = st.lists(st.sampled_from(PIECES), max_size=16).map("".join)
text = st.one_of(kernelish, st.text(max_size=200))
data = st.one_of(kernelish.map(lambda s: s.encode("utf-8", "surrogatepass")),
                 st.binary(max_size=300))

ASCII_NUMBER = re.compile(r"[0-9]{1,20}")
SPACE = " \t\n\r\x0b\x0c"


# ---- values ------------------------------------------------------------------------------------


@PARSER
@given(st.one_of(text, data), st.sampled_from([1, 2]))
def test_parse_limit_accepts_only_ascii_numbers(raw: Any, version: int) -> None:
    try:
        limit = values.parse_limit(raw, version)
    except ValueError:
        return
    shown = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    stripped = shown.strip(SPACE)
    if limit is None:
        assert (version == 2 and stripped == "max") or \
            (ASCII_NUMBER.fullmatch(stripped) and int(stripped) >= values.V1_UNLIMITED_THRESHOLD)
    else:
        assert ASCII_NUMBER.fullmatch(stripped) and limit == int(stripped) >= 0


@PARSER
@given(st.integers(min_value=0, max_value=(1 << 64) - 1), st.sampled_from(["", "\n", " \n"]))
def test_limits_and_counters_round_trip(number: int, end: str) -> None:
    assert values.parse_counter(f"{number}{end}") == number
    assert values.parse_limit(f"{number}{end}".encode(), 2) == number


@PARSER
@given(st.one_of(text, data))
def test_parse_counter_only_value_error(raw: Any) -> None:
    try:
        assert values.parse_counter(raw) >= 0
    except ValueError:
        pass


@PARSER
@given(st.one_of(text, data))
def test_flat_keyed_never_raises(raw: Any) -> None:
    parsed = values.parse_flat_keyed(raw)
    shown = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    for key, value in parsed.items():
        assert 0 <= value < 1 << 67 and key in shown


@PARSER
@given(data, st.sampled_from([b"inactive_file", b"total_inactive_file"]))
def test_find_stat_value_only_value_error(raw: bytes, key: bytes) -> None:
    try:
        assert values.find_stat_value(raw, key) >= 0
    except ValueError:
        pass


@PARSER
@given(data, st.sampled_from([b"MemTotal", b"MemAvailable"]))
def test_find_meminfo_value_only_value_error(raw: bytes, key: bytes) -> None:
    try:
        assert values.find_meminfo_value(raw, key) >= 0
    except ValueError:
        pass


@PARSER
@given(text)
def test_zoneinfo_only_value_error(raw: str) -> None:
    try:
        assert values.parse_zoneinfo_reserve_bound(raw) > 0
    except ValueError:
        pass


# ---- counters and notify -----------------------------------------------------------------------


@PARSER
@given(st.sampled_from(["memory.events", "memory.events.local", "memory.oom_control",
                        "memory.failcnt"]), st.one_of(text, data))
def test_parse_counters_only_value_error(source: str, raw: Any) -> None:
    try:
        parsed = counters.parse_counters(source, raw)
    except ValueError:
        return
    assert all(value >= 0 for value in parsed.values())
    assert "oom_kill_disable" not in parsed


@PARSER
@given(text)
def test_unprivileged_trigger_never_raises(raw: str) -> None:
    wider = notify.unprivileged_trigger(raw)
    if wider is not None:
        kind, stall, window = wider.split()
        assert int(window) % 2_000_000 == 0 and int(stall) <= int(window)


# ---- discovery ---------------------------------------------------------------------------------


def _escape(path: str) -> str:
    """What the kernel writes for a path in mountinfo (space, tab, newline, backslash)."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


@PARSER
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=60))
def test_unescape_undoes_the_kernels_escapes(path: str) -> None:
    if any(c < " " and c not in "\t\n" or c == "\x7f" for c in path):
        return  # the kernel would write those raw; not a round trip of escapes
    assert discovery.unescape_mount_path(_escape(path)) == path


@PARSER
@given(text)
def test_unescape_never_gives_nul(raw: str) -> None:
    try:
        out = discovery.unescape_mount_path(raw)
    except ValueError:
        return
    assert "\x00" not in out or "\x00" in raw


@PARSER
@given(text, text, st.booleans())
def test_resolve_never_raises_and_stays_inside(proc_cgroup: str, mountinfo: str,
                                              has_memory: bool) -> None:
    for line in discovery.parse_proc_cgroup(proc_cgroup):
        assert line.hierarchy_id >= 0
    mounts, refused = discovery.parse_mountinfo_checked(mountinfo)
    for mount in mounts:
        assert discovery.mount_point_problem(mount.mount_point) is None
    result = discovery.resolve(proc_cgroup, mountinfo, lambda _: has_memory)
    if isinstance(result, discovery.Resolved):
        parts = result.directory.split("/")
        assert ".." not in parts and "\x00" not in result.directory
        assert discovery.path_contains(result.mount_point, result.directory)
    else:
        assert result.reason


# ---- the public queries with one file replaced by arbitrary bytes ------------------------------

TARGETS = ["limit", "parent limit", "usage", "memory.stat", "meminfo", "proc cgroup",
           "mountinfo", "controllers"]


def _target(host: FakeHost, target: str) -> Optional[str]:
    v2 = host.version == 2
    leaf = host.level_dir("/a/b/c")
    return {
        "limit": leaf + ("/memory.max" if v2 else "/memory.limit_in_bytes"),
        "parent limit": host.level_dir("/a/b") + ("/memory.max" if v2 else
                                                  "/memory.limit_in_bytes"),
        "usage": leaf + ("/memory.current" if v2 else "/memory.usage_in_bytes"),
        "memory.stat": leaf + "/memory.stat",
        "meminfo": "/proc/meminfo",
        "proc cgroup": "/proc/self/cgroup",
        "mountinfo": "/proc/self/mountinfo",
        "controllers": host.mount_point + "/cgroup.controllers" if v2 else None,
    }[target]


def _host_total(monitor: Monitor) -> int:
    """MemTotal as the monitor took it at start: the fake tree's, or psutil's (the real host's)
    when the fake meminfo was unusable. Not through host_memory(), which raises when meminfo
    turns bad after start (test_host_memory_after_meminfo_turns_bad)."""
    if monitor.status.host_source == "meminfo":
        return 64 * GiB
    return int(psutil.virtual_memory().total)


def _check(monitor: Monitor) -> None:
    total = monitor.total_memory()
    available = monitor.available_memory()
    assert 0 <= available <= total <= _host_total(monitor)
    status = monitor.status
    assert status.mode in ("watching", "polling", "host")
    for info in monitor.levels():
        assert info.limit is None or info.limit >= 0
    assert 0 <= monitor.available_memory() <= monitor.total_memory()


@pytest.mark.parametrize("target", TARGETS)
@QUERY
@given(raw=data)
def test_queries_survive_any_one_file(host: FakeHost, target: str, raw: bytes) -> None:
    path = _target(host, target)
    if path is None:
        return
    if not os.path.exists(host.path(host.level_dir("/a/b/c"))):
        host.make_path({"/a": None, "/a/b": 4 * GiB, "/a/b/c": 2 * GiB})
    with open(host.path(path), "rb") as f:
        good = f.read()
    before = Monitor(host.root, thread=False)  # made on the good tree, sees the change
    try:
        with open(host.path(path), "wb") as f:
            f.write(raw)
        after = Monitor(host.root, thread=False)  # made on the bad tree
        try:
            _check(before)
            _check(after)
        finally:
            after.close()
    finally:
        before.close()
        with open(host.path(path), "wb") as f:
            f.write(good)


@pytest.mark.parametrize("raw", [b"", b"MemAvailable:", b"MemAvailable: \xd9\xa1 kB\n"])
def test_host_memory_after_meminfo_turns_bad(host: FakeHost, raw: bytes) -> None:
    host.make_path({"/a": None, "/a/b": 4 * GiB, "/a/b/c": 2 * GiB})
    monitor = Monitor(host.root, thread=False)
    try:
        with open(host.path("/proc/meminfo"), "wb") as f:
            f.write(raw)
        total, available = monitor.host_memory()
        assert 0 <= available <= total
    finally:
        monitor.close()
