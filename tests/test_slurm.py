"""Tables for cgwatch.slurm: Slurm's cgroup layouts and the memory a job declared."""

from __future__ import annotations

from typing import NamedTuple, Optional

import pytest

from cgwatch.slurm import (
    Declared,
    SharedAnswer,
    SlurmPlace,
    format_shared,
    from_environ,
    from_scontrol,
    needs_controller,
    parse_shared,
    parse_slurm_cgroup,
    shared_usable,
)

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


# `scontrol show job -o J` inside real `srun` jobs of the tier's sampled setup (22.05.8,
# node "vm"), whole lines as printed, for srun --mem=300M, --mem-per-cpu=100M
# --cpus-per-task=2, --mem=2G, no --mem, --mem=1536M.
SCONTROL_300M = (
    "JobId=1 JobName=sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
    "Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED "
    "TimeMin=N/A SubmitTime=2026-12-01T23:59:06 EligibleTime=2026-12-01T23:59:06 "
    "AccrueTime=Unknown StartTime=2026-12-01T23:59:06 EndTime=Unknown Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T23:59:06 Scheduler=Main "
    "Partition=debug AllocNode:Sid=localhost:28613 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,mem=300M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryNode=300M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=sh "
    "WorkDir=/srv/project Power= \n")
SCONTROL_PER_CPU = (
    "JobId=2 JobName=sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 "
    "Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED "
    "TimeMin=N/A SubmitTime=2026-12-01T23:59:07 EligibleTime=2026-12-01T23:59:07 "
    "AccrueTime=2026-12-01T23:59:07 StartTime=2026-12-01T23:59:08 EndTime=Unknown Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T23:59:08 Scheduler=Main "
    "Partition=debug AllocNode:Sid=localhost:28613 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=2 NumTasks=1 CPUs/Task=2 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=2,mem=200M,node=1,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=2 MinMemoryCPU=100M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=sh "
    "WorkDir=/srv/project Power= \n")
SCONTROL_2G = (
    "JobId=3 JobName=sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 "
    "Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED "
    "TimeMin=N/A SubmitTime=2026-12-01T23:59:09 EligibleTime=2026-12-01T23:59:09 "
    "AccrueTime=Unknown StartTime=2026-12-01T23:59:09 EndTime=Unknown Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T23:59:09 Scheduler=Main "
    "Partition=debug AllocNode:Sid=localhost:28613 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,mem=2G,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryNode=2G MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=sh "
    "WorkDir=/srv/project Power= \n")
SCONTROL_NO_MEM = (
    "JobId=4 JobName=sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901756 "
    "Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED "
    "TimeMin=N/A SubmitTime=2026-12-01T23:59:10 EligibleTime=2026-12-01T23:59:10 "
    "AccrueTime=Unknown StartTime=2026-12-01T23:59:10 EndTime=Unknown Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T23:59:10 Scheduler=Main "
    "Partition=debug AllocNode:Sid=localhost:28613 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,mem=19284M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=sh "
    "WorkDir=/srv/project Power= \n")
SCONTROL_1536M = (
    "JobId=6 JobName=sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901754 "
    "Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED "
    "TimeMin=N/A SubmitTime=2026-12-01T23:59:12 EligibleTime=2026-12-01T23:59:12 "
    "AccrueTime=Unknown StartTime=2026-12-01T23:59:12 EndTime=Unknown Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T23:59:12 Scheduler=Main "
    "Partition=debug AllocNode:Sid=localhost:28613 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,mem=1.50G,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryNode=1.50G MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=sh "
    "WorkDir=/srv/project Power= \n")


class Ctl(NamedTuple):
    text: str
    job: int
    cpus: Optional[int]  # SLURM_CPUS_ON_NODE
    want: Declared


SCONTROL = [
    pytest.param(Ctl(SCONTROL_300M, 1, 1, Declared(1, "0", 300 * MIB, "--mem=300M")),
                 id="srun-mem-300M-as-sbatch-says-it"),
    pytest.param(Ctl(SCONTROL_PER_CPU, 2, 2,
                     Declared(2, "0", 200 * MIB, "--mem-per-cpu=100M (x 2 CPUs)")),
                 id="srun-mem-per-cpu-times-cpus-on-node"),
    pytest.param(Ctl(SCONTROL_2G, 3, 1, Declared(3, "0", 2048 * MIB, "--mem=2048M")),
                 id="mem-2G-printed-in-G"),
    pytest.param(Ctl(SCONTROL_1536M, 6, 1, Declared(6, "0", 1536 * MIB, "--mem=1536M")),
                 id="mem-1536M-printed-1.50G"),
    pytest.param(Ctl(SCONTROL_NO_MEM, 4, 1, Declared(4, "0", None, None)),
                 id="no-mem-is-0-the-whole-node-as-sbatch-exports-nothing"),
    pytest.param(Ctl(SCONTROL_PER_CPU, 2, None, Declared(
        2, "0", None, None, "MinMemoryCPU without SLURM_CPUS_ON_NODE")),
        id="mem-per-cpu-without-cpus-refused"),
    pytest.param(Ctl(SCONTROL_300M, 7, 1, Declared(
        7, "0", None, None, "not job 7's line: " + repr(SCONTROL_300M.strip()[:80]))),
        id="another-job's-line-refused"),
    pytest.param(Ctl(SCONTROL_300M.replace("MinMemoryNode=300M", "MinMemoryNode=lots"), 1, 1,
                     Declared(1, "0", None, None, "not a size: 'lots'")), id="not-a-size"),
    pytest.param(Ctl("JobId=1 JobName=sh\n", 1, 1, Declared(
        1, "0", None, None, "no MinMemoryNode or MinMemoryCPU: 'JobId=1 JobName=sh'")),
        id="no-memory-field"),
    pytest.param(Ctl("", 1, 1, Declared(1, "0", None, None, "not job 1's line: ''")),
                 id="empty-output"),
]


@pytest.mark.parametrize("row", SCONTROL)
def test_from_scontrol(row: Ctl) -> None:
    assert from_scontrol(row.text, row.job, "0", row.cpus) == row.want


def test_from_scontrol_says_what_from_environ_says_for_sbatch() -> None:
    """The same option text and limit as sbatch --mem=300M / --mem-per-cpu=100M x 2."""
    for text, job, cpus, env in ((SCONTROL_300M, 1, 1, {"SLURM_MEM_PER_NODE": "300"}),
                                 (SCONTROL_PER_CPU, 2, 2, {"SLURM_MEM_PER_CPU": "100"})):
        sbatch = from_environ({"SLURM_JOB_ID": str(job), "SLURM_CPUS_ON_NODE": str(cpus), **env})
        srun = from_scontrol(text, job, None, cpus)
        assert sbatch is not None and (srun.limit, srun.option) == (sbatch.limit, sbatch.option)


class Need(NamedTuple):
    environ: dict[str, str]
    levels: tuple[tuple[str, Optional[int]], ...]
    want: bool


V1_JOB = "/slurm_vm/uid_0/job_4"
V2_JOB = "/system.slice/vm_slurmstepd.scope/job_4"
NEEDS = [
    pytest.param(Need({"SLURM_JOB_ID": "4", "SLURM_MEM_PER_NODE": "300"}, (("/x", None),), False),
                 id="sbatch-environment-says"),
    pytest.param(Need({"SLURM_JOB_ID": "4", "SLURM_MEM_PER_CPU": "100"}, (), False),
                 id="mem-per-cpu-environment-says"),
    pytest.param(Need({"SLURM_JOB_ID": "4"}, ((V1_JOB + "/step_0/task_0", None),
                                              (V1_JOB + "/step_0", 256 << 20),
                                              (V1_JOB, 256 << 20), ("/slurm_vm", None)), False),
                 id="v1-task-cgroup-constrains-ram"),
    pytest.param(Need({"SLURM_JOB_ID": "4"}, ((V2_JOB + "/step_0/user/task_0", None),
                                              (V2_JOB + "/step_0/user", 256 << 20),
                                              (V2_JOB + "/step_0", None), (V2_JOB, 256 << 20)),
                      False), id="v2-task-cgroup-constrains-ram"),
    pytest.param(Need({"SLURM_JOB_ID": "4"}, ((V2_JOB + "/step_0/user/task_0", None),
                                              (V2_JOB + "/step_0/user", None),
                                              (V2_JOB + "/step_0", None), (V2_JOB, None),
                                              ("/", 1 << 30)), True),
                 id="v2-slurm-cgroups-without-limit-a-limit-of-ours-above"),
    pytest.param(Need({"SLURM_JOB_ID": "4"}, (("/process_api/3762", None),), True),
                 id="v1-sampled-not-in-slurm-memory-cgroup"),
    pytest.param(Need({"SLURM_JOB_ID": "4"}, (), True), id="host-mode-no-cgroup"),
]


@pytest.mark.parametrize("row", NEEDS)
def test_needs_controller(row: Need) -> None:
    assert needs_controller(row.environ, row.levels) is row.want


# ---- the controller's answer shared by a job's processes (slurmctl.ask_shared) -------------

ANSWER_LINE = ("JobId=7 JobName=sh UserId=root(0) NumNodes=1 NumCPUs=8 NumTasks=8 "
               "MinMemoryNode=300M Command=python\n")


class SharedRow(NamedTuple):
    id: str
    text: str
    expected: Optional[SharedAnswer]


SHARED = [
    SharedRow("answer", f"cgwatch-slurm-answer 1 job=7 asked=1764800000.250 ok=1\n{ANSWER_LINE}",
              SharedAnswer(7, 1764800000.25, True, ANSWER_LINE)),
    SharedRow("failure", "cgwatch-slurm-answer 1 job=7 asked=1764800000.000 ok=0\n"
              "scontrol exited 1: Unable to contact slurm controller",
              SharedAnswer(7, 1764800000.0, False,
                           "scontrol exited 1: Unable to contact slurm controller")),
    SharedRow("new-empty-file", "", None),
    SharedRow("header-cut-short", "cgwatch-slurm-answer 1 job=7 asked=17", None),
    SharedRow("another-version", "cgwatch-slurm-answer 2 job=7 asked=1.0 ok=1\n", None),
    SharedRow("ok-not-a-flag", "cgwatch-slurm-answer 1 job=7 asked=1.0 ok=yes\n", None),
    SharedRow("job-not-a-number", "cgwatch-slurm-answer 1 job=-7 asked=1.0 ok=1\n", None),
    SharedRow("nan-time", "cgwatch-slurm-answer 1 job=7 asked=nan ok=1\n", None),
    SharedRow("arabic-indic-job", "cgwatch-slurm-answer 1 job=\u0667 asked=1.0 ok=1\n", None),
]


@pytest.mark.parametrize("row", SHARED, ids=[r.id for r in SHARED])
def test_parse_shared(row: SharedRow) -> None:
    assert parse_shared(row.text) == row.expected


def test_format_shared_reads_back() -> None:
    answer = SharedAnswer(7, 1764800000.25, True, ANSWER_LINE)
    assert format_shared(answer) == (
        f"cgwatch-slurm-answer 1 job=7 asked=1764800000.250 ok=1\n{ANSWER_LINE}")
    assert parse_shared(format_shared(answer)) == answer


class UsableRow(NamedTuple):
    id: str
    answer: Optional[SharedAnswer]
    now: float
    since: float  # when our step's slurmstepd started
    expected: bool


USABLE = [
    UsableRow("none", None, 1000.0, 900.0, False),
    UsableRow("answer-is-final", SharedAnswer(7, 950.0, True, ""), 100000.0, 900.0, True),
    UsableRow("failure-fresh", SharedAnswer(7, 950.0, False, ""), 1009.9, 900.0, True),
    UsableRow("failure-60s-old", SharedAnswer(7, 950.0, False, ""), 1010.0, 900.0, False),
    UsableRow("another-job", SharedAnswer(8, 950.0, True, ""), 1000.0, 900.0, False),
    # the same job id asked before our step started: an earlier job's (ids wrapped)
    UsableRow("before-our-step", SharedAnswer(7, 899.0, True, ""), 1000.0, 900.0, False),
    UsableRow("from-the-future", SharedAnswer(7, 1001.5, True, ""), 1000.0, 900.0, False),
]


@pytest.mark.parametrize("row", USABLE, ids=[r.id for r in USABLE])
def test_shared_usable(row: UsableRow) -> None:
    assert shared_usable(row.answer, 7, row.now, row.since, 60.0) is row.expected
