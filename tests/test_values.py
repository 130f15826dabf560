"""Tables of real file contents for the value parsers."""

from __future__ import annotations

from typing import NamedTuple, Optional

import pytest

from cgwatch import values
from cgwatch.names import FileNames

V1_UNLIMITED = "9223372036854771712\n"  # 2^63-1 rounded down to 4 KiB pages, as the kernel writes


@pytest.mark.parametrize(("text", "version", "expected"), [
    ("max\n", 2, None),
    ("1073741824\n", 2, 1 << 30),
    ("0\n", 2, 0),
    (V1_UNLIMITED, 1, None),
    ("9223372036854710272\n", 1, None),  # the same sentinel with 64 KiB pages (arm64, ppc64)
    ("104857600\n", 1, 100 << 20),
    (b"67108864\n", 1, 64 << 20),
    # the largest u64 (what some tools write for "no limit") is unlimited on v1, and on v2 a
    # (huge) limit the host's MemTotal then caps
    ("18446744073709551615\n", 1, None),
    ("18446744073709551615\n", 2, 18446744073709551615),
    (" 123 \n", 2, 123),  # ASCII padding is not a digit problem
])
def test_parse_limit(text: str, version: int, expected: Optional[int]) -> None:
    assert values.parse_limit(text, version) == expected


@pytest.mark.parametrize(("text", "version"), [
    ("", 2), ("max\n", 1), ("-1\n", 1), ("12ab", 2), ("\x00\x00", 2),
    # str.isdigit() accepts these; int() then raises (superscript) or reads 123 (Arabic-Indic)
    ("\u00b2\n", 2), ("\u0661\u0662\u0663\n", 2), ("\u0661\u0662\u0663\n", 1),
    ("\uff11\uff12\n", 2),  # fullwidth digits
    ("123\x00", 2), ("123\x00\n", 1),  # a NUL after the number
    ("1_000\n", 2), ("+5\n", 2), ("0x10\n", 2),  # int() would take the first two
    ("\u00a0123\n", 2), ("\x1c123\n", 2),  # str.strip() would take these; the kernel never pads so
    ("1" * 21 + "\n", 2), ("9" * 5000, 1),  # more digits than a u64 has
    (b"\xd9\xa1\xd9\xa2\n", 2),  # Arabic-Indic digits as UTF-8 bytes
])
def test_parse_limit_rejects_garbage(text: str, version: int) -> None:
    with pytest.raises(ValueError):
        values.parse_limit(text, version)


V1_STAT = b"""cache 168841216
rss 1933312
inactive_file 109264896
active_file 59576320
hierarchical_memory_limit 9223372036854771712
total_cache 168841216
total_inactive_file 209264896
total_active_file 59576320
"""
V2_STAT = b"""anon 1024000
file 53248000
inactive_anon 0
active_anon 1019904
inactive_file 40960000
active_file 12288000
"""


@pytest.mark.parametrize(("data", "version", "expected"), [
    (V1_STAT, 1, 209264896),  # v1: the hierarchical total_, not the local inactive_file
    (V2_STAT, 2, 40960000),
    (b"inactive_file 5\n", 2, 5),  # first line
    (b"x 1\ninactive_file 7", 2, 7),  # last line without newline
])
def test_find_stat_value(data: bytes, version: int, expected: int) -> None:
    assert values.find_stat_value(data, FileNames.for_version(version).inactive_key) == expected


@pytest.mark.parametrize("data", [b"", b"inactive_anon 5\n", b"inactive_file x\n",
                                  b"total_inactive_file\n",
                                  "inactive_file \u00b2\n".encode(),
                                  b"inactive_file 1_000\n", b"inactive_file 5\x00\n",
                                  b"inactive_file " + b"9" * 30 + b"\n"])
def test_find_stat_value_missing(data: bytes) -> None:
    with pytest.raises(ValueError):
        values.find_stat_value(data, b"inactive_file" if b"total" not in data else
                               b"total_inactive_file")


# v1 memory.stat as 6.18 writes it here, with swap accounting on and no swap on the host
# (the swap lines sit between workingset_refault_file and pgpgin, and again in the total_ part).
V1_STAT_SWAP_ACCOUNTED = (
    b"cache 251674624\nrss 257077248\nrss_huge 220200960\nshmem 0\nmapped_file 20635648\n"
    b"dirty 6365184\nwriteback 0\nworkingset_refault_anon 0\nworkingset_refault_file 7081\n"
    b"swap 0\nswapcached 0\npgpgin 620040\npgpgout 585502\npgfault 971993\n"
    b"pgmajfault 77\ninactive_anon 256917504\nactive_anon 36864\n"
    b"inactive_file 203214848\nactive_file 48459776\nunevictable 0\n"
    b"hierarchical_memory_limit 9223372036854771712\n"
    b"hierarchical_memsw_limit 9223372036854771712\ntotal_cache 251678720\n"
    b"total_rss 257077248\ntotal_swap 0\ntotal_swapcached 0\n"
    b"total_inactive_file 203214848\ntotal_unevictable 0\n")


@pytest.mark.parametrize(("data", "expected"), [
    pytest.param(V1_STAT_SWAP_ACCOUNTED, 0, id="6.18-no-swap-on-the-host"),
    # A parent whose child swapped 4 MiB: `swap` is the level's own pages (0), `total_swap`
    # its subtree's, which memsw.usage_in_bytes counts too.
    pytest.param(V1_STAT_SWAP_ACCOUNTED.replace(b"total_swap 0", b"total_swap 4194304"),
                 4194304, id="a-child-swapped"),
    pytest.param(b"swap 8192\nswapcached 0\ntotal_swap 12288\ntotal_swapcached 4096\n",
                 12288, id="swapcached-is-another-key"),
    pytest.param(b"total_swap 4096", 4096, id="first-and-last-line"),
    # swapaccount=0 (or CONFIG_MEMCG_SWAP off): memcg1_stat_format() writes no swap lines.
    pytest.param(V1_STAT, None, id="swap-accounting-off"),
    pytest.param(b"swap 4096\ntotal_swapcached 0\n", None, id="only-the-local-line"),
])
def test_parse_v1_swap(data: bytes, expected: Optional[int]) -> None:
    assert values.parse_v1_swap(data) == expected


@pytest.mark.parametrize("data", [b"total_swap -4096\n", b"total_swap \xb2\n",
                                  b"total_swap 1_000\n"])
def test_parse_v1_swap_rejects_garbage(data: bytes) -> None:
    with pytest.raises(ValueError):
        values.parse_v1_swap(data)


MEMINFO = b"""MemTotal:       24684084 kB
MemFree:        22156340 kB
MemAvailable:   24055588 kB
Buffers:           12345 kB
HugePages_Total:       0
"""


def test_meminfo() -> None:
    assert values.find_meminfo_value(MEMINFO, b"MemTotal") == 24684084 * 1024
    assert values.find_meminfo_value(MEMINFO, b"HugePages_Total") == 0  # no unit: pages
    assert values.find_meminfo_value(MEMINFO, b"MemAvailable") == 24055588 * 1024
    with pytest.raises(ValueError):
        values.find_meminfo_value(MEMINFO, b"SwapTotal")


@pytest.mark.parametrize("data", [
    "MemAvailable: \u0661\u0662\u0663 kB\n".encode(),
    b"MemAvailable: 1_000 kB\n",
    b"MemAvailable: 12\x00 kB\n",
    b"MemAvailable: " + b"9" * 400 + b" kB\n",
    b"MemAvailable:\n",
])
def test_meminfo_rejects_non_numbers(data: bytes) -> None:
    with pytest.raises(ValueError):
        values.find_meminfo_value(data, b"MemAvailable")


@pytest.mark.parametrize(("text", "expected"), [
    ("low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n",
     {"low": 0, "high": 12, "max": 3, "oom": 1, "oom_kill": 1, "oom_group_kill": 0}),
    ("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
     {"oom_kill_disable": 0, "under_oom": 0, "oom_kill": 4}),
    ("garbage\nhigh x\n", {}),
    ("oom_kill \u00b2\nmax \u0661\u0662\u0663\nhigh 4\n", {"high": 4}),
    ("max 12\x00\nhigh 1_0\nlow +1\n", {}),
])
def test_flat_keyed(text: str, expected: dict[str, int]) -> None:
    assert values.parse_flat_keyed(text) == expected


ZONEINFO = """Node 0, zone      DMA
  per-node stats
      nr_inactive_anon 467
  pages free     3840
        boost    0
        min      41
        low      54
        high     67
        spanned  4095
        managed  3840
        protection: (0, 3019, 5579, 5579, 5579)
  pagesets
    cpu: 0
              count: 0
              high:  0
Node 0, zone    DMA32
  pages free     700000
        min      8000
        low      10000
        high     13676
        managed  772915
        protection: (0, 0, 2560, 2560, 2560)
    cpu: 0
              high:  5698
"""


def test_zoneinfo_reserve_bound() -> None:
    # high + max(protection) per zone, per-cpu "high:" lines ignored.
    assert values.parse_zoneinfo_reserve_bound(ZONEINFO) == (67 + 5579) + (13676 + 2560)
    with pytest.raises(ValueError):
        values.parse_zoneinfo_reserve_bound("")


def test_zoneinfo_ignores_non_ascii_digits() -> None:
    text = ZONEINFO.replace("high     67", "high     \u0666\u0667")
    assert values.parse_zoneinfo_reserve_bound(text) == 5579 + (13676 + 2560)


# PSI files as 6.1 (the VM tier, cgroup v2) writes them; the `full` line exists for memory.
PSI = b"some avg10=1.50 avg60=0.40 avg300=0.08 total=2500000\n" \
      b"full avg10=1.20 avg60=0.30 avg300=0.06 total=1800000\n"


class PressureRow(NamedTuple):
    text: values.Text
    want: dict[str, int]  # microseconds by kind, written out


PRESSURE = [
    pytest.param(PressureRow(PSI, {"some": 2500000, "full": 1800000}), id="both-lines"),
    # 4.20-5.1 memory.pressure had both lines too; a `some`-only file (cpu.pressure before
    # 5.13) has no full line: no "full" total, which the guard reads as "PSI unread".
    pytest.param(PressureRow(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", {"some": 0}),
                 id="zero-no-full-line"),
    pytest.param(PressureRow("some avg10=1.23 avg60=0.40 avg300=0.10 total=7\n", {"some": 7}),
                 id="str"),
    # The largest u64 the kernel's "%llu" can print.
    pytest.param(PressureRow(b"full avg10=0.00 avg60=0.00 avg300=0.00 total=18446744073709551615\n",
                             {"full": 18446744073709551615}), id="u64-max"),
]


@pytest.mark.parametrize("row", PRESSURE)
def test_parse_pressure(row: PressureRow) -> None:
    assert values.parse_pressure(row.text) == row.want


# Refused before by both parsers (no total; the guard's digits-only check).
PRESSURE_REFUSED = [
    pytest.param(b"", id="empty"),
    pytest.param(b"some avg10=0.00\n", id="no-total"),
    pytest.param(b"full avg10=0.00 total=\xd9\xa3\n", id="arabic-indic-digit-bytes"),
    pytest.param(b"full avg10=0.00 total=\n", id="empty-total"),
    # `total= 5`: the space splits the item, so the total is empty (int("") refused it too).
    pytest.param(b"full avg10=0.00 total= 5\n", id="space-after-equals"),
]

# The tightening: the Prometheus collector's parser took these through int() before the one
# digits-only parser (int() reads signs, underscores and non-ASCII digits, and any length).
PRESSURE_TIGHTENED = [
    pytest.param(b"full avg10=0.00 total=-5\n", id="negative"),
    pytest.param(b"some avg10=0.00 total=+5\n", id="plus-sign"),
    pytest.param(b"some avg10=0.00 total=1_000\n", id="underscore"),
    pytest.param("some avg10=0.00 total=\u0663\n", id="arabic-indic-digit-str"),
    pytest.param("some avg10=0.00 total=\uff15\n", id="fullwidth-digit-str"),
    pytest.param(b"some avg10=0.00 total=" + b"1" * 21 + b"\n", id="more-digits-than-a-u64"),
    # One good line does not make a file with a bad total trustworthy.
    pytest.param(b"some avg10=0.00 total=5\nfull avg10=0.00 total=+5\n", id="one-line-bad"),
]


@pytest.mark.parametrize("text", PRESSURE_REFUSED + PRESSURE_TIGHTENED)
def test_parse_pressure_refuses(text: values.Text) -> None:
    with pytest.raises(ValueError):
        values.parse_pressure(text)
