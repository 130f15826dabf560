"""Internal. `cgwatch run -- CMD [ARGS]`: run CMD in the current cgroup while watching its memory
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
  (oom_score_adj) to -500 after starting CMD (where allowed: CAP_SYS_RESOURCE) so the OOM
  killer picks CMD's processes first. It never raises it: a value found at -500 or below is
  kept. The write opens the existing file only (O_NOFOLLOW | O_CLOEXEC, no O_CREAT).
- Memory stays bounded however long CMD runs (runlog.py): per counter and level the number
  of rises, their total and the first and last event. `-v` coalesces bursts (coalesce.py).
- /dev/shm is sampled every 0.25 s; CMD dying of SIGBUS (or failing) while it was over 90%
  full is explained (explain.py `explain_shm`).
- Inside a Slurm job the explanation names the job, the step and the --mem it asked for, and
  advises --mem and sacct. Without an OOM kill: a SIGKILL (or srun's 137) in a job whose
  declared --mem no cgroup enforces is named as slurmstepd's sampling (OverMemoryKill); exit
  status 1 or SIGABRT under RLIMIT_AS/RLIMIT_DATA as a likely MemoryError / std::bad_alloc.
- `--json` / `--report FILE`: the report as one JSON object (report_json) on stderr / in
  FILE. The killed process is named (pid, command) only when it is CMD itself, killed by
  SIGKILL while an `oom_kill` was counted: the kernel log that names other victims is not
  reliably readable (dmesg_restrict, containers), so they are counted, not named.
- v1 counts `oom_kill` only in the victim's own cgroup: a CMD that moves its processes into a
  cgroup below ours is not covered there (v2 counts the whole subtree).
- `--guard`: a `cgwatch.Guard` on this cgroup (CMD's: `run` wraps it) is checked every
  0.1 s on a thread (a check between the guard's own samples costs one
  available_memory()); the first time it says stop, its message goes to stderr and CMD gets
  `--signal` (default SIGTERM), once. When CMD then exits with 0 or of that signal, `run`
  exits 75 (the guard's status, policy.py: saved, may be resumed); any other status is
  CMD's own (its save failed, say), and a kill that comes anyway is explained as always.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from .. import names, values
from ..event import Event
from ..events import Events, Item
from ..files import read_file, under_root
from ..guard import GUARD_EXIT_STATUS, Guard, Verdict
from ..monitor import Monitor
from ..shm import ShmUsage, shm_usage
from ..snapshot import LevelInfo
from .coalesce import Coalescer, rises_suffix
from .explain import (
    KILL_COUNTERS,
    Above,
    Report,
    SlurmJob,
    explain,
    explain_rlimit,
    explain_sampled,
    explain_shm,
    find_culprit,
    signal_name,
    slurm_job,
)
from .format import format_item
from .runlog import RunLog

if TYPE_CHECKING:
    from .plot import Recorder

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


def _rlimits() -> list[tuple[str, int]]:
    """The soft RLIMIT_AS/RLIMIT_DATA that CMD inherits from us, where set."""
    import resource

    out = []
    for name in ("RLIMIT_AS", "RLIMIT_DATA"):
        soft = resource.getrlimit(getattr(resource, name))[0]
        if soft != resource.RLIM_INFINITY:
            out.append((name, soft))
    return out


def build_report(command: str, returncode: int, seen: list[Item],
                 monitor: Monitor, slurm: Optional[SlurmJob] = None) -> Optional[Report]:
    """The report to print, or None when no OOM kill touched the path. `seen`: the events
    (RunLog.events() gives one merged Event per counter and level)."""
    events = [e for e in seen if isinstance(e, Event)]
    kills = [e for e in events if e.counter in KILL_COUNTERS]
    if not kills:
        return None
    if monitor.status.version == 2:
        # Hierarchical: every ancestor repeats a kill, and a reader may see the repeats in a
        # later scan than the original. The deepest level that counted one says where.
        deepest = min(e.level for e in kills)
        kills = [e for e in kills if e.level == deepest]
    levels = monitor.levels()
    visible = [lvl for lvl in levels if not lvl.hidden]
    top = visible[-1].cgroup_path if visible else ""
    culprit = find_culprit(events, _above(levels, monitor.status.above),
                           len(visible) - 1 if visible else None)
    peak, peak_file = (None, "")
    version = monitor.status.version
    if culprit is not None and version is not None:
        peak, peak_file = _peak(culprit.directory, version)
    sig = -returncode if returncode < 0 else None
    return Report(command, exit_status(returncode), sig, tuple(kills), culprit, peak, peak_file,
                  top, slurm)


def _above(levels: list[LevelInfo], above: str) -> Optional[Above]:
    """The level above the visible hierarchy, when a limit may be there: v1's hidden level
    (its value from hierarchical_memory_limit), or, where `status.above` says limits above
    the top cannot be seen, one of unknown value."""
    for lvl in levels:
        if lvl.hidden:
            return (lvl.cgroup_path, lvl.directory, lvl.limit)
    if above and levels:
        top = levels[-1]
        return (f"(above {top.cgroup_path})", top.directory, None)
    return None


def run_command(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("cgwatch run: give a command: cgwatch run -- CMD [ARGS]", file=sys.stderr)
        return 2
    guard_options = [name for name, value in (("--signal", args.signal),
                                              ("--reserve", args.reserve),
                                              ("--checkpoint-seconds",
                                               args.checkpoint_seconds))
                     if value is not None]
    if guard_options and not args.guard:
        print(f"cgwatch run: {guard_options[0]} needs --guard", file=sys.stderr)
        return 2
    name = os.path.basename(command[0])
    logger = logging.getLogger("cgwatch")
    if not logger.handlers:
        # The library's own warnings (a fallback, say) would otherwise reach stderr through
        # logging's last-resort handler: `run` adds nothing to CMD's output unless asked.
        logger.addHandler(logging.NullHandler())
    runlog = RunLog()
    host_note: Optional[str] = None
    pid: Optional[int] = None

    with Monitor(args.root) as monitor, Events(monitor, log=False, queue_size=0) as events:
        printer = _Verbose(events) if args.verbose else None

        def collect(item: Any) -> None:
            runlog.add(item)
            if printer is not None:
                printer.offer(item)

        events.subscribe(collect)
        recorder = None
        if args.plot or args.json or args.report:
            from .plot import Recorder

            recorder = Recorder(monitor)
            events.subscribe(recorder.event)
        host_kills_before = _vmstat_oom_kills(args.root)
        guarding = _Guarding(monitor, events, args, recorder) if args.guard else None
        with _Relay() as relay, _ShmSampler(args.root) as shm, _guarded(guarding), \
                (recorder if recorder is not None else contextlib.nullcontext()):
            try:
                proc = subprocess.Popen(command)
            except FileNotFoundError:
                print(f"cgwatch run: {command[0]}: command not found", file=sys.stderr)
                return 127
            except OSError as e:  # not executable, not a program, ...
                print(f"cgwatch run: {command[0]}: {e.strerror or e}", file=sys.stderr)
                return 126
            pid = proc.pid
            relay.started(proc)
            if guarding is not None:
                guarding.start(proc, name)
            prefer_not_to_be_killed(args.root)
            returncode = proc.wait()
        events.scan_now()  # rises that landed after the last notification was read
        if recorder is not None:
            recorder.mark("exit", _end_label(returncode), final=True,
                          exit_status=exit_status(returncode))
        if printer is not None:
            printer.close()
        slurm = slurm_job(monitor.status.cgroup_path, os.environ, monitor.levels())
        report = build_report(name, returncode, list(runlog.events()), monitor, slurm)
        if report is None and returncode == -signal.SIGKILL:
            after = _vmstat_oom_kills(args.root)
            if host_kills_before is not None and after is not None \
                    and after > host_kills_before:
                host_note = (f"{name} was killed by SIGKILL; meanwhile the kernel's "
                             f"OOM killer killed {after - host_kills_before} process(es) on "
                             "this host, none counted on this cgroup path (see `dmesg` for "
                             "'Killed process')")
        available = monitor.available_memory()
    sig = -returncode if returncode < 0 else None
    shm_text = explain_shm(name, exit_status(returncode), sig, shm.peak, available)
    # Other causes, when no OOM kill explains the end (the evidence each needs: explain.py)
    if report is None and host_note is None:
        shm_text = shm_text or explain_sampled(name, exit_status(returncode), sig, 0, slurm) \
            or explain_rlimit(name, exit_status(returncode), sig, _rlimits())
    fired = guarding.fired if guarding is not None else None
    status = guarded_status(returncode, fired, guarding.signum if guarding else None)
    if args.json or args.report:
        data = report_json(command, pid, returncode, report, runlog, shm.peak, shm.last,
                           shm_text, host_note)
        data["slurm"] = None if slurm is None else slurm.as_dict()
        if guarding is not None:
            data["exit_status"] = status
            data["guard"] = None if fired is None else {
                **fired.as_dict(), "signal": signal_name(guarding.signum)}
        if recorder is not None:
            data["timeline"] = recorder.as_dict()
        if args.report:
            _write_report(args.report, data)
    if args.plot and recorder is not None:
        _plot(args.plot, recorder, " ".join(command))
    if args.json:
        print(json.dumps(data), file=sys.stderr, flush=True)
        return status
    for text in (host_note and "cgwatch: " + host_note,
                 report is not None and explain(report), shm_text):
        if text:
            print(text, file=sys.stderr, flush=True)
    return status


def _end_label(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exit {returncode}"


def _plot(path: str, recorder: Recorder, title: str) -> None:
    from .plot import write_plot

    why = write_plot(path, recorder.as_dict(), f"cgwatch run -- {title}")
    if why is not None:
        print(f"cgwatch run: --plot: {why}", file=sys.stderr, flush=True)


def guarded_status(returncode: int, fired: Optional[Verdict], signum: Optional[int]) -> int:
    """`run`'s exit status: CMD's (exit_status), except that CMD ending with 0 or of the
    guard's signal after the guard fired is the guard's status, 75 (module docstring)."""
    if fired is not None and signum is not None and returncode in (0, -signum):
        return GUARD_EXIT_STATUS
    return exit_status(returncode)


def report_json(command: list[str], pid: Optional[int], returncode: int,
                report: Optional[Report], runlog: RunLog, shm_peak: Optional[ShmUsage],
                shm_last: Optional[ShmUsage], shm_text: Optional[str],
                host_note: Optional[str]) -> dict[str, Any]:
    """The report as plain data: what `--json` prints and `--report FILE` writes."""
    sig = -returncode if returncode < 0 else None
    kills = sum(e.delta for e in report.kills) if report is not None else 0
    killed = None
    if report is not None and sig == signal.SIGKILL:
        # CMD itself died of SIGKILL while the OOM killer struck on its path: it is the victim
        # (another process's SIGKILL at the same moment is the one case this misnames).
        killed = {"pid": pid, "command": command}
    culprit = report.culprit if report is not None else None
    return {
        "type": "run", "command": command, "pid": pid,
        "exit_status": exit_status(returncode),
        "signal": None if sig is None else signal_name(sig),
        "oom_kills": kills,
        "oom_kills_in": sorted({e.cgroup_path for e in report.kills}) if report else [],
        "killed_process": killed,
        # limit: a visible level's limit was reached; above: a limit above the visible
        # hierarchy; host: no limit on the path was reached (a global OOM)
        "cause": report.cause if report is not None else None,
        "culprit": None if culprit is None else {
            "cgroup_path": culprit.cgroup_path, "limit": culprit.limit,
            "certain": culprit.certain, "kind": culprit.kind,
            "peak": report.peak if report else None,
            "peak_file": report.peak_file if report else ""},
        "events": [s.as_dict() for s in runlog.summaries()],
        "headroom_alerts": runlog.alerts,
        "peak_usage_seen": runlog.peak_usage,
        "dev_shm": {"peak": shm_peak.as_dict() if shm_peak else None,
                    "at_exit": shm_last.as_dict() if shm_last else None},
        "explanation": [line.removeprefix("cgwatch: ") for text in
                        (host_note and "cgwatch: " + host_note,
                         report is not None and explain(report), shm_text)
                        if text for line in text.splitlines()],
    }


def _write_report(path: str, data: dict[str, Any]) -> None:
    try:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    except OSError as e:
        print(f"cgwatch run: cannot write the report to {path}: {e.strerror or e}",
              file=sys.stderr)


class _Verbose:
    """`-v`: coalesced event lines to stderr; a thread prints what waited out its window."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.coalescer = Coalescer()
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._flush_when_due, name="cgwatch-run-v",
                                       daemon=True)
        self.thread.start()

    def offer(self, item: Item) -> None:
        with self.cond:
            self._print(self.coalescer.offer(item, time.monotonic()))
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self._print(self.coalescer.flush())
            self.cond.notify()
        self.thread.join(timeout=5)

    def _flush_when_due(self) -> None:
        with self.cond:
            while not self.closed:
                due = self.coalescer.next_due()
                self.cond.wait(None if due is None else max(0.0, due - time.monotonic()))
                self._print(self.coalescer.due(time.monotonic()))

    def _print(self, lines: list[tuple[Item, int]]) -> None:
        for item, rises in lines:
            print(f"cgwatch: {format_item(item)}"
                  f"{rises_suffix(rises)}", file=sys.stderr, flush=True)


class _Guarding:
    """`--guard`: the guard checked on a thread while CMD runs; the first stop signals CMD."""

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


class _guarded:
    """`with _guarded(guarding)`: closes the guard's thread after CMD exits (None: no-op)."""

    def __init__(self, guarding: Optional[_Guarding]) -> None:
        self.guarding = guarding

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        if self.guarding is not None:
            self.guarding.close()


class _ShmSampler:
    """/dev/shm's fullest moment while CMD runs (a worker's segments are freed when it dies,
    so the use at exit can be low again): statvfs every 0.25 s on a thread."""

    INTERVAL = 0.25

    def __init__(self, root: str) -> None:
        self.root = root
        self.peak: Optional[ShmUsage] = None
        self.last: Optional[ShmUsage] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped,
                                        name="cgwatch-run-shm", daemon=True)

    def __enter__(self) -> _ShmSampler:
        self.sample()
        if self.last is not None:  # no /dev/shm: nothing to follow
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()

    def sample(self) -> None:
        usage = shm_usage(self.root)
        if usage is None:
            return
        self.last = usage
        if self.peak is None or usage.used >= self.peak.used:
            self.peak = usage

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self.INTERVAL):
            self.sample()


def prefer_not_to_be_killed(root: str) -> Optional[int]:
    """Lower our own OOM score (after CMD started, so CMD keeps its own) to _OOM_SCORE_ADJ,
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
        if int(found) <= _OOM_SCORE_ADJ:
            return None  # already at least as protected: never raise it
        # procfs takes the value at offset 0 whatever was read; pwrite for a fake tree's file
        os.pwrite(fd, f"{_OOM_SCORE_ADJ}\n".encode(), 0)
        if not root or root == "/":
            return _OOM_SCORE_ADJ
        os.ftruncate(fd, len(f"{_OOM_SCORE_ADJ}\n"))
        return _OOM_SCORE_ADJ
    except OSError:
        return None
    finally:
        os.close(fd)


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
