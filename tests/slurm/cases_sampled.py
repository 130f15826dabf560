"""Slurm enforcing memory by sampling (JobAcctGatherParams=OverMemoryKill, no
ConstrainRAMSpace): no cgroup has a limit; the declared --mem is in the batch job's
environment, and slurmstepd SIGKILLs the step within about a second of passing it."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

from tests.slurm.jobs import PYTHON, STATE, MiB, cgwatch_json, sbatch, srun

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


def comparable(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The levels of `cgwatch --json` without what differs between two jobs by nature: the
    job's id, the step's name (0 or batch), usage and headroom."""
    def same(text: Optional[str]) -> Optional[str]:
        if text is None:
            return None
        text = re.sub(r"job_\d+|slurm job \d+", lambda m: m.group(0).rstrip("0123456789") + "J",
                      text)
        return re.sub(r"step_(\d+|batch)", "step_S", text)
    return [(lvl["kind"], same(lvl["cgroup_path"]), lvl["limit"], lvl["slurm_role"],
             lvl["binds_total"]) for lvl in data["levels"]]


def test_plain_srun_mem_is_asked_of_the_controller_as_sbatch_declares_it() -> None:
    """A plain srun exports no SLURM_MEM_PER_NODE: cgwatch asks scontrol once and answers
    what an sbatch --mem=300M job's environment says."""
    srun_data = cgwatch_json("--mem=300M")
    _, text = sbatch(f"{PYTHON} -m cgwatch --json\n", "--mem=300M")
    batch, _ = json.JSONDecoder().raw_decode(text)
    assert srun_data["total_memory"] == batch["total_memory"] == 300 * MiB
    assert 0 < srun_data["available_memory"] < 300 * MiB
    assert comparable(srun_data) == comparable(batch)
    assert [lvl["limit"] for lvl in srun_data["levels"] if lvl["kind"] == "slurm"] == [300 * MiB]
    assert "declared, not enforced by a cgroup" in srun_data["status"]["reason"]
    assert "controller could not say" not in srun_data["status"]["reason"]
    for key in ("option", "declared_limit", "enforced_by_cgroup"):
        assert srun_data["slurm"][key] == batch["slurm"][key], key
    assert srun_data["slurm"]["option"] == "--mem=300M"


def test_plain_srun_without_scontrol_says_so_and_answers_the_cgroups() -> None:
    # PATH is an empty directory of the tier's own, not the system's bin directories: a host
    # with Debian's slurm-client installed has /usr/bin/scontrol (the job's interpreter is
    # named by its full path)
    empty = os.path.join(STATE, "no-scontrol")
    os.makedirs(empty, exist_ok=True)
    data = json.loads(srun("--mem=300M", "env", f"PATH={empty}", PYTHON,
                           "-m", "cgwatch", "--json").stdout)
    reason = data["status"]["reason"]
    assert "(scontrol is not on PATH)" in reason, reason
    assert "total_memory() is what the cgroups say" in reason
    assert [lvl for lvl in data["levels"] if lvl["kind"] == "slurm"] == []
    cgroup_limits = [lvl["limit"] for lvl in data["levels"]
                     if lvl["kind"] == "cgroup" and lvl["limit"] is not None]
    assert data["total_memory"] == min(cgroup_limits + [data["host"]["mem_total"]]) > 300 * MiB
