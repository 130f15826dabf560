"""cgroup v2 only, in the VM: a `memory.high` rise reported by `cgwatch watch`, and a PSI trigger
on `memory.pressure` firing under real pressure (the mechanism behind v2 headroom alerts).

The version-independent event tests (OOM kills, baselines, thresholds, callbacks, `cgwatch run`)
are tests/test_events_real.py, which tests/v2/run runs in the VM too.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterator

import pytest

from cgwatch import notify
from tests.cgroup_helpers import MiB, Tree, cgroup_tree, enable_memory_for_children, write
from tests.test_events_real import start_watch
from tests.v2.test_v2_kernel import WHY_NOT

SCRATCH = os.environ.get("VM_SCRATCH", "")
pytestmark = [pytest.mark.v2vm, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)]


@pytest.fixture
def tree() -> Iterator[Tree]:
    enable_memory_for_children("/sys/fs/cgroup", 2)
    with cgroup_tree() as t:
        yield t


@pytest.mark.skipif(not SCRATCH, reason="needs the VM's disk-backed scratch file system "
                                        "(page cache on tmpfs is not reclaimable)")
def test_memory_high_rise_is_reported(tree: Tree) -> None:
    job = tree.make("job")
    write(os.path.join(job, "memory.high"), str(32 * MiB))
    watch_dir = tree.make("job/watch")
    writer_dir = tree.make("job/writer")
    lines, _ = start_watch(tree, watch_dir)
    # Page cache over memory.high is reclaimed at once (clean, disk-backed): every write
    # past 32 MiB runs the high reclaim and raises `high`, without the long throttling that
    # anonymous memory over memory.high gets when there is no swap.
    target = os.path.join(SCRATCH, f"high-{os.getpid()}")
    writer = tree.spawn(writer_dir, f"""
chunk = b"x" * (1 << 20)
with open({target!r}, "wb") as f:
    for _ in range(96):
        f.write(chunk)
        f.flush()
""")
    try:
        writer.wait(timeout=120)
        assert writer.returncode == 0, writer.stderr.read() if writer.stderr else ""
        got = lines.until(time.monotonic() + 10)
    finally:
        if os.path.exists(target):
            os.unlink(target)
    highs = [rec for _, rec in got if rec.get("counter") == "high"]
    assert highs, got
    assert highs[0]["directory"] == job
    assert highs[0]["new"] > highs[0]["old"]


def test_psi_trigger_fires_under_memory_pressure(tree: Tree) -> None:
    job = tree.make("job")
    write(os.path.join(job, "memory.high"), str(16 * MiB))
    fd = notify.psi_trigger(job, "some 50000 1000000")
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        assert poller.poll(0) == [], "the trigger fired before any pressure"
        # Anonymous memory over memory.high with no swap: the allocator is throttled in reclaim,
        # which is exactly a memory stall.
        tree.spawn(tree.make("job/hog"),
                   "b = []\nwhile True:\n    b.append(bytearray(1 << 20))\n")
        fired = poller.poll(30_000)
        assert fired and fired[0][1] & select.POLLPRI, fired
    finally:
        os.close(fd)
