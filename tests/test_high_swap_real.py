"""Real kernel: memory.high and the swap limit are shown (`cgwatch --json`, the table), and
total_memory() / available_memory() keep their meaning. v2 in the VM (memory.high is v2's);
v1 here shows the swap limit where the kernel accounts swap (memory.memsw.*), and swap used
is the kernel's own figure (0 on this host without swap, in every read)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

import cgwatch
from tests.cgroup_helpers import (
    MiB,
    Tree,
    cgroup_tree,
    read,
    real_kernel_marks,
    wait_for,
    write,
)

pytestmark = real_kernel_marks()


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def test_memory_high_and_swap_in_json_and_table(tree: Tree) -> None:
    ours = tree.make("ours", limit=512 * MiB)
    if tree.version == 2:
        write(os.path.join(ours, "memory.high"), str(256 * MiB))
        swap = os.path.join(ours, "memory.swap.max")
        if os.path.exists(swap):
            write(swap, str(64 * MiB))
    else:
        swap = os.path.join(ours, "memory.memsw.limit_in_bytes")
        if not os.path.exists(swap):
            pytest.skip("this v1 kernel does not account swap (no memory.memsw.*)")
        write(swap, str(576 * MiB))  # memory + swap: 64 MiB of swap
    tree.allow_processes(ours)
    data = json.loads(tree.run_cli(ours, "--json"))
    level = next(lvl for lvl in data["levels"] if lvl["directory"] == ours)
    assert data["total_memory"] == 512 * MiB  # memory.high is no hard limit
    assert 0 < data["available_memory"] <= 512 * MiB
    if tree.version == 2:
        assert level["high"] == 256 * MiB
        assert 0 < level["high_headroom"] <= 256 * MiB
        assert data["throttle_headroom"] == level["high_headroom"]
    if os.path.exists(swap):
        assert level["swap_limit"] == 64 * MiB
        assert level["swap_usage"] is not None and level["swap_usage"] >= 0
    table = tree.run_cli(ours)
    header = next(line for line in table.splitlines() if "headroom" in line)
    assert ("high" in header) == (tree.version == 2)
    if tree.version == 2:
        assert "256.0 MiB" in table and "before throttling:" in table


def _swap_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("SwapTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no SwapTotal in /proc/meminfo")


def test_v1_swap_used_is_zero_on_a_host_without_swap(tree: Tree) -> None:
    """v1 swap used is memory.stat's total_swap, one kernel counter: 0 at every level in
    every read on a host without swap, while usage moves under a process that allocates and
    frees 8 MiB in a loop. (memsw.usage - usage, two counters read at two moments, showed
    116-256 KiB, or nothing, in 5-16 of 20 `cgwatch --json` runs on this 6.18 host.)"""
    if tree.version != 1:
        pytest.skip("v1: v2's memory.swap.current is already one kernel counter")
    if _swap_total() != 0:
        pytest.skip("the host has swap: a non-zero figure would be true")
    churn = tree.make("churn", limit=256 * MiB)
    if not os.path.exists(os.path.join(churn, "memory.memsw.usage_in_bytes")):
        pytest.skip("this v1 kernel does not account swap (no memory.memsw.*)")
    proc = tree.spawn(churn, "while True:\n    b = bytearray(8 << 20)\n    del b\n")
    assert wait_for(lambda: str(proc.pid) in read(os.path.join(churn, "cgroup.procs")).split(),
                    timeout=30)
    with cgwatch.Monitor(pid=proc.pid, thread=False) as monitor:
        seen = [(lvl.cgroup_path, lvl.swap_usage) for _ in range(300)
                for lvl in monitor.levels() if not lvl.hidden]
    assert seen and {swap for _, swap in seen} == {0}, [s for s in seen if s[1] != 0][:5]
    assert any(path.endswith("/churn") for path, _ in seen), seen[:3]
