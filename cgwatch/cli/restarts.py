"""Internal. `cgwatch run --guard --restarts N`: whether to start CMD again after an attempt,
when, and, when not, why; pure (run.py runs the attempts).

The rules, in order, after each attempt:
- An attempt whose status is not 75 (CMD finished, failed, died of the signal: nothing was
  saved) ends the run with that status: only a save can be resumed.
- No progress: when the last two stops both name a step (the number in the name of the
  checkpoint saved at the stop, `--checkpoint-dir`: `step-120.json`, HF Trainer's
  `checkpoint-120`, Lightning's `...step=120.ckpt`) and the second is not past the first,
  the whole attempt between them did no work: the job needs more memory at that point than
  its limit, and restarting from the same checkpoint meets the same stop. Run ends with 75
  and says so. A leak that restarts with the process is the case restarts are for, and it
  shows as a later step at each stop; time-to-stop and the working set at the stop are no
  test of progress, since such a leak gives the same ones every attempt.
- N restarts used: run ends with 75 (saved; a scheduler may requeue it).
- Otherwise restart k (1..N) after `delay x 2^(k-1)` seconds, at most MAX_DELAY: memory
  freed by the exit is back at once, but a stop caused by something outside the job (page
  cache, a neighbour in the cgroup) gets time to pass.
Without step numbers progress cannot be told: the restarts are bounded by N alone, and the
last line says so.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple, Optional

from ..guard import GUARD_EXIT_STATUS

RESTART_ENV = "CGWATCH_RESTART"  # k, in restart k's environment (absent in the first run)
MAX_DELAY = 60.0
_NUMBER = re.compile(r"\d+")


class Attempt(NamedTuple):
    """One run of CMD: `run`'s status for it, and the step saved at its stop (None: none
    named, or it did not stop)."""

    status: int
    step: Optional[int] = None


class Next(NamedTuple):
    """What follows an attempt: restart after `delay` seconds, or (None) end with the last
    attempt's status; `line`: what to say ("" for nothing)."""

    delay: Optional[float]
    line: str


def parse_step(path: Optional[str]) -> Optional[int]:
    """The step in a checkpoint's name: the last number in its base name, extension aside
    (`step-000120.json` -> 120, `checkpoint-500` -> 500, `epoch=2-step=300.ckpt` -> 300,
    `ckpt.pt` -> None)."""
    if not path:
        return None
    base = os.path.basename(path.rstrip("/"))
    stem = base.split(".", 1)[0] if not base.startswith(".") else base
    numbers = _NUMBER.findall(stem)
    return int(numbers[-1]) if numbers else None


def next_attempt(history: list[Attempt], restarts: int, delay: float,
                 name: str = "CMD") -> Next:
    """After the last attempt of `history` (oldest first), the rules of the module
    docstring with `restarts` allowed and a first `delay` (seconds)."""
    last = history[-1]
    done = len(history) - 1  # restarts made so far
    if last.status != GUARD_EXIT_STATUS:
        if done == 0:
            return Next(None, "")
        return Next(None, f"cgwatch run: {name} ended with exit {last.status} after "
                          f"{_restarts(done)}")
    if len(history) >= 2 and _no_progress(history[-2], last):
        return Next(None, f"cgwatch run: the same stop twice: the guard stopped {name} at "
                          f"step {last.step} again, with no progress since the last restart: "
                          f"this is not a leak that a restart outruns; the job needs more "
                          f"memory than its limit at that point; exit {GUARD_EXIT_STATUS} "
                          f"after {_restarts(done)}")
    if done >= restarts:
        told = "" if last.step is not None else (
            " (no step number in the checkpoint's name: progress could not be told)")
        stops = _count(len(history), "time")
        return Next(None, f"cgwatch run: {name} stopped by the guard {stops}, "
                          f"--restarts {restarts} used up{told}; exit {GUARD_EXIT_STATUS} "
                          f"(saved, may be resumed)")
    wait = min(delay * 2 ** done, MAX_DELAY)
    saved = f" from step {last.step}" if last.step is not None else ""
    return Next(wait, f"cgwatch run: restart {done + 1} of {restarts}{saved} in "
                      f"{wait:g} s ({RESTART_ENV}={done + 1})")


def _no_progress(before: Attempt, after: Attempt) -> bool:
    return before.step is not None and after.step is not None and after.step <= before.step


def _restarts(count: int) -> str:
    return _count(count, "restart")


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
