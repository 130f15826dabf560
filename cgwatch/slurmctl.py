"""Internal. Asking Slurm's controller what a job declared, once per process.

A plain `srun --mem=300M` exports no `SLURM_MEM_PER_*` (22.05): only slurmctld knows the
`--mem`. `ask` runs `scontrol show job -o J` (the CLI, so the site's auth and SLURM_CONF are
used as they are: no Slurm library is loaded here) and keeps the answer for the life of the
process, whatever it was: the job's memory does not change under it (`scontrol update` of a
running job's memory is refused for non-admins, and a change would not move any limit either).

An answer that could not be had (controller down, scontrol hung or missing) is asked again
when a snapshot is made `RETRY_AFTER` seconds later or more, so a job that started while
slurmctld restarted learns its limit once the controller is back; a real answer is final.

It runs when a snapshot is made (resolution, a limit re-read), never in a query: the first
snapshot of a process in such a job pays one scontrol (~10-40 ms here to a live controller).
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
from .slurm import Declared, from_scontrol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Optional

TIMEOUT = 3.0  # seconds; a live controller answers in ~10-40 ms here, ~0.3 s in the TCG VM
RETRY_AFTER = 60.0  # seconds before a failed ask may be tried again (each try can cost TIMEOUT)
SCONTROL = "scontrol"

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
            got = _answers[job] = _run(declared, environ, timeout)
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
            cpus = environ.get("SLURM_CPUS_ON_NODE", "")
            got = from_scontrol(out.stdout, job, declared.step,
                                int(cpus) if cpus.isascii() and cpus.isdigit() else None)
            if got.problem is None:
                return got
            why = f"scontrol's answer not understood: {got.problem}"
    return Declared(job, declared.step, None, None,
                    f"the controller could not say what Slurm job {job} declared ({why}): "
                    "total_memory() is what the cgroups say")
