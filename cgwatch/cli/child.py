"""Internal. CMD's process under `cgwatch run`: the signals relayed to it, its exit status as a
shell reports it, and cgwatch's own OOM score lowered below it (run.py's module docstring
gives the rules)."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any, Optional

from .. import names
from ..files import under_root

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
LEFT_TO_CHILD = (signal.SIGINT, signal.SIGQUIT)
OOM_SCORE_ADJ = -500  # half the limit off our badness: CMD's processes go first


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell reports it: -N (killed by signal N) -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


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
