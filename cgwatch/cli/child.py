"""Internal. CMD's process under `cgwatch run`: the signals relayed to it, its exit status as a
shell reports it (and 75 when every rank recorded its save, saves.py), and cgwatch's own OOM
score lowered below it (run.py's module docstring gives the rules)."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any, Optional

from .. import names
from ..files import under_root
from ..guard import GUARD_EXIT_STATUS
from ..saves import Saves

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
LEFT_TO_CHILD = (signal.SIGINT, signal.SIGQUIT)
OOM_SCORE_ADJ = -500  # half the limit off our badness: CMD's processes go first


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell reports it: -N (killed by signal N) -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def saved_status(status: int, saves: Saves, name: str) -> tuple[int, str]:
    """`run`'s status once the ranks' records are read (saves.py), and a line to print ("":
    none); pure. `status`: what `run` would exit with otherwise. A launcher that ended in
    failure (torchrun's 1 for workers that exited 75, Lightning's 137 for a rank 0 its
    observer killed) after every rank of its newest attempt recorded its save: 75. CMD's 0
    (finished, perhaps after torchrun restarted the group itself) and 75 stay; with a rank
    that did not record its save, the status stays and the line says how many did."""
    if saves.expected == 0 or status in (0, GUARD_EXIT_STATUS) or saves.saved == 0:
        return status, ""
    ended = f"exit {status}"
    if 128 < status < 128 + signal.NSIG:
        try:
            ended = f"killed by {signal.Signals(status - 128).name}"
        except ValueError:  # a real-time signal: no name
            ended = f"killed by signal {status - 128}"
    if saves.complete:
        at = f" at step {saves.step}" if saves.step is not None else ""
        return GUARD_EXIT_STATUS, (
            f"cgwatch run: every rank ({saves.saved}) saved{at} after the guard's stop; "
            f"{name} ended with {ended}; exit {GUARD_EXIT_STATUS} (saved, may be resumed)")
    return status, (f"cgwatch run: only {saves.saved} of {saves.expected} ranks recorded a "
                    f"save after the guard's stop; {name} ended with {ended}; not saved: "
                    f"exit {status}")


def prefer_not_to_be_killed(root: str) -> Optional[int]:
    """Lower our own OOM score (after CMD started, so CMD keeps its own) to OOM_SCORE_ADJ,
    never raising it: the watcher is small, and if the OOM killer took it instead, CMD would
    run on unwatched and its status be lost. Lowering needs CAP_SYS_RESOURCE; without it
    nothing changes. The value written, or None when nothing was (already as low, unreadable,
    not allowed)."""
    path = under_root(root, names.OOM_SCORE_ADJ)
    try:
        # O_NOFOLLOW: with --root (or a fake tree) a symlink must not make us write another
        # file; no O_CREAT: the file is the kernel's, or there is nothing to do.
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        found = os.read(fd, 64).decode("ascii", "replace").strip()
        if not (found.lstrip("-").isascii() and found.lstrip("-").isdigit()):
            return None  # not a number: leave it alone
        if int(found) <= OOM_SCORE_ADJ:
            return None  # already at least as protected: never raise it
        # procfs takes the value at offset 0 whatever was read; pwrite for a fake tree's file
        os.pwrite(fd, f"{OOM_SCORE_ADJ}\n".encode(), 0)
        if not root or root == "/":
            return OOM_SCORE_ADJ
        os.ftruncate(fd, len(f"{OOM_SCORE_ADJ}\n"))
        return OOM_SCORE_ADJ
    except OSError:
        return None
    finally:
        os.close(fd)


class SignalRelay:
    """The signal rules of run.py's module docstring, in force from before CMD starts (a
    signal that arrives before CMD exists is passed on once it does) until it has exited."""

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen[Any]] = None
        self.pending: list[int] = []
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> SignalRelay:
        # Python-level handlers, not SIG_IGN: CMD would inherit an ignored signal, while
        # caught ones are reset to the default by exec.
        for signum in FORWARDED:
            self.previous[signum] = signal.signal(signum, self._forward)
        for signum in LEFT_TO_CHILD:
            self.previous[signum] = signal.signal(signum, self._leave)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def started(self, proc: subprocess.Popen[Any]) -> None:
        self.proc = proc
        while self.pending:
            self._send(self.pending.pop(0))

    def _forward(self, signum: int, frame: object) -> None:
        self._send(signum)

    def _leave(self, signum: int, frame: object) -> None:
        if self.proc is None:
            self.pending.append(signum)  # the terminal could not send it to CMD yet
        # else: CMD got it from the terminal too; its exit decides ours

    def _send(self, signum: int) -> None:
        if self.proc is None:
            self.pending.append(signum)
            return
        try:
            self.proc.send_signal(signum)
        except OSError:
            pass
