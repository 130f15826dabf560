"""What the Slurm tier's cases share: running srun and sbatch against the cluster that
tests/slurm/run started (SLURM_CONF, PATH), and cgwatch inside the jobs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from typing import Any, Optional

import pytest

from cgwatch.envswitch import switch_on

MiB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.environ.get("SLURM_TIER_PYTHON", "")
STATE = os.environ.get("SLURM_TIER_STATE", "")
# torch + DeepSpeed: .venv-integration's interpreter (tests/slurm/run, scripts/test)
INTEGRATION_PYTHON = os.environ.get("SLURM_TIER_INTEGRATION_PYTHON", "")
GUEST = os.environ.get("SLURM_TIER_GUEST") == "1"  # the VM part (cgroup v2)
# A loaded 2-core machine: a job waits up to ~3 s for the previous one's resources (docs/testing.md)
TIMEOUT = 120



def integration_python(what: str) -> str:
    """.venv-integration's interpreter for a job that needs `what` (torch and more): skip
    saying why when there is none, or fail under CGWATCH_REQUIRE_REAL=1."""
    if INTEGRATION_PYTHON and os.access(INTEGRATION_PYTHON, os.X_OK):
        return INTEGRATION_PYTHON
    why = (f"no {what} interpreter ({INTEGRATION_PYTHON or 'none given'}): "
           "tests/integration/setup makes .venv-integration; scripts/test passes it in "
           "SLURM_TIER_INTEGRATION_PYTHON")
    if switch_on("CGWATCH_REQUIRE_REAL", os.environ):
        pytest.fail(why)
    pytest.skip(why)


if not os.environ.get("SLURM_CONF") or not PYTHON:
    pytest.skip("run by tests/slurm/run (it starts the cluster)", allow_module_level=True)


def srun(*args: str, check: bool = True,
         env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    """`srun ARGS`, its output as text (cwd: the checkout, so `-m cgwatch` imports it); `env`:
    variables added to ours (srun passes the caller's environment to the job)."""
    out = subprocess.run(["srun", *args], capture_output=True, text=True, cwd=REPO,
                         timeout=TIMEOUT, env={**os.environ, **(env or {})})
    if check and out.returncode != 0:
        raise AssertionError(f"srun {' '.join(args)}: {out.returncode}\n{out.stderr}")
    return out


def cgwatch_json(*srun_args: str) -> dict[str, Any]:
    """`cgwatch --json` inside `srun SRUN_ARGS`."""
    data: dict[str, Any] = json.loads(srun(*srun_args, PYTHON, "-m", "cgwatch", "--json").stdout)
    return data


# A job's states once it has ended for good (22.05's job_state_string()); a job that Slurm
# requeues passes through COMPLETING and PENDING instead
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def sbatch(script: str, *args: str, timeout: float = TIMEOUT) -> tuple[int, str]:
    """Run a batch script to its end, also through a requeue; (job id, its output file's
    text). Not `sbatch --wait`: it polls at growing intervals, up to 10 s apart (sbatch.c,
    `_job_wait()`), and the two-node requeued job (its lives and hold ~85-95 s) came back
    after 106.0 s in 4 runs of 4; `scontrol` every 0.25 s instead."""
    path = os.path.join(STATE, f"batch-{time.monotonic_ns()}.sh")
    output = path + ".out"
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + script)
    os.chmod(path, 0o755)
    out = subprocess.run(["sbatch", "--parsable", "-o", output, *args, path],
                         capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT)
    job = int(out.stdout.strip().split(";")[0])
    deadline = time.monotonic() + timeout
    while True:
        # a job gone from the controller has ended (MinJobAge after its end)
        shown = subprocess.run(["scontrol", "-o", "show", "job", str(job)],
                               capture_output=True, text=True, timeout=TIMEOUT)
        state = re.search(r"JobState=(\S+)", shown.stdout)
        if state is not None and state.group(1) in ENDED or "Invalid job id" in shown.stderr:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} did not end in {timeout} s: {shown.stdout}")
        time.sleep(0.25)
    with open(output) as f:
        return job, f.read()


def level(data: dict[str, Any], role: str) -> dict[str, Any]:
    """The level of `cgwatch --json` that is the Slurm job's or the step's: v1 has one each;
    on v2 the step is step_S and step_S/user, and the one with the limit is returned."""
    found = [lvl for lvl in data["levels"] if lvl["slurm_role"] == role]
    if len(found) > 1:
        found = [lvl for lvl in found if lvl["limit"] is not None] or found[:1]
    assert len(found) == 1, data["levels"]
    return found[0]
