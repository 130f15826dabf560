"""Internal. `cgwatch run --guard`: a `cgwatch.Guard` on CMD's cgroup checked on a thread while
CMD runs; the first time it says stop, its line goes to stderr and CMD gets the signal, once;
and `run`'s exit status after that (run.py's module docstring gives the rules)."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any, Optional

from ..guard import GUARD_EXIT_STATUS, Guard, Verdict
from .child import exit_status
from .explain import signal_name

if TYPE_CHECKING:
    from ..events import Events
    from ..monitor import Monitor
    from .plot import Recorder


def guarded_status(returncode: int, fired: Optional[Verdict], signum: Optional[int]) -> int:
    """`run`'s exit status: CMD's (exit_status), except that CMD ending with 0 or of the
    guard's signal after the guard fired is the guard's status, 75 (run.py's docstring)."""
    if fired is not None and signum is not None and returncode in (0, -signum):
        return GUARD_EXIT_STATUS
    return exit_status(returncode)


class GuardThread:
    """The guard checked every INTERVAL seconds on a thread from `start()` until the `with`
    block ends; the first stop signals CMD (`fired` is that verdict)."""

    INTERVAL = 0.1

    def __init__(self, monitor: Monitor, events: Events, args: argparse.Namespace,
                 recorder: Optional[Recorder] = None) -> None:
        kwargs: dict[str, Any] = {}
        if args.reserve is not None:
            kwargs["reserve"] = args.reserve
        if args.checkpoint_seconds is not None:
            kwargs["checkpoint_seconds"] = args.checkpoint_seconds
        self.guard = Guard(monitor, events=events, **kwargs)
        self.signum = int(args.signal) if args.signal is not None else int(signal.SIGTERM)
        self.fired: Optional[Verdict] = None
        self.recorder = recorder
        self.proc: Optional[subprocess.Popen[Any]] = None
        self.name = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._check_until_stopped,
                                        name="cgwatch-run-guard", daemon=True)

    def __enter__(self) -> GuardThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, proc: subprocess.Popen[Any], name: str) -> None:
        self.proc = proc
        self.name = name
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.guard.close()

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
        print(f"{verdict.message()}; sending {signal_name(self.signum)} to {self.name} "
              f"(pid {proc.pid})", file=sys.stderr, flush=True)
        if self.recorder is not None:
            self.recorder.mark("guard", f"guard: {verdict.trigger}, {signal_name(self.signum)}",
                               final=True, cgroup_path=verdict.level)
        try:
            proc.send_signal(self.signum)
        except OSError:
            pass  # it has exited already: its status says the rest
