"""Tables for the pure parts of the events layer: counter files, rises, attribution, alerts,
threshold parsing, log rate limiting."""

from __future__ import annotations

from typing import Optional

import pytest

from cgwatch import counters, notify
from cgwatch.alerts import Threshold, crossing, usage_thresholds
from cgwatch.event import limit_text
from cgwatch.eventlog import RateLimiter

MiB = 1 << 20

V2_EVENTS = "low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\nsock_throttled 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"


@pytest.mark.parametrize("source, text, expected", [
    ("memory.events", V2_EVENTS, {"low": 0, "high": 12, "max": 3, "oom": 1, "oom_kill": 1,
                                  "oom_group_kill": 0, "sock_throttled": 0}),
    ("memory.events.local", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
     {"low": 0, "high": 0, "max": 0, "oom": 0, "oom_kill": 0}),
    # oom_kill_disable is a setting, not a counter
    ("memory.oom_control", V1_OOM_CONTROL, {"under_oom": 0, "oom_kill": 2}),
    # kernels before 4.13 have no oom_kill line
    ("memory.oom_control", "oom_kill_disable 0\nunder_oom 1\n", {"under_oom": 1}),
    ("memory.failcnt", "4711\n", {"failcnt": 4711}),
    ("memory.events", b"max 5\noom_kill 0\n", {"max": 5, "oom_kill": 0}),
    ("memory.events", "", {}),
    # Strict numbers (issue 11): a superscript or Arabic-Indic digit passes str.isdigit() but
    # is not a kernel number; the line is skipped, the others still count.
    ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill \u00b2\n", {"under_oom": 0}),
    ("memory.events", "max \u0661\u0662\u0663\noom_kill 1\n", {"oom_kill": 1}),
    ("memory.events", b"max 1_000\nmax2 +5\nmax3 -1\noom_kill 2\n", {"oom_kill": 2}),
    # one digit over u64 (21 digits) is not a counter; 20 digits is
    ("memory.events", "max 184467440737095516150\nhigh 18446744073709551615\n",
     {"high": 18446744073709551615}),
    ("memory.events", "max " + "9" * 5000 + "\noom 0\n", {"oom": 0}),
    ("memory.failcnt", " 7 \n", {"failcnt": 7}),
])
def test_parse_counters(source: str, text: str, expected: dict[str, int]) -> None:
    assert counters.parse_counters(source, text) == expected


@pytest.mark.parametrize("source, text", [
    ("memory.failcnt", "lots\n"),
    ("memory.events", "garbage without numbers\n"),
    ("memory.failcnt", "\u00b2\n"),
    ("memory.failcnt", "\u0661\u0662\u0663\n"),
    ("memory.failcnt", "4711\x00\n"),
    ("memory.failcnt", "1_000\n"),
    ("memory.failcnt", "-1\n"),
    ("memory.oom_control", "oom_kill \u00b2\n"),
])
def test_parse_counters_rejects(source: str, text: str) -> None:
    with pytest.raises(ValueError):
        counters.parse_counters(source, text)


@pytest.mark.parametrize("before, after, expected", [
    ({"oom_kill": 0}, {"oom_kill": 0}, []),
    ({"oom_kill": 0}, {"oom_kill": 1}, [("oom_kill", 0, 1)]),
    # already non-zero at the baseline: only the rise counts
    ({"oom_kill": 5, "max": 100}, {"oom_kill": 5, "max": 130}, [("max", 100, 130)]),
    # a reset (re-created cgroup, under_oom clearing) is not a rise
    ({"oom_kill": 5}, {"oom_kill": 0}, []),
    ({"under_oom": 0}, {"under_oom": 1}, [("under_oom", 0, 1)]),
    # a key without a baseline is not a rise
    ({}, {"oom_kill": 3}, []),
    ({"high": 1, "max": 1}, {"high": 2, "max": 2},
     [("high", 1, 2), ("max", 1, 2)]),
])
def test_rises(before: dict[str, int], after: dict[str, int],
               expected: list[tuple[str, int, int]]) -> None:
    assert counters.rises(before, after) == expected


@pytest.mark.parametrize("deltas, expected", [
    ([1, 1, 1], [False, True, True]),  # one kill at the leaf, echoed by two ancestors
    ([0, 1, 1], [False, False, True]),  # the kill was at level 1 (or below it, off the path)
    ([1, 2, 2], [False, False, True]),  # level 1 had one of its own too
    ([0, 0, 0], [False, False, False]),
    ([2], [False]),
    ([1, 0, 1], [False, False, False]),  # level 2's rise came from another child
])
def test_propagated(deltas: list[int], expected: list[bool]) -> None:
    assert counters.propagated(deltas) == expected


def test_propagation_split_over_two_scans() -> None:
    # Seen in the v2 VM: a scan read the leaf's oom_kill after the kernel raised it and the
    # parent's before; the parent's rise arrives alone in the next scan and is still the same
    # kill, not one of the parent's own.
    flags, carry = counters.propagated_across_scans([1, 1, 0], [0, 0, 0])
    assert flags == [False, True, False] and carry == [0, 0, 1]
    flags, carry = counters.propagated_across_scans([0, 0, 1], carry)
    assert flags == [False, False, True] and carry == [0, 0, 0]
    # A later rise with nothing carried is the parent's own again.
    flags, _ = counters.propagated_across_scans([0, 0, 1], carry)
    assert flags == [False, False, False]


@pytest.mark.parametrize("counts, expected", [
    # registered at levels 1 and 3; an OOM at 3 notifies 1 too
    ([None, 1, None, 1], [0, 0, 0, 1]),
    ([None, 2, None, 1], [0, 1, 0, 1]),  # level 1 also had one of its own
    ([None, 1, None, 0], [0, 1, 0, 0]),
    ([3], [3]),
    ([None, None], [0, 0]),
    ([0, 1], [0, 1]),  # read mid-notification: never negative
])
def test_attribute_notifications(counts: list[Optional[int]], expected: list[int]) -> None:
    assert counters.attribute_notifications(counts) == expected


@pytest.mark.parametrize("counter, severity", [
    ("oom_kill", "error"), ("oom", "error"), ("oom_group_kill", "error"),
    ("under_oom", "error"), ("max", "warning"), ("high", "warning"), ("failcnt", "warning"),
    ("low", "info"), ("sock_throttled", "info"),
])
def test_severity(counter: str, severity: str) -> None:
    assert counters.severity(counter) == severity


def test_counter_files_per_version() -> None:
    assert counters.counter_files(2) == ("memory.events", "memory.events.local")
    assert counters.counter_files(1) == ("memory.oom_control", "memory.failcnt")


# ---- alerts ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("512M", Threshold(bytes=512 * MiB)),
    ("512MiB", Threshold(bytes=512 * MiB)),
    ("512mb", Threshold(bytes=512 * MiB)),
    ("1.5G", Threshold(bytes=1536 * MiB)),
    ("64k", Threshold(bytes=65536)),
    ("1048576", Threshold(bytes=MiB)),
    ("10%", Threshold(fraction=0.1)),
    (" 2.5 % ", Threshold(fraction=0.025)),
])
def test_threshold_parse(text: str, expected: Threshold) -> None:
    assert Threshold.parse(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-5M", "1.5", "0", "0%", "100%", "150%", "5X"])
def test_threshold_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        Threshold.parse(text)


@pytest.mark.parametrize("spec, total, expected, margin", [
    (Threshold(bytes=100 * MiB), 1 << 30, 100 * MiB, 5 * MiB),
    (Threshold(fraction=0.25), 1 << 30, 256 * MiB, (256 * MiB) // 20),
    (Threshold(bytes=100 * MiB, hysteresis=MiB), 1 << 30, 100 * MiB, MiB),
])
def test_threshold_bytes(spec: Threshold, total: int, expected: int, margin: int) -> None:
    assert spec.bytes_for(total) == expected
    assert spec.rearm_margin(expected) == margin


@pytest.mark.parametrize("below, available, expected", [
    (None, 200, (False, False)),  # starting above: nothing to say
    (None, 50, (True, True)),  # already below at the first check: say so
    (False, 150, (False, False)),
    (False, 99, (True, True)),  # the drop
    (True, 50, (True, False)),  # still below: once is enough
    (True, 100, (True, False)),  # at the line, within the hysteresis
    (True, 104, (True, False)),
    (True, 105, (False, True)),  # back above threshold + margin
])
def test_crossing(below: Optional[bool], available: int,
                  expected: tuple[bool, bool]) -> None:
    assert crossing(below, available, 100, 5) == expected


@pytest.mark.parametrize("limits, threshold, expected", [
    ([None, 1000, None, 500], 100, [None, 900, None, 400]),
    ([1000], 1000, [None]),  # limit at or under the threshold: nothing to arm
    ([50, None], 100, [None, None]),
])
def test_usage_thresholds(limits: list[Optional[int]], threshold: int,
                          expected: list[Optional[int]]) -> None:
    assert usage_thresholds(limits, threshold) == expected


# ---- log records -------------------------------------------------------------------------

def test_rate_limiter_holds_back_and_counts() -> None:
    now = [0.0]
    limiter = RateLimiter(10.0, clock=lambda: now[0])
    key = ("/a", "max")
    assert limiter.allow(key, 3) == (True, 0)
    now[0] = 5.0
    assert limiter.allow(key, 4) == (False, 0)
    assert limiter.allow(("/b", "max")) == (True, 0)  # other keys are independent
    now[0] = 10.5
    assert limiter.allow(key, 1) == (True, 4)  # says how many were held back


@pytest.mark.parametrize("limit, path_limit, expected", [
    (64 * MiB, None, "64.0 MiB"),
    (None, (64 * MiB, "/a"), "none here; 64.0 MiB at /a"),
    (None, None, "none here"),
])
def test_limit_text(limit: Optional[int], path_limit: Optional[tuple[int, str]],
                    expected: str) -> None:
    assert limit_text(limit, path_limit) == expected


@pytest.mark.parametrize("trigger, expected", [
    ("some 100000 1000000", "some 200000 2000000"),
    ("full 150000 2000000", "full 150000 2000000"),
    ("some 500000 3000000", "some 666666 4000000"),
    ("some 100000", None),
    ("some x 1000000", None),
    ("some \u0661 1000000", None),
    ("some 100000 \u00b2", None),
    ("some 1_000 1000000", None),
])
def test_unprivileged_psi_trigger(trigger: str, expected: Optional[str]) -> None:
    assert notify.unprivileged_trigger(trigger) == expected
