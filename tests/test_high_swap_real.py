"""Real kernel: memory.high and the swap limit are shown (`cgwatch --json`, the table), and
total_memory() / available_memory() keep their meaning. v2 in the VM (memory.high is v2's);
v1 here shows the swap limit where the kernel accounts swap (memory.memsw.*)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from tests.cgroup_helpers import MiB, Tree, cgroup_tree, real_kernel_marks, write

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
