"""Real kernel: bench.campaign's cgroups count what the campaign's tables say. A run's cgroup,
made by `campaign.Cgroups` below our own with a limit, entered as the campaign's jobs enter
it, counts the kernel's OOM kill, its limit hits and its peak; on v2 (the VM tier) also
memory.events' `high` and memory.pressure's stall seconds, and `--high-share` writes
memory.high. Both versions: v1 here, v2 in tests/v2/run."""

from __future__ import annotations

import os
import subprocess
import sys

from bench import campaign
from tests.cgroup_helpers import MiB, read, real_kernel_marks

pytestmark = real_kernel_marks()


def test_a_runs_cgroup_counts_the_oom_kill_the_limit_hits_and_the_peak() -> None:
    groups = campaign.Cgroups()
    try:
        run = groups.make("run-0", 64 * MiB)
        # 200 MiB written in a 64 MiB cgroup (no swap on this host nor in the VM): killed
        hog = "b = b'x' * (200 << 20)"
        ended = subprocess.run([sys.executable, "-c", campaign.ENTER, run, sys.executable,
                                "-c", hog], timeout=120, stderr=subprocess.DEVNULL)
        assert ended.returncode == -9
        got = groups.counters(run)
        assert got["oom_kill"] == 1
        assert got["failcnt"] >= 1
        assert 48 * MiB <= got["peak"] <= 64 * MiB
        if groups.version == 2:
            assert got["high"] == 0  # memory.high is "max": never crossed
            # PSI is on in the VM (psi=1): reclaim at the limit before the kill is a stall,
            # however short
            assert got["some"] is not None and got["full"] is not None
            assert got["some"] >= got["full"] >= 0.0
            high = groups.make("run-1", 64 * MiB, high_share=0.5)
            assert read(os.path.join(high, "memory.high")).strip() == str(32 * MiB)
        else:
            assert set(got) == {"oom_kill", "failcnt", "peak"}
    finally:
        groups.close()
    assert not os.path.exists(groups.top)
