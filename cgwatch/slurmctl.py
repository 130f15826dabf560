"""Internal. Asking Slurm's controller what a job declared, once per job step and node.

A plain `srun --mem=300M` exports no `SLURM_MEM_PER_*` (22.05): only slurmctld knows the
`--mem`. `ask` runs `scontrol show job -o J` (the CLI, so the site's auth and SLURM_CONF are
used as they are: no Slurm library is loaded here) and keeps the answer for the life of the
process, whatever it was: the job's memory does not change under it (`scontrol update` of a
running job's memory is refused for non-admins, and a change would not move any limit either).

An answer that could not be had (controller down, scontrol hung or missing) is asked again
when a snapshot is made `RETRY_AFTER` seconds later or more, so a job that started while
slurmctld restarted learns its limit once the controller is back; a real answer is final.

The processes of a step share one ask: a 300-task step asked 300 times at start, and Slurm's
documentation asks tools not to poll slurmctld so. The first process of the step on the node
runs scontrol under an flock on a file named for the job and uid (`open_shared`: in the job's
temp dir, $SLURM_TMPDIR or $TMPDIR, which a site's job_container/tmpfs or prolog makes the
job's own and removes with it; else /dev/shm, else /tmp; 0600, used only if it is a regular
file of our uid open to no one else) and writes the answer there; the others wait for the
lock (at most TIMEOUT + 1 s, then they ask themselves) and read it, with the same rules (a
real answer is final, a failure is asked again RETRY_AFTER later). An answer is trusted only
if it was asked after this process's slurmstepd started (`step_started_at`): a file an earlier
job of the same id left (job ids wrap, a test cluster starts again from 1) is older; so a
job's next step asks once again. A process with no slurmstepd above it (a container's pid
namespace) asks alone, as before. The asker removes its uid's answer files untouched for
PRUNE_AFTER, so they do not pile up in /dev/shm on a node that never reboots.

It runs when a snapshot is made (resolution, a limit re-read), never in a query: the first
snapshot of a process in such a job pays one scontrol (~10-40 ms here to a live controller),
or the read of the step's shared answer.
It is bounded: with the controller down, scontrol retries for ~18 s before it says
"Unable to contact slurm controller (connect failure)" (seen on 22.05.8), so the call is cut
after `TIMEOUT` seconds. scontrol missing, a timeout, a non-zero exit or output that does not
say: the answer is a `Declared` without a limit and with the reason in `problem`, which the
snapshot puts in `status.reason`; total_memory() is then what the cgroups say.
"""

from __future__ import annotations

import os
import threading
import time

from .frozen import replace
from .ownfile import open_own
from .slurm import (
    Declared,
    SharedAnswer,
    format_shared,
    from_scontrol,
    parse_shared,
    shared_usable,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Optional

TIMEOUT = 3.0  # seconds; a live controller answers in ~10-40 ms here, ~0.3 s in the TCG VM
RETRY_AFTER = 60.0  # seconds before a failed ask may be tried again (each try can cost TIMEOUT)
SCONTROL = "scontrol"
# Where the job's shared answer may live, in order; the name carries the job and the uid.
SHARED_DIRS = ("$SLURM_TMPDIR", "$TMPDIR", "/dev/shm", "/tmp")
PRUNE_AFTER = 86400.0  # seconds: an answer file untouched this long is removed by the next asker
_READ_LIMIT = 1 << 16  # scontrol -o prints one line per job (~600 bytes here)

_answers: dict[int, Declared] = {}
_failed_at: dict[int, float] = {}  # job -> when its kept answer was a failure (monotonic)
_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    # a fork while another thread was asking leaves the lock held forever in the child
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock_in_child)


def ask(declared: Declared, environ: Mapping[str, str],
        timeout: float = TIMEOUT, retry_after: float = RETRY_AFTER) -> Declared:
    """What the controller says job `declared.job` declared (asked on the first call of the
    process for that job, the kept answer after; a failure is asked again `retry_after`
    seconds later); `problem` says why when it could not say."""
    job = declared.job or 0
    with _lock:
        got = _answers.get(job)
        failed_at = _failed_at.get(job)
        if got is None or (failed_at is not None
                           and time.monotonic() - failed_at >= retry_after):
            got = _answers[job] = ask_shared(declared, environ, timeout, retry_after)
            if got.problem is None:
                _failed_at.pop(job, None)
            else:
                _failed_at[job] = time.monotonic()
    return got if got.step == declared.step else replace(got, step=declared.step)


def asked(job: int) -> Optional[Declared]:
    """The kept answer for `job`, None when the controller was not asked (never asks)."""
    return _answers.get(job)


def _run(declared: Declared, environ: Mapping[str, str], timeout: float) -> Declared:
    """One `scontrol show job -o J`, its answer parsed (slurm.from_scontrol)."""
    return _answer(declared, _call(declared, environ, timeout), environ)


def _call(declared: Declared, environ: Mapping[str, str], timeout: float) -> SharedAnswer:
    """One `scontrol show job -o J`: its output, or why there is none."""
    import subprocess  # not at import: `import cgwatch` stays light (tests/test_startup.py)

    job = declared.job or 0
    why = ""
    try:
        out = subprocess.run([SCONTROL, "show", "job", "-o", str(job)], capture_output=True,
                             text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                             env=dict(environ))
    except FileNotFoundError:
        why = "scontrol is not on PATH"
    except subprocess.TimeoutExpired:
        why = f"scontrol gave no answer in {timeout:g} s"
    except Exception as e:  # noqa: BLE001 - EMFILE, EAGAIN...: unknown, said, never raised
        why = f"scontrol could not run: {e}"
    else:
        if out.returncode != 0:
            why = f"scontrol exited {out.returncode}: {out.stderr.strip()[:120]}"
        else:
            got = _answer(declared, SharedAnswer(job, time.time(), True, out.stdout), environ)
            if got.problem is None:
                return SharedAnswer(job, time.time(), True, out.stdout)
            why = f"scontrol's answer not understood: {got.problem}"
    return SharedAnswer(job, time.time(), False, why)


def _answer(declared: Declared, answer: SharedAnswer, environ: Mapping[str, str]) -> Declared:
    """The Declared an answer gives (a failure's says why in `problem`)."""
    job = declared.job or 0
    if answer.ok:
        cpus = environ.get("SLURM_CPUS_ON_NODE", "")
        got = from_scontrol(answer.text, job, declared.step,
                            int(cpus) if cpus.isascii() and cpus.isdigit() else None)
        if got.problem is None:
            return got
        why = f"scontrol's answer not understood: {got.problem}"
    else:
        why = answer.text
    return Declared(job, declared.step, None, None,
                    f"the controller could not say what Slurm job {job} declared ({why}): "
                    "total_memory() is what the cgroups say")


def ask_shared(declared: Declared, environ: Mapping[str, str], timeout: float,
                retry_after: float, since: Optional[float] = None,
                dirs: Sequence[str] = SHARED_DIRS) -> Declared:
    """The step's shared answer if it stands (slurm.shared_usable), else one scontrol whose
    answer is shared; alone when there is no slurmstepd above us (`since`: when our step
    started, found here when None), no file that is ours, or the lock is not had in
    timeout + 1 s (never waits longer: a hung asker is cut at `timeout` anyway)."""
    job = declared.job or 0
    if since is None:
        since = step_started_at()
        if since is None:
            return _run(declared, environ, timeout)
    uid = os.geteuid()
    fd, directory = open_shared(job, uid, environ, dirs)
    if fd < 0:
        return _run(declared, environ, timeout)
    try:
        if not _flock_within(fd, timeout + 1.0):
            return _run(declared, environ, timeout)
        try:
            text = os.pread(fd, _READ_LIMIT, 0).decode("utf-8", "replace")
        except OSError:
            text = ""
        answer = parse_shared(text)
        if answer is None or not shared_usable(answer, job, time.time(), since, retry_after):
            answer = _call(declared, environ, timeout)
            data = format_shared(answer).encode()
            try:
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
            except OSError:
                pass  # the others ask themselves
            _prune(directory, uid, job)
        return _answer(declared, answer, environ)
    finally:
        os.close(fd)  # releases the lock


def _flock_within(fd: int, wait: float) -> bool:
    """flock(fd) within `wait` seconds (the asker holds it for one scontrol at most)."""
    import fcntl

    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        except OSError:
            return False


def shared_name(job: int, uid: int) -> str:
    return f"cgwatch-slurm-{job}-{uid}"


def open_shared(job: int, uid: int, environ: Mapping[str, str],
                dirs: Sequence[str] = SHARED_DIRS) -> tuple[int, str]:
    """The job's shared answer file, opened read-write (made 0600 if missing), and its
    directory; (-1, "") if no directory holds one that is ours alone (ownfile.open_own):
    another user could make the name first, to give us a wrong limit or to stop us."""
    return open_own(shared_name(job, uid), uid, environ, dirs)


def _prune(directory: str, uid: int, job: int) -> None:
    """Remove this uid's answer files of other jobs untouched for PRUNE_AFTER (a removed file
    of a job still running costs that job one more ask, at its next step)."""
    import stat

    prefix, suffix, ours = "cgwatch-slurm-", f"-{uid}", shared_name(job, uid)
    now = time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(suffix)) or name == ours:
            continue
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
            if st.st_uid == uid and stat.S_ISREG(st.st_mode) \
                    and now - st.st_mtime > PRUNE_AFTER:
                os.unlink(path)
        except OSError:
            continue


def step_started_at(proc: str = "/proc") -> Optional[float]:
    """When (time.time()) the slurmstepd above this process started, 1 s early (the boot
    time /proc/stat gives is whole seconds); None if no ancestor is a slurmstepd."""
    pid = os.getpid()
    try:
        with open(f"{proc}/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        ticks = os.sysconf("SC_CLK_TCK")
        for _ in range(64):
            if pid <= 1:
                return None
            with open(f"{proc}/{pid}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            fields = rest.split()
            # comm is the executable's name (15 bytes at most); `slurmstepd: [J.S]` is only
            # its command line. After the comm: state, ppid, ... starttime is field 22.
            if head.partition("(")[2] == "slurmstepd":
                return btime + int(fields[19]) / ticks - 1.0
            pid = int(fields[1])
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return None
