"""cgwatch.psutil_view: psutil's own named tuple with cgroup-aware totals, and the opt-in
patch of psutil.virtual_memory."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from cgwatch import psutil_view
from cgwatch.psutil_view import (
    is_patched,
    patch_psutil,
    patched_psutil,
    unpatch_psutil,
    virtual_memory,
)
from tests.cgroup_helpers import MiB, cgroup_tree, writable_reason

ORIGINAL = psutil.virtual_memory
LINUX = sys.platform.startswith("linux")


class FakeMonitor:
    """Answers fixed values where the view expects a cgwatch.Monitor."""

    def __init__(self, total: int, available: int) -> None:
        self.total, self.available = total, available
        self.calls = 0

    def total_memory(self) -> int:
        self.calls += 1
        return self.total

    def available_memory(self) -> int:
        return self.available


@pytest.fixture(autouse=True)
def restore_psutil() -> Iterator[None]:
    yield
    unpatch_psutil()
    # A test that wraps psutil on top of ours leaves our patch in the chain: reset by hand.
    psutil.virtual_memory = ORIGINAL
    psutil_view._installed = None
    psutil_view._host_virtual_memory = None


def test_same_type_and_fields_as_psutil_each_typed_as_psutils() -> None:
    host = psutil.virtual_memory()
    view = virtual_memory()
    assert type(view) is type(host)
    assert view._fields == host._fields
    for name in host._fields:
        assert type(getattr(view, name)) is type(getattr(host, name)), name
    assert isinstance(view.percent, float)


def test_fields_derived_from_the_cgroup_values() -> None:
    host = psutil.virtual_memory()
    view = virtual_memory(FakeMonitor(total=8000 * MiB, available=2000 * MiB))
    assert view.total == 8000 * MiB
    assert view.available == 2000 * MiB
    assert view.percent == 75.0
    if LINUX:
        assert view.used == 6000 * MiB
    assert view.free == min(host.free, 2000 * MiB)
    # Host-wide counters pass through untouched.
    for name in set(host._fields) - {"total", "available", "percent", "used", "free"}:
        assert getattr(view, name) >= 0


def test_available_never_above_total_and_zero_total() -> None:
    view = virtual_memory(FakeMonitor(total=100, available=500))
    assert (view.total, view.available, view.percent) == (100, 100, 0.0)
    view = virtual_memory(FakeMonitor(total=0, available=0))
    assert (view.total, view.available, view.percent, view.free) == (0, 0, 0.0, 0)


def test_percent_rounded_like_psutil() -> None:
    view = virtual_memory(FakeMonitor(total=3, available=1))
    assert view.percent == 66.7


def test_patch_and_unpatch() -> None:
    fake = FakeMonitor(total=123 * MiB, available=45 * MiB)
    assert not is_patched()
    assert patch_psutil(fake) is True
    assert is_patched()
    assert psutil.virtual_memory().total == 123 * MiB
    assert psutil.virtual_memory.__wrapped__ is ORIGINAL  # type: ignore[attr-defined]
    assert patch_psutil(FakeMonitor(1, 1)) is False  # idempotent: first monitor stays
    assert psutil.virtual_memory().total == 123 * MiB
    assert unpatch_psutil() is True
    assert psutil.virtual_memory is ORIGINAL
    assert unpatch_psutil() is False
    assert psutil.virtual_memory().total == ORIGINAL().total


def test_context_manager_nests() -> None:
    fake = FakeMonitor(total=64 * MiB, available=32 * MiB)
    with patched_psutil(fake):
        with patched_psutil():
            assert psutil.virtual_memory().total == 64 * MiB
        assert is_patched()  # the inner block did not install it, so it does not remove it
    assert psutil.virtual_memory is ORIGINAL


def test_context_manager_unpatches_on_error() -> None:
    with pytest.raises(RuntimeError), patched_psutil(FakeMonitor(1, 1)):
        raise RuntimeError("boom")
    assert psutil.virtual_memory is ORIGINAL


def test_no_recursion_when_the_monitor_itself_asks_psutil() -> None:
    """cgwatch falls back to psutil for host figures where /proc/meminfo is unusable; with
    the patch on, that inner call must get psutil's own answer."""

    class AsksPsutil(FakeMonitor):
        def total_memory(self) -> int:
            return min(psutil.virtual_memory().total, 77 * MiB)

    with patched_psutil(AsksPsutil(0, 10 * MiB)):
        assert psutil.virtual_memory().total == 77 * MiB


def test_someone_elses_wrapper_on_top_is_left_in_place() -> None:
    patch_psutil(FakeMonitor(total=5 * MiB, available=1 * MiB))
    ours = psutil.virtual_memory

    def theirs() -> Any:
        return ours()

    psutil.virtual_memory = theirs
    assert unpatch_psutil() is False
    assert psutil.virtual_memory is theirs
    assert psutil.virtual_memory().total == 5 * MiB  # still answers, no recursion
    assert patch_psutil() is False  # ours is still in the chain: not stacked twice
    assert psutil.virtual_memory().total == 5 * MiB


def test_module_does_not_keep_a_stale_original() -> None:
    assert psutil_view._host_virtual_memory is None
    with patched_psutil(FakeMonitor(1, 1)):
        assert psutil_view._host_virtual_memory is ORIGINAL
    assert psutil_view._host_virtual_memory is None


CHILD = textwrap.dedent("""
    import json, psutil, cgwatch
    from cgwatch.psutil_view import virtual_memory, patched_psutil

    monitor = cgwatch.default_monitor()
    ballast = bytearray(64 << 20)  # charge some anonymous memory to the cgroup

    def same_moment(read):
        for _ in range(200):
            a1 = monitor.available_memory()
            view = read()
            a2 = monitor.available_memory()
            if a1 == a2:
                break
        return dict(view._asdict()), [a1, a2], type(view).__name__

    view, avail, name = same_moment(virtual_memory)
    with patched_psutil():
        patched, patched_avail, _ = same_moment(psutil.virtual_memory)
    host = psutil.virtual_memory()
    print("RESULT " + json.dumps(dict(
        view=view, avail=avail, patched=patched, patched_avail=patched_avail,
        total=monitor.total_memory(), mode=monitor.status.mode, type_name=name,
        host_type_name=type(host).__name__, host_total=host.total)))
""")


@pytest.mark.realkernel
def test_in_a_limited_cgroup_total_and_available_equal_the_monitors() -> None:
    why = writable_reason()
    if why:
        pytest.skip(f"needs a writable memory cgroup: {why}")
    limit = 256 * MiB
    with cgroup_tree() as tree:
        cg = tree.make("psutil-view", limit=limit)
        proc = tree.spawn(cg, CHILD)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out + err
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["type_name"] == r["host_type_name"] == "svmem"
    assert r["total"] == limit < r["host_total"]
    for view, (a1, a2) in ((r["view"], r["avail"]), (r["patched"], r["patched_avail"])):
        assert view["total"] == r["total"]
        assert view["available"] == a1 == a2
        assert 0 < view["available"] < limit - 64 * MiB  # the ballast counts
        assert view["percent"] == round((limit - view["available"]) / limit * 100, 1)
        assert view["used"] == limit - view["available"]
        assert view["free"] <= view["available"]
