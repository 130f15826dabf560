"""Slurm enforcing memory by sampling (JobAcctGatherParams=OverMemoryKill, no
ConstrainRAMSpace): no cgroup has a limit; the declared --mem is in the batch job's
environment, and slurmstepd SIGKILLs the step within about a second of passing it."""

from __future__ import annotations

import json
import re

from tests.slurm.jobs import PYTHON, MiB, sbatch

ALLOCATE = ("import time\nb = []\nwhile True:\n    b.append(bytearray(32 << 20))\n"
            "    time.sleep(0.05)\n")


def test_declared_limit_counts_and_sampled_kill_is_named() -> None:
    script = (f"{PYTHON} -m cgwatch --json\n"
              f"{PYTHON} -m cgwatch run -- srun {PYTHON} -c '{ALLOCATE}'\n"
              "echo \"run exit $?\"\n")
    job, text = sbatch(script, "--mem=300M")
    data, end = json.JSONDecoder().raw_decode(text)
    rest = text[end:]
    # no cgroup limit: the declared --mem is total_memory(), a level of its own, said in status
    assert data["total_memory"] == 300 * MiB
    assert 0 < data["available_memory"] < 300 * MiB
    assert [lvl["limit"] for lvl in data["levels"] if lvl["kind"] == "slurm"] == [300 * MiB]
    # no cgroup enforces it (v2 confined: the namespace root has our own 1 GiB, above it)
    assert all(lvl["limit"] is None or lvl["limit"] > 300 * MiB
               for lvl in data["levels"] if lvl["kind"] == "cgroup")
    assert "declared, not enforced by a cgroup" in data["status"]["reason"]
    assert data["slurm"]["enforced_by_cgroup"] is False
    # slurmstepd's kill, and cgwatch run (wrapping srun) naming it
    assert "exceeded memory limit" in rest
    assert "run exit 137" in rest
    flat = re.sub(r"\s+", " ", rest.replace("cgwatch:", ""))
    assert "most likely slurmstepd's memory sampling killed the step" in flat
    assert f"sacct -j {job} -o JobID,MaxRSS,ReqMem,State" in flat
