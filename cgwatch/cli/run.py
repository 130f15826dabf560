"""`cgwatch run -- CMD [ARGS]`: run CMD in the current cgroup while watching its memory
events, exit with CMD's status, and say why when the OOM killer struck.

- The exit status is CMD's; death by signal N gives 128+N, as shells report it (SIGKILL:
  137). CMD not found: 127; not executable: 126.
- Counters are read (baseline) before CMD starts and once more, synchronously, after it
  exits; the kernel raises `oom_kill` before it sends the SIGKILL, so a kill is never missed.
  When an `oom_kill` counter on the path rose meanwhile, an explanation goes to stderr
  (explain.py); otherwise nothing at all is added to CMD's output (`-v` prints the events
  as they come).
- Signals: SIGINT and SIGQUIT are left to CMD (a terminal sends them to the whole
  foreground job, CMD included; cgwatch waits for it, as a shell does); SIGTERM, SIGHUP,
  SIGUSR1 and SIGUSR2 are forwarded to CMD.
- cgwatch itself (about 20 MB) is charged to the same cgroup; it lowers its own OOM score
  after starting CMD (where allowed) so the OOM killer picks CMD's processes first.
- v1 counts `oom_kill` only in the victim's own cgroup: a CMD that moves its processes into a
  cgroup below ours is not covered there (v2 counts the whole subtree).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Optional

from .. import names, values
from ..event import Event
from ..events import Events, Item
from ..files import read_file, under_root
from ..monitor import Monitor
from .explain import KILL_COUNTERS, Report, explain, find_culprit
from .format import format_item

_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_LEFT_TO_CHILD = (signal.SIGINT, signal.SIGQUIT)
_OOM_SCORE_ADJ = -500  # half the limit off our badness: CMD's processes go first


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell reports it: -N (killed by signal N) -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _peak(directory: str, version: int) -> tuple[Optional[int], str]:
    name = names.FileNames.for_version(version).peak
    try:
        return values.parse_counter(read_file(os.path.join(directory, name))), name
    except (OSError, ValueError):
        return None, ""


def _vmstat_oom_kills(root: str) -> Optional[int]:
    """The host's count of OOM kills (/proc/vmstat `oom_kill`, Linux 4.13+)."""
    try:
        text = read_file(under_root(root, names.VMSTAT))
    except OSError:
        return None
    return values.parse_flat_keyed(text).get("oom_kill")


def build_report(command: str, returncode: int, seen: list[Item],
                 monitor: Monitor) -> Optional[Report]:
    """The report to print, or None when no OOM kill touched the path."""
    events = [e for e in seen if isinstance(e, Event)]
    kills = [e for e in events if e.counter in KILL_COUNTERS]
    if not kills:
        return None
    if monitor.status.version == 2:
        # Hierarchical: every ancestor repeats a kill, and a reader may see the repeats in a
        # later scan than the original. The deepest level that counted one says where.
        deepest = min(e.level for e in kills)
        kills = [e for e in kills if e.level == deepest]
    limited = [(lvl.cgroup_path, lvl.directory, lvl.limit) for lvl in monitor.levels()
               if lvl.limit is not None]
    culprit = find_culprit(events, limited)
    peak, peak_file = (None, "")
    version = monitor.status.version
    if culprit is not None and version is not None:
        peak, peak_file = _peak(culprit.directory, version)
    sig = -returncode if returncode < 0 else None
    return Report(command, exit_status(returncode), sig, tuple(kills), culprit, peak, peak_file)


def run_command(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("cgwatch run: give a command: cgwatch run -- CMD [ARGS]", file=sys.stderr)
        return 2
    name = os.path.basename(command[0])
    logger = logging.getLogger("cgwatch")
    if not logger.handlers:
        # The library's own warnings (a fallback, say) would otherwise reach stderr through
        # logging's last-resort handler: `run` adds nothing to CMD's output unless asked.
        logger.addHandler(logging.NullHandler())
    seen: list[Item] = []
    seen_lock = threading.Lock()

    with Monitor(args.root) as monitor, Events(monitor, log=False) as events:
        def collect(item: Any) -> None:
            with seen_lock:
                seen.append(item)
            if args.verbose:
                print(f"cgwatch: {format_item(item, events.limit_above(item))}",
                      file=sys.stderr, flush=True)

        events.subscribe(collect)
        host_kills_before = _vmstat_oom_kills(args.root)
        with _Relay() as relay:
            try:
                proc = subprocess.Popen(command)
            except FileNotFoundError:
                print(f"cgwatch run: {command[0]}: command not found", file=sys.stderr)
                return 127
            except OSError as e:  # not executable, not a program, ...
                print(f"cgwatch run: {command[0]}: {e.strerror or e}", file=sys.stderr)
                return 126
            relay.started(proc)
            _prefer_not_to_be_killed(args.root)
            returncode = proc.wait()
        events.scan_now()  # rises that landed after the last notification was read
        with seen_lock:
            report = build_report(name, returncode, list(seen), monitor)
        if report is None and returncode == -signal.SIGKILL:
            after = _vmstat_oom_kills(args.root)
            if host_kills_before is not None and after is not None \
                    and after > host_kills_before:
                print(f"cgwatch: {name} was killed by SIGKILL; meanwhile the kernel's "
                      f"OOM killer killed {after - host_kills_before} process(es) on this "
                      "host, none counted on this cgroup path (see `dmesg` for 'Killed "
                      "process')", file=sys.stderr)
    if report is not None:
        print(explain(report), file=sys.stderr, flush=True)
    return exit_status(returncode)


def _prefer_not_to_be_killed(root: str) -> None:
    """Lower our own OOM score (after CMD started, so CMD keeps its own): the watcher is small,
    and if the OOM killer took it instead, CMD would run on unwatched and its status be lost.
    Needs CAP_SYS_RESOURCE; without it nothing changes."""
    try:
        with open(under_root(root, names.OOM_SCORE_ADJ), "w") as f:
            f.write(str(_OOM_SCORE_ADJ))
    except OSError:
        pass


class _Relay:
    """The signal rules of the module docstring, in force from before CMD starts (a signal
    that arrives before CMD exists is passed on once it does) until it has exited."""

    def __init__(self) -> None:
        self.proc: Optional[subprocess.Popen[Any]] = None
        self.pending: list[int] = []
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _Relay:
        # Python-level handlers, not SIG_IGN: CMD would inherit an ignored signal, while
        # caught ones are reset to the default by exec.
        for signum in _FORWARDED:
            self.previous[signum] = signal.signal(signum, self._forward)
        for signum in _LEFT_TO_CHILD:
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
