"""Slurm with task/cgroup and ConstrainRAMSpace (confined below our cgroup, cgroup v1): the
limit is on the job's and the step's cgroups, never the task's, and cgwatch finds it."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.slurm.jobs import (
    GUEST,
    PYTHON,
    REPO,
    MiB,
    cgwatch_json,
    integration_python,
    level,
    sbatch,
    srun,
)

ALLOCATE = ("import time\nb = []\nwhile True:\n    b.append(bytearray(32 << 20))\n"
            "    time.sleep(0.01)\n")


def test_srun_mem_is_on_job_and_step_not_task() -> None:
    data = cgwatch_json("--mem=256M")
    assert data["total_memory"] == 256 * MiB
    assert 0 < data["available_memory"] < 256 * MiB
    job, step = level(data, "job"), level(data, "step")
    assert job["limit"] == step["limit"] == 256 * MiB
    assert data["levels"][0]["cgroup_path"].endswith("/task_0")
    assert data["levels"][0]["limit"] is None
    slurm = data["slurm"]
    assert job["slurm_id"] == str(slurm["job"]) and step["slurm_id"] == f"{slurm['job']}.0"
    assert slurm["option"] is None  # a plain srun --mem exports no SLURM_MEM_* (22.05)


def test_srun_mem_per_cpu_times_cpus() -> None:
    data = cgwatch_json("--mem-per-cpu=128M", "--cpus-per-task=2")
    assert data["total_memory"] == 256 * MiB
    assert level(data, "job")["limit"] == level(data, "step")["limit"] == 256 * MiB


def test_two_tasks_of_one_step_share_its_limit() -> None:
    # srun merges the tasks' stdout line by line, so two tasks' JSON can interleave (seen in
    # a clean-clone run: a line of task 1 between task 0's first two); --label prefixes each
    # line with its task ("0: "), and each task's lines are put back together by it.
    out = srun("--label", "--mem=256M", "--ntasks=2", PYTHON, "-m", "cgwatch",
               "--json").stdout
    lines: dict[str, list[str]] = {}
    for line in out.splitlines():
        task, sep, rest = line.partition(": ")
        assert sep and task.strip().isdigit(), line
        lines.setdefault(task.strip(), []).append(rest)
    assert sorted(lines) == ["0", "1"]
    found = [json.loads("\n".join(lines[task])) for task in sorted(lines)]
    assert len(found) == 2
    assert sorted(d["levels"][0]["cgroup_path"].rsplit("/", 1)[1] for d in found) \
        == ["task_0", "task_1"]
    assert {level(d, "step")["cgroup_path"] for d in found} \
        == {level(found[0], "step")["cgroup_path"]}
    assert [d["total_memory"] for d in found] == [256 * MiB, 256 * MiB]


def test_module_functions_inside_a_step() -> None:
    out = srun("--mem=200M", PYTHON, "-c", "import cgwatch; print(cgwatch.total_memory(), "
               "cgwatch.available_memory())").stdout.split()
    assert int(out[0]) == 200 * MiB
    assert 0 < int(out[1]) < 200 * MiB


def test_sbatch_mem_and_mem_per_cpu_are_declared_and_enforced() -> None:
    for args, option, limit in ((["--mem=200M"], "--mem=200M", 200 * MiB),
                                (["--mem-per-cpu=100M", "--cpus-per-task=2"],
                                 "--mem-per-cpu=100M (x 2 CPUs)", 200 * MiB)):
        job, text = sbatch(f"{PYTHON} -m cgwatch --json\n", *args)
        # the output file also has slurmstepd's messages (v2 in a cgroup namespace, 22.05:
        # "error unlocking cgroup ... Bad file descriptor" at the step's end)
        data, _ = json.JSONDecoder().raw_decode(text)
        assert data["total_memory"] == limit
        assert data["slurm"]["job"] == job and data["slurm"]["step"] == "batch"
        assert data["slurm"]["option"] == option
        assert data["slurm"]["enforced_by_cgroup"] is True
        assert level(data, "step")["slurm_id"] == f"{job}.batch"
        assert level(data, "job")["limit"] == limit
        assert [lvl for lvl in data["levels"] if lvl["kind"] == "slurm"] == []


def test_oom_under_cgwatch_run_names_job_step_and_advice() -> None:
    out = srun("--mem=256M", PYTHON, "-m", "cgwatch", "run", "--", PYTHON, "-c", ALLOCATE,
               check=False)
    assert out.returncode == 1  # srun's status after an OOM kill (22.05), not 137
    job = re.search(r"StepId=(\d+)\.0", out.stderr)
    assert job is not None, out.stderr
    j = job.group(1)
    text = re.sub(r"\s+", " ", out.stderr.replace("cgwatch:", ""))
    assert "killed by the kernel's OOM killer" in text
    assert f"[job {j}]" in text or f"[step {j}.0]" in text
    assert "limit 256.0 MiB" in text
    assert f"slurm job {j}, step {j}.0" in text
    assert f"sacct -j {j} -o JobID,MaxRSS,ReqMem,State" in text
    assert "Out Of Memory" in out.stderr  # Slurm's own report, unchanged


def test_serve_in_a_step_scraped_while_the_job_runs() -> None:
    port = 10109 + 37
    proc = subprocess.Popen(["srun", "--mem=256M", PYTHON, "-m", "cgwatch", "serve",
                             "--port", str(port)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        body = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        assert "cgwatch_total_memory_bytes 2.68435456e+08" in body, body[:2000]
        info = [line for line in body.splitlines() if line.startswith("cgwatch_monitor_info")]
        assert len(info) == 1 and re.search(r'slurm_job="\d+"', info[0]) \
            and re.search(r'slurm_step="\d+\.0"', info[0]), info
    finally:
        # our own cluster (SLURM_CONF): its jobs are ours alone
        subprocess.run(["scancel", "--user=root"], capture_output=True, timeout=30)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# DeepSpeed's own CPU accelerator answers the node's RAM (psutil.virtual_memory(): DeepSpeed
# #2632/#2788); cgwatch's (cgwatch.integrations.deepspeed.install()) the job's --mem.
DEEPSPEED = """
import json, psutil
from deepspeed.accelerator import get_accelerator
from cgwatch.integrations import deepspeed as cgds
before = get_accelerator()
node, before_total = psutil.virtual_memory().total, before.total_memory()
cgds.install()
accel = get_accelerator()
print("RESULT " + json.dumps({"before": [type(before).__name__, before_total],
      "after": [type(accel).__name__, accel.device_name(), accel.total_memory(),
                accel.available_memory()], "node": node}))
"""


def test_deepspeed_cpu_accelerator_in_srun_says_the_jobs_limit(tmp_path: Path) -> None:
    if GUEST:
        pytest.skip("not in the VM part: importing torch and DeepSpeed under TCG takes "
                    "minutes; the v1 host part runs this case")
    python = integration_python("torch + DeepSpeed")
    limit = 700 * MiB  # torch + DeepSpeed peak at ~250 MiB (tests/integration)
    out = srun("--mem=700M", python, "-c", DEEPSPEED,
               env={"TORCH_EXTENSIONS_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}).stdout
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-3000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["before"] == ["CPU_Accelerator", r["node"]] and r["node"] > limit
    cls, name, total, available = r["after"]
    assert (cls, name, total) == ("CgwatchCPUAccelerator", "cpu", limit)
    assert 0 < available < limit
