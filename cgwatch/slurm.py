"""Internal. Where a Slurm job runs, from its cgroup path and its environment: pure, nothing
is read.

Slurm's `task/cgroup` plugin puts `--mem` on the job's and the step's cgroups, never on the
task's, so a process's own (leaf) cgroup has no limit and the one that kills it sits one or
two levels up. Slurm 22.05 (Debian's slurm-wlm 22.05.8, checked on kernel 6.18 here and in the
project's v2 VM) makes these paths (NODE: the node name, present when slurmd is built with
MULTIPLE_SLURMD, as Debian's is):

- cgroup v1 (memory hierarchy): `/slurm[_NODE]/uid_U/job_J/step_S/task_T`; the limit is on
  job_J and step_S (`memory.limit_in_bytes`), slurmstepd sits in step_S.
- cgroup v2: `/system.slice/[NODE_]slurmstepd.scope/job_J/step_S/user/task_T`; the limit is on
  job_J and step_S/user (`memory.max` and `memory.high`), slurmstepd sits in step_S/slurm.

S is a number or `batch`, `extern`, `interactive`. The path may carry a prefix (a site's own
slice, or a cgroup of ours when slurmd is confined below it), so the pattern is looked for
anywhere in it, anchored at a path component.

The environment gives what was asked for: `SLURM_MEM_PER_NODE` (`--mem`) or
`SLURM_MEM_PER_CPU` (`--mem-per-cpu`, times `SLURM_CPUS_ON_NODE`), in MiB. sbatch and salloc
export them to the job and its steps; a plain `srun --mem` sets neither (seen on 22.05), and
then only the controller knows: `scontrol show job -o J` says `MinMemoryNode=300M` or
`MinMemoryCPU=100M` (`from_scontrol` reads that line; slurmctl.py asks for it), and
`needs_controller` says when asking is worth it.
"""

from __future__ import annotations

import re

from .frozen import Frozen, fill

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Optional

MIB = 1 << 20

_V1 = re.compile(r"(?:^|/)slurm(?:_[^/]+)?/uid_\d+/job_(\d+)(?:/step_([^/]+))?(?:/task_(\d+))?"
                 r"(?=/|$)")
_V2 = re.compile(r"(?:^|/)(?:[^/]+_)?slurmstepd\.scope/job_(\d+)"
                 r"(?:/step_([^/]+)(?:/user(?:/task_(\d+))?|/slurm)?)?(?=/|$)")


class SlurmPlace(Frozen):
    """The job (and step, task) a cgroup path belongs to, and the paths of those levels.

    `job_path`/`step_path` are prefixes of the parsed path; `limit_step_path` is the step
    level that carries `--mem` (step_S on v1, step_S/user on v2)."""

    __slots__ = _fields = ("job", "step", "task", "job_path", "step_path", "limit_step_path")
    job: int
    step: Optional[str]
    task: Optional[int]
    job_path: str
    step_path: Optional[str]
    limit_step_path: Optional[str]

    def __init__(self, job: int, step: Optional[str] = None, task: Optional[int] = None,
                 job_path: str = "", step_path: Optional[str] = None,
                 limit_step_path: Optional[str] = None) -> None:
        fill(self, locals())

    @property
    def step_id(self) -> str:
        """`J.S` as Slurm prints it (`StepId=4.0`, `4.batch`), or `J` without a step."""
        return f"{self.job}.{self.step}" if self.step is not None else str(self.job)

    def role(self, cgroup_path: str) -> Optional[str]:
        """`job`, `step` or None: what the level at `cgroup_path` is for this job. On v2 both
        step_S and step_S/user are the step (the limit sits on the second)."""
        if cgroup_path == self.job_path:
            return "job"
        if cgroup_path in (self.step_path, self.limit_step_path):
            return "step"
        return None


def parse_slurm_cgroup(cgroup_path: str) -> Optional[SlurmPlace]:
    """The Slurm job a cgroup path is in, or None when the path is not Slurm's."""
    for pattern, v2 in ((_V1, False), (_V2, True)):
        m = pattern.search(cgroup_path)
        if m is None:
            continue
        start = m.start() + (1 if cgroup_path[m.start()] == "/" else 0)
        head = cgroup_path[:start]
        inner = m.group(0).lstrip("/")
        parts = inner.split("/")
        # v1: slurm/uid/job; v2: scope/job  (the job level's index in `parts`)
        j = 2 if not v2 else 1
        job_path = "/" + "/".join([head.strip("/"), *parts[:j + 1]]).strip("/")
        step = m.group(2)
        step_path = limit_path = None
        if step is not None:
            step_path = f"{job_path}/step_{step}"
            limit_path = f"{step_path}/user" if v2 else step_path
        task = m.group(3)
        return SlurmPlace(int(m.group(1)), step, None if task is None else int(task),
                          job_path, step_path, limit_path)
    return None


class Declared(Frozen):
    """What the job's environment says it asked for (sizes in bytes)."""

    __slots__ = _fields = ("job", "step", "limit", "option", "problem")
    job: Optional[int]
    step: Optional[str]
    limit: Optional[int]  # the node's share: --mem, or --mem-per-cpu x CPUs on the node
    option: Optional[str]  # how it was asked for: "--mem=300M", "--mem-per-cpu=100M (x 2 CPUs)"
    problem: Optional[str]  # why a variable present was not used

    def __init__(self, job: Optional[int], step: Optional[str], limit: Optional[int],
                 option: Optional[str], problem: Optional[str] = None) -> None:
        fill(self, locals())


def _mib(text: str) -> int:
    """A whole number of MiB as Slurm exports it ("300"); ValueError otherwise."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"not a number of MiB: {text[:20]!r}")
    return int(text)


def from_environ(environ: Mapping[str, str]) -> Optional[Declared]:
    """The job and the memory it declared, from its environment; None outside a Slurm job.

    `SLURM_MEM_PER_NODE=0` asks for the whole node (no limit of the job's own)."""
    job_text = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job_text or not (job_text.isascii() and job_text.isdigit()):
        return None
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID") or None
    limit = option = problem = None
    try:
        per_node = environ.get("SLURM_MEM_PER_NODE")
        per_cpu = environ.get("SLURM_MEM_PER_CPU")
        if per_node is not None:
            limit, option = _declared(_mib(per_node) * MIB, None, None)
        elif per_cpu is not None:
            limit, option = _declared(None, _mib(per_cpu) * MIB,
                                      _mib(environ.get("SLURM_CPUS_ON_NODE", "")))
    except ValueError as exc:
        problem = str(exc)
    return Declared(int(job_text), step, limit, option, problem)


def _declared(per_node: Optional[int], per_cpu: Optional[int],
              cpus: Optional[int]) -> tuple[Optional[int], Optional[str]]:
    """The limit in bytes and the option text it was asked with (`--mem=300M`, or
    `--mem-per-cpu=100M (x 2 CPUs)`), the same whether the environment or the controller
    said it; (None, None) for 0 (the whole node) or no CPU count."""
    if per_node is not None:
        return (per_node, f"--mem={per_node // MIB}M") if per_node else (None, None)
    if per_cpu and cpus:
        return per_cpu * cpus, (f"--mem-per-cpu={per_cpu // MIB}M "
                                f"(x {cpus} CPU{'s' if cpus > 1 else ''})")
    return None, None


def needs_controller(environ: Mapping[str, str],
                     levels: Sequence[tuple[str, Optional[int]]]) -> bool:
    """Whether the controller must be asked what the job declared: it is in a Slurm job, its
    environment has no `SLURM_MEM_PER_*` (a plain `srun`), and no cgroup of the job or step
    (`levels`: (cgroup path, limit), the process's own first) carries a limit. Where one does,
    task/cgroup's ConstrainRAMSpace put `--mem` there and the cgroups already say it."""
    if "SLURM_MEM_PER_NODE" in environ or "SLURM_MEM_PER_CPU" in environ:
        return False
    place = parse_slurm_cgroup(levels[0][0]) if levels else None
    return place is None or not any(limit is not None and place.role(path) is not None
                                    for path, limit in levels)


# scontrol prints sizes in MiB with a unit suffix; `convert_num_unit()` (CONVERT_NUM_UNIT_EXACT)
# moves to the next unit only while no precision is lost, with two decimals: 1536M is
# "1.50G", 1100M stays "1100M", 2048M is "2G" (seen on 22.05.8)
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]?)")
_UNIT_MIB = {"K": 1 / 1024, "M": 1, "": 1, "G": 1 << 10, "T": 1 << 20, "P": 1 << 30}


def _size_bytes(text: str) -> int:
    """A size as scontrol prints it ("300M", "1.50G", "0") in bytes; ValueError otherwise."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a size: {text[:20]!r}")
    return round(float(m.group(1)) * _UNIT_MIB[m.group(2)] * MIB)


def from_scontrol(text: str, job: int, step: Optional[str],
                  cpus_on_node: Optional[int]) -> Declared:
    """What job `job` declared, from `scontrol show job -o J`'s output (one line of
    Key=Value fields): `MinMemoryNode` (`--mem`; 0 is the whole node, as
    `SLURM_MEM_PER_NODE=0`) or `MinMemoryCPU` (`--mem-per-cpu`, times the CPUs on this node,
    `SLURM_CPUS_ON_NODE`). The same limit and option text as `from_environ` gives an sbatch
    job; `problem` says why not when the line does not tell."""
    fields = dict(item.split("=", 1) for item in text.split() if "=" in item)
    limit = option = problem = None
    try:
        if fields.get("JobId") != str(job):
            raise ValueError(f"not job {job}'s line: {text.strip()[:80]!r}")
        if "MinMemoryNode" in fields:
            limit, option = _declared(_size_bytes(fields["MinMemoryNode"]), None, None)
        elif "MinMemoryCPU" in fields:
            size = _size_bytes(fields["MinMemoryCPU"])
            if not cpus_on_node:
                raise ValueError("MinMemoryCPU without SLURM_CPUS_ON_NODE")
            limit, option = _declared(None, size, cpus_on_node)
        else:
            raise ValueError(f"no MinMemoryNode or MinMemoryCPU: {text.strip()[:80]!r}")
    except ValueError as exc:
        problem = str(exc)
    return Declared(job, step, limit, option, problem)


# The controller's answer shared by the processes of a job on a node (slurmctl.py): a header
# line, then scontrol's output (or why it could not be had).
_SHARED_TAG = "cgwatch-slurm-answer 1"


class SharedAnswer(Frozen):
    """One `scontrol show job` of job `job`, asked at `asked` (time.time()): its output when
    `ok`, else why it failed."""

    __slots__ = _fields = ("job", "asked", "ok", "text")
    job: int
    asked: float
    ok: bool
    text: str

    def __init__(self, job: int, asked: float, ok: bool, text: str) -> None:
        fill(self, locals())


def format_shared(answer: SharedAnswer) -> str:
    return (f"{_SHARED_TAG} job={answer.job} asked={answer.asked:.3f} "
            f"ok={int(answer.ok)}\n{answer.text}")


def parse_shared(text: str) -> Optional[SharedAnswer]:
    """The shared file's answer, or None for anything else (a new empty file, another
    version's): the reader asks the controller itself."""
    head, sep, body = text.partition("\n")
    fields = head.split(" ")
    if not sep or " ".join(fields[:2]) != _SHARED_TAG or len(fields) != 5:
        return None
    values = dict(f.split("=", 1) for f in fields[2:] if "=" in f)
    job, asked, ok = values.get("job", ""), values.get("asked", ""), values.get("ok", "")
    if not (job.isascii() and job.isdigit()) or ok not in ("0", "1") \
            or not asked.isascii():
        return None
    try:
        when = float(asked)
    except ValueError:
        return None
    if not when >= 0.0:  # NaN too
        return None
    return SharedAnswer(int(job), when, ok == "1", body)


def shared_usable(answer: Optional[SharedAnswer], job: int, now: float, since: float,
                  retry_after: float) -> bool:
    """Whether a shared answer stands for job `job` now: asked for it after `since` (when
    this process's step started: an answer left by an earlier job of the same id, after the
    controller's job ids wrapped or restarted, is older), not in the future (another clock),
    and either a real answer (final) or a failure less than `retry_after` seconds old (the
    same rules as one process's answer)."""
    if answer is None or answer.job != job or not since <= answer.asked <= now + 1.0:
        return False
    return answer.ok or now - answer.asked < retry_after
