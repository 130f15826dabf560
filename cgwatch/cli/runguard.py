"""Internal. `cgwatch run --guard`: a `cgwatch.Guard` on CMD's cgroup checked on a thread while
CMD runs; the first time it says stop, CMD gets the signal, once, with a line that says so;
after CMD ended, a line saying what came of it, and `run`'s exit status (run.py's module
docstring gives the rules).

The status is honest about the save: 75 (saved, may be resumed) only when CMD had the chance
to save and said it did, by exiting 0 or 75 after the signal. A CMD that died of the signal
had no handler for it and saved nothing: 128+N, as a shell reports it, and the line says
"nothing was saved". Where the save went is said when run knows where to look
(--checkpoint-dir, or CGWATCH_CHECKPOINT_DIR in its environment): the newest entry of that
directory changed since the signal.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from ..guard import GUARD_EXIT_STATUS, Guard, Verdict
from .child import exit_status
from .ckptwatch import STATE_NAME, SaveWatch
from .explain import signal_name
from .observed import ObservedRun, observe_options
from .savedelay import killed_line, seconds_text, timed_save

if TYPE_CHECKING:
    from ..events import Events
    from ..monitor import Monitor
    from .plot import Recorder

CHECKPOINT_DIR_ENV = "CGWATCH_CHECKPOINT_DIR"
# A file's mtime comes from the kernel's coarse clock (current_time(): up to a jiffy behind
# time.time()), so a save that began right at the signal may carry a slightly earlier stamp.
MTIME_SLACK = 0.05


def guarded_status(returncode: int, fired: Optional[Verdict], signum: Optional[int]) -> int:
    """`run`'s exit status: CMD's as a shell reports it (exit_status), except that CMD
    exiting with 0 or 75 after the guard's signal is the guard's status, 75: it saved. Death
    by the signal stays 128+N: nothing was saved."""
    if fired is not None and signum is not None and returncode in (0, GUARD_EXIT_STATUS):
        return GUARD_EXIT_STATUS
    return exit_status(returncode)


def is_torchrun(command: list[str]) -> bool:
    """Whether CMD is torchrun (`torchrun ...` or `python -m torch.distributed.run ...`),
    whose workers, not itself, get the guard's signal: signalled itself, torchrun forwards
    the signal to its workers and then exits 1 whatever they did (its agent re-raises it as
    SignalException; torch 2.13), so a save would never read as one. Its workers signalled
    directly, torchrun sees them exit and exits 0 when every one exited 0, else 1."""
    if not command:
        return False
    if os.path.basename(command[0]) == "torchrun":
        return True
    return (os.path.basename(command[0]).startswith("python")
            and command[1:3] == ["-m", "torch.distributed.run"])


def parse_children(texts: list[str]) -> list[int]:
    """The pids in /proc/PID/task/TID/children files (space-separated), each once, sorted."""
    return sorted({int(word) for text in texts for word in text.split() if word.isdigit()})


def read_children(pid: int) -> list[int]:
    """A process's children, from /proc/PID/task/*/children (Linux 3.5+ with
    CONFIG_PROC_CHILDREN, as Debian builds it; a thread's children are listed under that
    thread, so every thread's file is read); [] when they cannot be read."""
    texts = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                texts.append(f.read())
        except OSError:
            continue  # the thread ended, or no CONFIG_PROC_CHILDREN
    return parse_children(texts)


def fire_line(verdict: Verdict, signum: int, name: str, pids: list[int],
              workers: bool = False) -> str:
    """The line printed as the signal is sent: stopping to save, to whom, and why
    (`workers`: `pids` are CMD's workers, torchrun's, not CMD)."""
    message = verdict.message()
    _, found, why = message.partition(": save and stop: ")
    if not found:
        why = message.removeprefix("cgwatch guard: ")
    listed = ", ".join(str(pid) for pid in pids)
    if workers:
        whom = f"{name}'s {len(pids)} worker(s) (pid {listed})"
    else:
        whom = f"{name} (pid {listed})"
    return (f"cgwatch guard: stopping to save: sending {signal_name(signum)} to {whom}; "
            f"why: {why}")


def outcome_line(name: str, returncode: int, signum: int, seconds: float,
                 directory: Optional[str], saved_to: Optional[str],
                 workers: int = 0, save_delay: float = 0.0) -> str:
    """The line printed after CMD ended, once the guard had signalled it: whether it saved,
    where (`saved_to`: the newest entry of `directory` changed since the signal), how long
    after the signal it ended, and `run`'s exit status (guarded_status's rule). `workers`:
    how many of torchrun's workers got the signal instead of CMD (0: CMD got it). CMD killed:
    savedelay.killed_line (`saved_to` is then what changed since the signal, if anything;
    `save_delay`: --save-delay)."""
    sent = signal_name(signum)
    after = f"{seconds_text(seconds)} after {sent}"
    if workers and returncode not in (0, GUARD_EXIT_STATUS) and returncode > 0:
        return (f"cgwatch guard: {name} exited {returncode} {after} to its {workers} "
                f"worker(s): at least one did not save and exit 0 (its summary above names "
                f"it); exit {returncode}")
    if workers and returncode in (0, GUARD_EXIT_STATUS):
        name = f"{name}'s {workers} worker(s)"
    if returncode in (0, GUARD_EXIT_STATUS):
        if saved_to is not None:
            where = f"; checkpoint: {saved_to}"
        elif directory is not None:
            where = f"; nothing in {directory} changed since the signal"
        else:
            where = ""
        return (f"cgwatch guard: {name} saved and exited {returncode} {after}{where}; "
                f"exit {GUARD_EXIT_STATUS} (saved, may be resumed)")
    status = exit_status(returncode)
    if returncode == -signum:
        return (f"cgwatch guard: nothing was saved: {name} has no handler for {sent} and "
                f"died of it {seconds_text(seconds)} after it was sent; exit {status}")
    if returncode < 0:
        return killed_line(name, -returncode, signum, seconds, save_delay, directory, saved_to,
                           status)
    return (f"cgwatch guard: {name} exited {returncode} {after}, not 0 or "
            f"{GUARD_EXIT_STATUS}: its save may have failed; exit {status}")


def find_saved(directory: str, since: float) -> Optional[str]:
    """The newest entry of `directory` changed at or after `since` (time.time()), or None:
    what a save into it wrote (a file, or a checkpoint directory whose mtime moved as its
    files were made)."""
    newest: Optional[tuple[float, str]] = None
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.startswith(STATE_NAME):
                    continue  # what the guard learned, not what CMD saved (ckptwatch.py)
                try:
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                except OSError:
                    continue  # removed meanwhile
                if mtime >= since - MTIME_SLACK and (newest is None or mtime > newest[0]):
                    newest = (mtime, entry.path)
    except OSError:
        return None
    return None if newest is None else newest[1]


class GuardThread:
    """The guard checked every INTERVAL seconds on a thread from `start()` until the `with`
    block ends; the first stop signals CMD (`fired` is that verdict)."""

    INTERVAL = 0.1

    def __init__(self, monitor: Monitor, events: Events, args: argparse.Namespace,
                 recorder: Optional[Recorder] = None, timed_saves: Sequence[float] = ()
                 ) -> None:
        kwargs: dict[str, Any] = {}
        if args.reserve is not None:
            kwargs["reserve"] = args.reserve
        if args.checkpoint_seconds is not None:
            kwargs["checkpoint_seconds"] = args.checkpoint_seconds
        kwargs.update(observe_options(args))
        # --save-delay: CMD saves that long after the signal (savedelay.py): in the lead
        self.save_delay = getattr(args, "save_delay", None) or 0.0
        self.guard = Guard(monitor, events=events, save_delay=self.save_delay, **kwargs)
        self.watching = ObservedRun(self.guard, recorder, args.signal) \
            if self.guard.observe else None
        for seconds in timed_saves:  # earlier attempts' saves (--restarts): a measured lead
            self.guard.saved(timed_save(seconds, self.save_delay))
        self.checkpoint_dir: Optional[str] = (getattr(args, "checkpoint_dir", None)
                                              or os.environ.get(CHECKPOINT_DIR_ENV) or None)
        # the lead learned from the job's own saves there, and kept for its next life
        self.learning = SaveWatch(self.checkpoint_dir, self.guard) \
            if self.checkpoint_dir is not None else None
        self.signum = int(args.signal) if args.signal is not None else int(signal.SIGTERM)
        self.fired: Optional[Verdict] = None
        self.fired_at = 0.0  # time.monotonic() when the signal was sent
        self.fired_wall = 0.0  # time.time() then, for the checkpoint's mtime
        self.recorder = recorder
        self.proc: Optional[subprocess.Popen[Any]] = None
        self.name = ""
        self.torchrun = False
        self.workers = 0  # torchrun's workers signalled (0: CMD itself was)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._check_until_stopped,
                                        name="cgwatch-run-guard", daemon=True)

    def __enter__(self) -> GuardThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, proc: subprocess.Popen[Any], command: list[str]) -> None:
        self.proc = proc
        self.name = os.path.basename(command[0])
        self.torchrun = is_torchrun(command)
        if self.learning is not None:
            self.learning.start()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.learning is not None:
            self.learning.close()
        # CMD ended by SIGKILL: the OOM killer's signal, as the record's end says it (a
        # `kill -9` reads the same there; run's own report tells them apart, cause.py)
        proc = self.proc
        self.guard.close(oom_killed=proc is not None and proc.returncode == -signal.SIGKILL)

    def environment(self) -> Optional[dict[str, str]]:
        """CMD's environment: ours, plus CGWATCH_CHECKPOINT_DIR when --checkpoint-dir gave
        one (None: ours unchanged)."""
        if self.checkpoint_dir is None or os.environ.get(CHECKPOINT_DIR_ENV) == \
                self.checkpoint_dir:
            return None
        return {**os.environ, CHECKPOINT_DIR_ENV: self.checkpoint_dir}

    def outcome(self, returncode: int, ended_at: float,
                oom_killed: bool = False) -> Optional[dict[str, Any]]:
        """What came of the signal, once CMD ended at `ended_at` (time.monotonic()): the
        `line` to print, `seconds` from the signal to the end, `saved`, `checkpoint` (where
        the save went, when known); None when the guard did not fire. `--observe`: the
        would-be stops judged (`line`, and `observe` for the JSON report; `oom_killed`:
        CMD itself was OOM-killed at its end)."""
        if self.watching is not None:
            return self.watching.outcome(self.name, ended_at, oom_killed)
        if self.fired is None:
            return None
        seconds = max(0.0, ended_at - self.fired_at)
        saved = guarded_status(returncode, self.fired, self.signum) == GUARD_EXIT_STATUS
        saved_to = None
        if (saved or returncode < 0) and self.checkpoint_dir is not None:
            saved_to = find_saved(self.checkpoint_dir, self.fired_wall)
        if saved and self.learning is not None:
            self.learning.signal_save(timed_save(seconds, self.save_delay))
        return {"line": outcome_line(self.name, returncode, self.signum, seconds,
                                     self.checkpoint_dir, saved_to, self.workers,
                                     self.save_delay),
                "seconds": round(seconds, 3), "saved": saved,
                "checkpoint": saved_to if saved else None}

    def learned(self) -> Optional[dict[str, Any]]:
        """What the lead learned from the job's saves (ckptwatch.py), for the JSON report."""
        return self.learning.report() if self.learning is not None else None

    def _check_until_stopped(self) -> None:
        while not self._stop.wait(self.INTERVAL):
            verdict = self.guard.check()
            if verdict.stop:
                self._fire(verdict)
                return

    def _fire(self, verdict: Verdict) -> None:
        self.fired = verdict
        proc = self.proc
        assert proc is not None
        targets = read_children(proc.pid) if self.torchrun else []
        self.workers = len(targets)
        print(fire_line(verdict, self.signum, self.name, targets or [proc.pid],
                        bool(targets)), file=sys.stderr, flush=True)
        if self.recorder is not None:
            self.recorder.mark("guard", f"guard: {verdict.trigger}, {signal_name(self.signum)}",
                               final=True, cgroup_path=verdict.level)
        self.fired_wall = time.time()
        self.fired_at = time.monotonic()
        if not targets:
            try:
                proc.send_signal(self.signum)
            except OSError:
                pass  # it has exited already: its status says the rest
        for pid in targets:
            try:
                os.kill(pid, self.signum)
            except OSError:
                pass  # that worker has exited already: torchrun's status says the rest
