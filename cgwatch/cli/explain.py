"""Internal. What `cgwatch run` prints when an OOM kill happened while its command ran: which
limit the kernel says was reached (a visible level's, one above the visible hierarchy, or none:
the host ran out), the limit, the peak usage, and what would help.

`find_culprit` (which level ran out of memory) and `explain` (the text) are pure and
table-tested in tests/test_cli_run_explain.py; cause.py gathers their inputs.
"""

from __future__ import annotations

import signal
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from ..event import Event
from ..shm import ShmUsage
from ..snapshot import LevelInfo
from ..units import human_bytes

KILL_COUNTERS = ("oom_kill", "oom_group_kill")
# /dev/shm at least this full at its fullest while CMD ran counts as "was full": a worker
# mapping a 10 MiB batch into a 64 MiB tmpfs with 6 MiB left dies at 90%, not at 100%.
SHM_FULL_PERCENT = 90.0


@dataclass(frozen=True)
class Culprit:
    """The level whose limit was reached."""

    cgroup_path: str
    directory: str
    limit: Optional[int]  # None: a limit above the visible hierarchy whose value is unknown
    certain: bool  # the kernel's counters say so (False: only the likeliest reading)
    # "hit": a level on the visible path reached its limit; "above": no visible level did,
    # so a limit above the visible hierarchy was (v1 hierarchical_memory_limit gives its
    # value; v2 and namespaces show nothing of it)
    kind: str = "hit"


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm job (and step) CMD ran in, and the memory it asked for."""

    job: int
    step: Optional[str]  # "0", "batch"; None: not in a step's cgroup
    option: Optional[str]  # "--mem=256M", "--mem-per-cpu=100M (x 2 CPUs)"; None: not known
    declared: Optional[int]  # the declared limit (bytes), None: not known
    enforced: bool  # a cgroup limit on the path is at or below it (task/cgroup)
    job_cgroup: Optional[str] = None  # the job's and the step's levels (slurm.SlurmPlace)
    step_cgroup: Optional[str] = None

    @property
    def step_id(self) -> str:
        return f"{self.job}.{self.step}" if self.step is not None else str(self.job)

    def as_dict(self) -> dict[str, object]:
        """The JSON form (`cgwatch --json` and `cgwatch run --json`); `enforced_by_cgroup`
        is None when nothing was declared."""
        return {"job": self.job, "step": self.step, "declared_limit": self.declared,
                "option": self.option,
                "enforced_by_cgroup": self.enforced if self.declared is not None else None,
                "job_cgroup": self.job_cgroup, "step_cgroup": self.step_cgroup}

    def role(self, cgroup_path: str) -> str:
        """" [job J]" / " [step J.S]" for the job's and step's cgroups, else ""."""
        if cgroup_path == self.job_cgroup:
            return f" [job {self.job}]"
        if self.step_cgroup is not None and cgroup_path in (
                self.step_cgroup, self.step_cgroup.removesuffix("/user")):
            return f" [step {self.step_id}]"
        return ""


def slurm_job(cgroup_path: Optional[str], environ: Mapping[str, str],
              levels: Sequence[LevelInfo]) -> Optional[SlurmJob]:
    """The Slurm job this process runs in (None outside one), from its cgroup path and
    environment (slurm.py) or, for a plain `srun --mem`, what the controller said when the
    monitor asked it (slurmctl.py; never asked here), and whether a cgroup limit on the path
    enforces what it declared."""
    from ..slurm import from_environ, parse_slurm_cgroup
    from ..slurmctl import asked

    place = parse_slurm_cgroup(cgroup_path) if cgroup_path else None
    declared = from_environ(environ)
    if declared is not None and declared.job is not None:
        said = asked(declared.job)
        if said is not None and said.limit is not None:
            declared = said
    if place is None and declared is None:
        return None
    limit = declared.limit if declared is not None else None
    enforced = limit is None or any(
        lvl.kind == "cgroup" and lvl.limit is not None and lvl.limit <= limit for lvl in levels)
    job = place.job if place is not None else declared.job if declared is not None else 0
    step = place.step if place is not None else declared.step if declared is not None else None
    return SlurmJob(job or 0, step, declared.option if declared is not None else None, limit,
                    enforced, place.job_path if place is not None else None,
                    place.limit_step_path if place is not None else None)


@dataclass(frozen=True)
class Report:
    command: str  # argv[0] as given
    status: int  # the exit status `cgwatch run` returns (128+N for signal N)
    signal: Optional[int]  # the signal that ended the command, if one did
    kills: tuple[Event, ...]  # oom_kill rises on the path while it ran (v2: deepest level)
    culprit: Optional[Culprit]  # None: no limit on the path was reached: a host-wide OOM
    peak: Optional[int]  # the culprit's peak usage as the kernel reports it
    peak_file: str  # where the peak came from ("" when unknown)
    top: str = ""  # the top visible level's path (where the peak of an "above" culprit is)
    slurm: Optional[SlurmJob] = None  # the Slurm job CMD ran in

    @property
    def cause(self) -> str:
        """`limit` (a visible level's), `above` (a limit above what can be seen) or `host`."""
        if self.culprit is None:
            return "host"
        return "above" if self.culprit.kind == "above" else "limit"


# A limit above the visible hierarchy: (path shown for it, directory of the top visible
# level, its value where the kernel shows it: v1 `hierarchical_memory_limit`; None on v2).
Above = tuple[str, str, Optional[int]]


def find_culprit(events: Sequence[Event], above: Optional[Above] = None,
                 top_level: Optional[int] = None) -> Optional[Culprit]:
    """The level whose limit the kernel says was reached, from the events seen during the run.

    `above`: the level above the visible hierarchy when there may be a limit there;
    `top_level`: the index (Event.level) of the top visible level. In order of evidence:
    1. v2: the deepest level whose own `oom` rose (memory.events.local, or a rise that is not
       a propagated repeat): the OOM happened at that level (mm/memcontrol.c raises MEMCG_OOM
       at the memcg over its limit; only memory.events propagates it upwards).
    2. v1: OOM notifications (cgroup.event_control) reach the memcg that ran out *and every
       cgroup below it* (mem_cgroup_oom_notify walks the subtree; seen on 6.18 with a
       hidden parent), so the highest notified level is where it ran out; except when that
       is the top visible level, its failcnt did not rise and a limit lies above: then the
       OOM was above.
    3. a rise of `max` (v2) / `failcnt` (v1: counted at the level whose charge failed): the
       deepest such limited level; certain only when it is the one level that rose.
    4. nothing on the visible path reached a limit (the counters would show it; the smallest
       limit there is not the culprit when none was reached): a limit above the visible
       hierarchy, when there may be one (uncertain: the host may have run out instead), or
       else None: the host ran out (a global OOM raises no memcg `oom`, `max` or failcnt).
    """
    def own_oom(e: Event) -> bool:
        if e.counter != "oom" or e.limit is None or e.version != 2:
            return False
        if e.local_new is not None and e.local_old is not None:
            return e.local_new > e.local_old
        return not e.propagated

    def above_culprit(certain: bool) -> Optional[Culprit]:
        if above is None:
            return None
        return Culprit(above[0], above[1], above[2], certain, "above")

    hits = [e for e in events if own_oom(e)]
    if hits:
        first = min(hits, key=lambda e: e.level)
        return Culprit(first.cgroup_path, first.directory, first.limit, True)
    failed = [e for e in events if e.counter in ("max", "failcnt") and e.limit is not None
              and not e.propagated]
    notified = [e for e in events if e.counter == "oom" and e.version == 1]
    if notified:
        highest = max(notified, key=lambda e: e.level)
        top_failed = any(e.level == highest.level for e in failed)
        if highest.level == top_level and above is not None and not top_failed:
            return above_culprit(True)
        if highest.limit is not None:
            return Culprit(highest.cgroup_path, highest.directory, highest.limit, True)
    if failed:
        first = min(failed, key=lambda e: e.level)
        return Culprit(first.cgroup_path, first.directory, first.limit,
                       len({e.level for e in failed}) == 1)
    return above_culprit(False)


def signal_name(number: int) -> str:
    """`SIGKILL`, or `signal 70` for a number Python has no name for."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def explain(report: Report) -> str:
    """The lines for stderr, each prefixed `cgwatch: `."""
    cmd = report.command
    kills = sum(e.new - e.old for e in report.kills)
    where = ", ".join(sorted({e.cgroup_path for e in report.kills}))
    if report.signal == signal.SIGKILL:
        head = (f"{cmd} was killed by the kernel's OOM killer (SIGKILL, exit status "
                f"{report.status}).")
    elif report.signal is not None:
        head = (f"{cmd} died of {signal_name(report.signal)} (exit status {report.status}) "
                f"after the kernel's OOM killer killed a process in {where}.")
    else:
        head = (f"while {cmd} ran, the kernel's OOM killer killed a process in "
                f"{where} ({cmd} exited with status {report.status}).")
    lines = _wrap(head)
    kills_line = f"  OOM kills   {kills} in {where} while {cmd} ran"
    c = report.culprit
    if c is None:
        lines += _wrap("no memory limit on this process's cgroup path was reached (the "
                       "kernel's counters show none hit): the host itself ran out of memory "
                       "(a global OOM).")
        lines += [kills_line]
        lines += _wrap(f"what to do: free memory on the host (other processes), add swap or "
                       f"give the machine more, or make {cmd} use less (smaller batches, "
                       f"fewer worker processes). A memory limit on this job below the "
                       f"host's RAM (docker run --memory, systemd MemoryMax=) keeps such a "
                       f"shortage inside the job, where it is reported.")
        return _prefixed(lines)
    if c.kind == "above":
        lines += _above_lines(report, c, kills_line)
        return _prefixed(lines)
    peak = (f"{human_bytes(report.peak)} ({report.peak_file})" if report.peak is not None
            else "not reported by this kernel")
    role = report.slurm.role(c.cgroup_path) if report.slurm is not None else ""
    lines += [
        f"  cgroup      {c.cgroup_path}{role}" + ("" if c.certain else
                                                   " (the deepest of several that hit a limit)"),
        f"  limit       {human_bytes(c.limit)}"
        + (f" ({c.limit} bytes)" if c.limit is not None else ""),
        f"  peak usage  {peak}",
        kills_line,
    ]
    if report.slurm is not None:
        lines += _wrap(_slurm_line(report.slurm))
        lines += _wrap(_slurm_advice(report.slurm, cmd))
        return _prefixed(lines)
    lines += _wrap(f"what to do: raise that cgroup's memory limit (docker run --memory, "
                   f"Kubernetes resources.limits.memory, systemd MemoryMax=) or make {cmd} "
                   "use less memory (smaller batches, fewer worker processes); a program can "
                   "call cgwatch.available_memory() to learn how much it may still allocate.")
    return _prefixed(lines)


def _slurm_line(slurm: SlurmJob) -> str:
    asked = slurm.option or ("no SLURM_MEM_* in its environment (a plain srun --mem "
                             "exports none): the job's cgroup limit is what it asked for")
    step = f"step {slurm.step_id}" if slurm.step is not None else "no step of its own"
    return f"  slurm       job {slurm.job}, {step}, {asked}"


def _slurm_advice(slurm: SlurmJob, cmd: str) -> str:
    """What helps inside a Slurm job: ask for more, and see what each step used."""
    return (f"what to do: ask Slurm for more memory (sbatch/srun --mem=..., or --mem-per-cpu) "
            f"or make {cmd} use less (smaller batches, fewer worker processes); "
            f"`sacct -j {slurm.job} -o JobID,MaxRSS,ReqMem,State` shows what each step used "
            f"and asked for (with accounting enabled); a program can call "
            f"cgwatch.available_memory() to learn how much it may still allocate.")


def explain_sampled(cmd: str, status: int, sig: Optional[int], oom_kills: int,
                    slurm: Optional[SlurmJob]) -> Optional[str]:
    """The lines for CMD killed by slurmstepd's memory sampling, or None when the evidence
    does not say so. Slurm's jobacct_gather with `JobAcctGatherParams=OverMemoryKill` polls
    the step's processes and SIGKILLs the step when their summed RSS passes the declared
    limit ("exceeded memory limit (948035584 > 314572800), being killed", seen on 22.05):
    the evidence is CMD dying of SIGKILL, no OOM kill counted on its path, in a job whose
    declared limit no cgroup enforces. Still only the likeliest reading (`scancel -s KILL`
    looks the same), and said so. CMD may be `srun` itself, which exits 137 when its task
    was SIGKILLed: the sampling kills every process of the step, so a `cgwatch run` inside
    the killed step dies with it and only one wrapping the `srun` can tell."""
    # srun passes its SIGKILLed task's 137 on as its own exit status (seen on 22.05)
    killed = sig == signal.SIGKILL or (sig is None and status == 128 + signal.SIGKILL)
    if not killed or oom_kills or slurm is None or slurm.enforced or slurm.declared is None:
        return None
    lines = _wrap(
        f"{cmd} ended by SIGKILL (exit status {status}) with no OOM kill counted on its "
        f"cgroup path, in Slurm job {slurm.job} whose {slurm.option} no cgroup enforces: most "
        f"likely slurmstepd's memory sampling killed the step for passing "
        f"{human_bytes(slurm.declared)} (JobAcctGatherParams=OverMemoryKill; the job's "
        f"stderr says \"exceeded memory limit\"). It counts the RSS of every process of the "
        f"step, shared pages once per process.")
    lines += _wrap(_slurm_line(slurm))
    lines += _wrap(_slurm_advice(slurm, cmd))
    return _prefixed(lines)


def explain_rlimit(cmd: str, status: int, sig: Optional[int],
                   rlimits: Sequence[tuple[str, int]]) -> Optional[str]:
    """The lines for CMD that failed while it ran under RLIMIT_AS/RLIMIT_DATA, or None.

    A process at its RLIMIT_AS gets ENOMEM from mmap/brk (mm/mmap.c `may_expand_vm()`):
    Python raises MemoryError and, uncaught, exits with status 1; C++ throws std::bad_alloc,
    which uncaught aborts (SIGABRT, 134). cgwatch does not read CMD's stderr (it adds nothing
    to CMD's output), so exit status 1 or SIGABRT under such a limit is named as a likely
    cause, not a certain one."""
    if not rlimits or not (status == 1 or sig == signal.SIGABRT):
        return None
    shell = {"RLIMIT_AS": "ulimit -v", "RLIMIT_DATA": "ulimit -d"}
    limits = ", ".join(f"{name}={human_bytes(value)} ({shell.get(name, name)})"
                       for name, value in rlimits)
    how = "died of SIGABRT" if sig == signal.SIGABRT else "exited with status 1"
    lines = _wrap(
        f"{cmd} {how} while it ran under {limits}: if its last error was "
        f"MemoryError or std::bad_alloc (\"Cannot allocate memory\"), that limit on its address "
        f"space was reached, not a memory limit: it counts every mapping (VmSize), used or "
        f"not. What to do: raise it (ulimit -v unlimited; Slurm passes the submitting shell's "
        f"to the job: srun --propagate=NONE; Grid Engine h_vmem, PBS vmem) or map less.")
    return _prefixed(lines)


def _above_lines(report: Report, c: Culprit, kills_line: str) -> list[str]:
    """The body for an OOM that no visible level's limit explains."""
    top = report.top or "the top visible level"
    if c.limit is not None:
        limit = (f"  limit       {human_bytes(c.limit)} ({c.limit} bytes, v1 "
                 "hierarchical_memory_limit)")
    else:
        limit = "  limit       cannot be seen from here (cgroup namespace or subtree mount)"
    # The level above also counts its other children: the top's peak is a floor of its own.
    peak = (f"  peak usage  {human_bytes(report.peak)} at {top} ({report.peak_file})"
            if report.peak is not None else "  peak usage  not reported by this kernel")
    if c.certain:
        why = (f"no limit on the visible path was reached, but the kernel's OOM notification "
               f"reached {top} without its own limit being hit: the limit that ran out is "
               f"above it, in a cgroup this process cannot see.")
    else:
        why = (f"no limit on the visible path was reached (the kernel's counters show none "
               f"hit): the kill came from a limit above {top}, which this process cannot "
               f"see, or from the host running out of memory.")
    lines = _wrap(why)
    lines += [f"  cgroup      {c.cgroup_path}", limit, peak, kills_line]
    lines += _wrap(
        f"what to do: raising this container's own limit would not help. Raise the limit "
        f"above it (Kubernetes: the pod's memory limit; Slurm: the job's --mem; systemd: "
        f"the slice's MemoryMax=), move other work out from under it, or make "
        f"{report.command} use less memory; the host's kernel log (dmesg) names the cgroup "
        f"that ran out (oom_memcg=), or says 'Out of memory' for the host.")
    return lines


def explain_shm(cmd: str, status: int, sig: Optional[int], peak: Optional[ShmUsage],
                available: int) -> Optional[str]:
    """The lines for a CMD that died of SIGBUS (or failed) while /dev/shm was nearly full at
    some point (`peak`: its fullest sample); None when that does not apply. A full tmpfs
    does not fail a write with ENOSPC when the page is touched through mmap: the kernel
    sends SIGBUS (Linux shmem fault path, seen on 5.15 and 6.x), "Bus error" in a shell,
    "DataLoader worker (pid N) is killed by signal: Bus error" in PyTorch."""
    if peak is None or peak.percent_used < SHM_FULL_PERCENT or status == 0:
        return None
    fullest = (f"{peak.percent_used:.0f}% full at its fullest: {human_bytes(peak.used)} of "
               f"{human_bytes(peak.size)}")
    if sig == signal.SIGBUS or status == 128 + signal.SIGBUS:
        head = (f"{cmd} died of SIGBUS (exit status {status}) while /dev/shm was {fullest}. "
                "A process that touches a new page of a shared-memory file when that tmpfs "
                "is full gets SIGBUS (\"Bus error\"), however much memory is left")
    else:
        head = (f"{cmd} failed (exit status {status}) while /dev/shm was {fullest}. Any "
                "of its processes that then touched a new page of shared memory got SIGBUS "
                "(\"Bus error\"; PyTorch: \"DataLoader worker ... is killed by signal: Bus "
                "error\")")
    if peak.size < available:
        head += f" ({human_bytes(available)} of memory is available)."
    else:
        head += "."
    lines = _wrap(head)
    lines += _wrap("what to do: give it a bigger /dev/shm (docker run --shm-size=1g; "
                   "Kubernetes: an emptyDir with medium: Memory and a sizeLimit, mounted at "
                   "/dev/shm) or make it use less shared memory (PyTorch DataLoader: fewer "
                   "num_workers, smaller batches, a smaller prefetch_factor).")
    return _prefixed(lines)


def _prefixed(lines: list[str]) -> str:
    return "\n".join("cgwatch: " + line for line in lines)


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, width=88, subsequent_indent="  ", break_on_hyphens=False)
