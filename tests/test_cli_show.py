"""The table's marks follow the answers (the host row when the host's figure is the answer),
and memory.high / swap columns appear only where some level has them. Pure: format_table on
the report's data."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from cgwatch.cli.show import format_table
from tests.fake_tree import GiB, MiB


def data(total: int, available: int, levels: list[dict[str, Any]]) -> dict[str, Any]:
    return {"total_memory": total, "available_memory": available, "dev_shm": None,
            "throttle_headroom": None,
            "host": {"mem_total": 8 * GiB, "mem_available": 4 * GiB, "source": "meminfo"},
            "status": {"mode": "watching", "reason": "", "version": 2, "cgroup_path": "/job",
                       "directory": "/sys/fs/cgroup/job", "above": ""},
            "levels": levels}


def level(limit: Optional[int], t: bool = False, a: bool = False, **more: Any) -> dict[str, Any]:
    return {"cgroup_path": "/job", "limit": limit, "usage": 100 * MiB, "inactive_file": 0,
            "headroom": None if limit is None else limit - 100 * MiB, "binds_total": t,
            "binds_available": a, **more}


def host_row(table: str) -> str:
    return next(line for line in table.splitlines() if " host " in f" {line} ")


@pytest.mark.parametrize("total, available, levels, mark", [
    # no limit anywhere: the host's figures are both answers
    (8 * GiB, 4 * GiB, [level(None)], "TA"),
    # MemAvailable read again for the table a moment later: within 1% is the same
    (8 * GiB, 4 * GiB - 3 * MiB, [level(None)], "TA"),
    # a 30 GiB limit on an 8 GiB host: the host sets both
    (8 * GiB, 4 * GiB, [level(30 * GiB)], "TA"),
    # a 1 GiB limit sets total, the host's MemAvailable is above its headroom
    (1 * GiB, 924 * MiB, [level(1 * GiB, t=True, a=True)], ""),
    # a 6 GiB limit sets total; the host's MemAvailable (4 GiB) sets available
    (6 * GiB, 4 * GiB, [level(6 * GiB, t=True)], "A"),
])
def test_host_row_is_marked_when_the_host_binds(total: int, available: int,
                                                levels: list[dict[str, Any]],
                                                mark: str) -> None:
    row = host_row(format_table(data(total, available, levels)))
    assert row.split()[0] == (mark or "host")


def test_high_and_swap_columns_only_where_a_level_has_them() -> None:
    plain = format_table(data(1 * GiB, 924 * MiB, [level(1 * GiB, t=True, a=True)]))
    assert "high" not in plain and "swap" not in plain
    shown = format_table(data(1 * GiB, 924 * MiB, [level(1 * GiB, t=True, a=True,
                                                         high=256 * MiB, swap_limit=64 * MiB,
                                                         swap_usage=0)]))
    header = next(line for line in shown.splitlines() if "headroom" in line)
    assert "high" in header and "swap limit" in header and "swap used" in header
    assert "256.0 MiB" in shown and "64.0 MiB" in shown
