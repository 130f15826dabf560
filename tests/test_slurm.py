"""Tables for cgwatch.slurm: Slurm's cgroup layouts and the memory a job declared."""

from __future__ import annotations

from typing import NamedTuple, Optional

import pytest

from cgwatch.slurm import Declared, SlurmPlace, from_environ, parse_slurm_cgroup

MIB = 1 << 20


class Row(NamedTuple):
    path: str
    want: Optional[SlurmPlace]


# Paths as /proc/self/cgroup showed them inside real jobs (Debian slurm-wlm 22.05.8; node name
# "vm" or the host's "host1") unless said otherwise.
PLACES = [
    pytest.param(Row("/slurm/uid_1000/job_77/step_0/task_0",
                     SlurmPlace(77, "0", 0, "/slurm/uid_1000/job_77",
                                "/slurm/uid_1000/job_77/step_0", "/slurm/uid_1000/job_77/step_0")),
                 id="v1-single-slurmd"),
    pytest.param(Row("/slurm_vm/uid_0/job_4/step_batch/task_0",
                     SlurmPlace(4, "batch", 0, "/slurm_vm/uid_0/job_4",
                                "/slurm_vm/uid_0/job_4/step_batch",
                                "/slurm_vm/uid_0/job_4/step_batch")),
                 id="v1-multiple-slurmd-sbatch"),
    pytest.param(Row("/slurm_vm/uid_0/job_12/step_0",
                     SlurmPlace(12, "0", None, "/slurm_vm/uid_0/job_12",
                                "/slurm_vm/uid_0/job_12/step_0", "/slurm_vm/uid_0/job_12/step_0")),
                 id="v1-slurmstepd-in-step"),
    pytest.param(Row("/process_api/abc/slurm-spike/slurm_vm/uid_0/job_3/step_0/task_1",
                     SlurmPlace(3, "0", 1, "/process_api/abc/slurm-spike/slurm_vm/uid_0/job_3",
                                "/process_api/abc/slurm-spike/slurm_vm/uid_0/job_3/step_0",
                                "/process_api/abc/slurm-spike/slurm_vm/uid_0/job_3/step_0")),
                 id="v1-confined-below-our-cgroup"),
    pytest.param(Row("/system.slice/vm_slurmstepd.scope/job_4/step_0/user/task_0",
                     SlurmPlace(4, "0", 0, "/system.slice/vm_slurmstepd.scope/job_4",
                                "/system.slice/vm_slurmstepd.scope/job_4/step_0",
                                "/system.slice/vm_slurmstepd.scope/job_4/step_0/user")),
                 id="v2-multiple-slurmd"),
    # not seen here: a task dir that is not task_N (job and step are still certain)
    pytest.param(Row("/system.slice/slurmstepd.scope/job_9/step_extern/user/task_special",
                     SlurmPlace(9, "extern", None, "/system.slice/slurmstepd.scope/job_9",
                                "/system.slice/slurmstepd.scope/job_9/step_extern",
                                "/system.slice/slurmstepd.scope/job_9/step_extern/user")),
                 id="v2-task-not-a-number"),
    pytest.param(Row("/system.slice/slurmstepd.scope/job_9/step_extern/slurm",
                     SlurmPlace(9, "extern", None, "/system.slice/slurmstepd.scope/job_9",
                                "/system.slice/slurmstepd.scope/job_9/step_extern",
                                "/system.slice/slurmstepd.scope/job_9/step_extern/user")),
                 id="v2-slurmstepd-itself"),
    pytest.param(Row("/spike/system.slice/vm_slurmstepd.scope/job_2/step_1/user/task_0",
                     SlurmPlace(2, "1", 0, "/spike/system.slice/vm_slurmstepd.scope/job_2",
                                "/spike/system.slice/vm_slurmstepd.scope/job_2/step_1",
                                "/spike/system.slice/vm_slurmstepd.scope/job_2/step_1/user")),
                 id="v2-confined-seen-from-host"),
    pytest.param(Row("/jobs/job_1", None), id="not-slurm-just-a-name"),
    pytest.param(Row("/myslurm/uid_0/job_1/step_0", None), id="not-slurm-component-prefix"),
    pytest.param(Row("/system.slice/slurmd.service", None), id="slurmd-itself"),
    pytest.param(Row("/", None), id="root"),
    pytest.param(Row("/slurm_vm/uid_0/job_x/step_0", None), id="job-not-a-number"),
]


@pytest.mark.parametrize("row", PLACES)
def test_parse_slurm_cgroup(row: Row) -> None:
    got = parse_slurm_cgroup(row.path)
    assert got == row.want


def test_roles_and_step_id() -> None:
    v2 = parse_slurm_cgroup("/system.slice/vm_slurmstepd.scope/job_4/step_0/user/task_0")
    assert v2 is not None and v2.step_id == "4.0"
    assert v2.role("/system.slice/vm_slurmstepd.scope/job_4") == "job"
    assert v2.role("/system.slice/vm_slurmstepd.scope/job_4/step_0") == "step"
    assert v2.role("/system.slice/vm_slurmstepd.scope/job_4/step_0/user") == "step"
    assert v2.role("/system.slice/vm_slurmstepd.scope/job_4/step_0/user/task_0") is None
    assert v2.role("/system.slice/vm_slurmstepd.scope") is None
    v1 = parse_slurm_cgroup("/slurm_vm/uid_0/job_4/step_batch/task_0")
    assert v1 is not None and v1.step_id == "4.batch"
    assert v1.role("/slurm_vm/uid_0") is None
    job_only = parse_slurm_cgroup("/slurm_vm/uid_0/job_5")
    assert job_only is not None and job_only.step_id == "5" and job_only.step_path is None


class Env(NamedTuple):
    environ: dict[str, str]
    want: Optional[Declared]


# Environments as `env | grep ^SLURM` printed them in real jobs on 22.05 (only the variables
# that matter kept), unless said otherwise.
ENVIRONS = [
    pytest.param(Env({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_MEM_PER_NODE": "300",
                      "SLURM_CPUS_ON_NODE": "1"},
                     Declared(7, "0", 300 * MIB, "--mem=300M")), id="sbatch-mem-step"),
    pytest.param(Env({"SLURM_JOB_ID": "8", "SLURM_MEM_PER_CPU": "100", "SLURM_CPUS_ON_NODE": "2"},
                     Declared(8, None, 200 * MIB, "--mem-per-cpu=100M (x 2 CPUs)")),
                 id="sbatch-mem-per-cpu-batch-script"),
    pytest.param(Env({"SLURM_JOB_ID": "8", "SLURM_MEM_PER_CPU": "100", "SLURM_CPUS_ON_NODE": "1"},
                     Declared(8, None, 100 * MIB, "--mem-per-cpu=100M (x 1 CPU)")),
                 id="mem-per-cpu-one-cpu"),
    pytest.param(Env({"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_CPUS_ON_NODE": "1"},
                     Declared(9, "0", None, None)), id="plain-srun-mem-no-variable"),
    pytest.param(Env({"SLURM_JOBID": "10", "SLURM_MEM_PER_NODE": "0"},
                     Declared(10, None, None, None)), id="mem-0-whole-node-old-jobid-name"),
    pytest.param(Env({"SLURM_JOB_ID": "11", "SLURM_MEM_PER_NODE": "3G"},
                     Declared(11, None, None, None, "not a number of MiB: '3G'")),
                 id="refused-suffix"),
    pytest.param(Env({"SLURM_JOB_ID": "12", "SLURM_MEM_PER_NODE": "３００"},
                     Declared(12, None, None, None, "not a number of MiB: '３００'")),
                 id="refused-fullwidth-digits"),
    pytest.param(Env({"SLURM_JOB_ID": "13", "SLURM_MEM_PER_CPU": "100"},
                     Declared(13, None, None, None, "not a number of MiB: ''")),
                 id="refused-mem-per-cpu-without-cpus"),
    pytest.param(Env({"HOME": "/root"}, None), id="not-a-job"),
    pytest.param(Env({"SLURM_JOB_ID": "", "SLURM_MEM_PER_NODE": "300"}, None), id="empty-job-id"),
]


@pytest.mark.parametrize("row", ENVIRONS)
def test_from_environ(row: Env) -> None:
    assert from_environ(row.environ) == row.want
