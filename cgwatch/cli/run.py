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
  available_memory()); the first time it says stop, CMD gets `--signal` (default SIGTERM),
  once, and stderr a line "stopping to save" with why. After CMD ended, one more line says
  what came of it and how long after the signal it ended. CMD exiting 0 or 75 after the
  signal saved: `run` exits 75 (the guard's status, policy.py: saved, may be resumed), and
  names the newest entry of `--checkpoint-dir` (or $CGWATCH_CHECKPOINT_DIR) changed since
  the signal. CMD dying of the signal had no handler and saved nothing: `run` says so and
  exits 128+N, as a shell would. Any other status is CMD's own (its save failed, say), and
  a kill that comes anyway is explained as always (runguard.py). CMD torchrun: the signal
  goes to its workers, and torchrun's 0 (every worker exited 0) makes 75 (runguard.py
  `is_torchrun` says why).
- Ranks that save (the adapters; saves.py): CMD gets CGWATCH_SAVES_DIR, a fresh directory
  `run` owns and removes after CMD ended, where each rank records that it started and that
  it saved after its guard's stop. When every rank of the newest attempt saved, a failure
  status of the launcher (torchrun's 1 for workers exiting 75, Lightning's launcher's 137)
  becomes 75, with a line saying so; a rank that did not record its save leaves the status
  as it was (child.py `saved_status`).
- `--restarts N` (with --guard): an attempt that would exit 75 is run again, up to N times,
  with a doubling back-off and CGWATCH_RESTART=k; a stop at the same step twice ends the
  restarts (restarts.py has the rules). Each attempt gets its own guard and its own lines.
  One recorder spans every attempt, so `--plot` draws the whole life on one time axis: each
  rise, each stop, each restart (a mark "restart k from step S") and the finish. `--json` and
  `--report` give one object for the whole life (life_report): the attempts, each its
  single-run report without the timeline, then the final status and the one timeline. One
  object, not one per attempt, because `--report FILE` holds one object and `--json` prints
  what `--report` writes; the `{"restarts": line}` lines still come as each decision is made.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from ..events import Events
from ..monitor import Monitor
from ..saves import SAVES_ENV, Saves, all_saved, read_records
from .cause import Cause, ShmSampler, find_cause, read_host_oom_kills, report_json, write_report
from .child import SignalRelay, exit_status, prefer_not_to_be_killed, saved_status
from .explain import signal_name
from .restarts import RESTART_ENV, Attempt, next_attempt, parse_step
from .runguard import GuardThread, guarded_status
from .runlog import RunLog
from .runverbose import VerbosePrinter

if TYPE_CHECKING:
    from .plot import Recorder

DEFAULT_RESTART_DELAY = 1.0  # seconds before the first restart (--restart-delay)


def run_command(args: argparse.Namespace) -> int:
    """`cgwatch run`: check the arguments, run CMD, report (the module docstring)."""
    command, problem = check_arguments(args)
    if problem:
        print(f"cgwatch run: {problem}", file=sys.stderr)
        return 2
    logger = logging.getLogger("cgwatch")
    if not logger.handlers:
        # The library's own warnings (a fallback, say) would otherwise reach stderr through
        # logging's last-resort handler: `run` adds nothing to CMD's output unless asked.
        logger.addHandler(logging.NullHandler())
    restarts = getattr(args, "restarts", None)
    if restarts is None:
        ran = _run(args, command)
        if isinstance(ran, int):
            return ran  # CMD could not start (126, 127)
        return _report(args, command, ran)
    return run_restarting(args, command, restarts)


def run_restarting(args: argparse.Namespace, command: list[str], restarts: int,
                   attempt: Optional[Callable[[int], Union[int, Attempt]]] = None,
                   sleep: Callable[[float], None] = time.sleep) -> int:
    """`--restarts N`: run CMD, and again after each save while restarts.next_attempt says
    so; the last attempt's status. `attempt(k)` runs the k-th (0: the first) and reports it
    (default: CMD for real); an int from it is a CMD that could not start (126, 127)."""
    delay = args.restart_delay if args.restart_delay is not None else DEFAULT_RESTART_DELAY
    name = os.path.basename(command[0])
    life = _Life()
    run_once = attempt if attempt is not None else (
        lambda restart: _attempt(args, command, restart, life))
    history: list[Attempt] = []
    decisions: list[str] = []
    while True:
        done = run_once(len(history))
        if isinstance(done, int):
            status = done  # CMD could not start (126, 127)
            decisions.append(f"cgwatch run: {name} could not start (exit {done})")
            break
        history.append(done)
        after = next_attempt(history, restarts, delay, name)
        decisions.append(after.line)
        if after.line:
            print(json.dumps({"restarts": after.line}) if args.json else after.line,
                  file=sys.stderr, flush=True)
        if after.delay is None:
            status = done.status
            break
        sleep(after.delay)
    _report_life(args, command, restarts, life, decisions, status)
    return status


class _Life:
    """What `--restarts` keeps across attempts: the one recorder (made by the first attempt,
    handed to the next: one time axis) and each attempt's report."""

    def __init__(self) -> None:
        self.recorder: Optional[Recorder] = None
        self.attempts: list[dict[str, Any]] = []
        self.step: Optional[int] = None  # the step the last stop saved
        # seconds from the signal to CMD's end, of each attempt that saved: the lead of the
        # attempts after it is this measured save, not an estimate (Guard.saved)
        self.saves: list[float] = []


def _attempt(args: argparse.Namespace, command: list[str], restart: int,
             life: _Life) -> Union[int, Attempt]:
    """One run of CMD under --restarts: its lines as a single run's (text mode), its report
    kept in `life`; its status and the step its save named."""
    recorder = life.recorder
    started = 0.0
    if recorder is not None:
        recorder.mark("restart", restart_label(restart, life.step), final=True)
        started = recorder.now()
    ran = _run(args, command, restart=restart, recorder=recorder, timed_saves=life.saves)
    if isinstance(ran, int):
        return ran  # CMD could not start (126, 127)
    life.recorder = ran.recorder
    status, data, outcome, saves_line = _build_report(args, command, ran)
    if outcome and outcome["saved"]:
        life.saves.append(outcome["seconds"])
    if not args.json:
        _say(outcome, saves_line, ran.cause)
    step = parse_step(outcome["checkpoint"]) if outcome else None
    if step is None and ran.saves.complete:
        step = ran.saves.step  # the ranks' records name the step they saved (saves.py)
    life.step = step
    if data:
        data.pop("timeline", None)  # the life's one timeline is in life_report
        # on the timeline's clock, unrounded as its marks are
        data.update(restart=restart, step=step, started=started,
                    ended=ran.recorder.now() if ran.recorder else None)
        life.attempts.append(data)
    return Attempt(status, step)


def restart_label(restart: int, step: Optional[int]) -> str:
    """The picture's mark at restart k's start (pure)."""
    return f"restart {restart}" + (f" from step {step}" if step is not None else "")


def life_report(command: list[str], attempts: list[dict[str, Any]], decisions: list[str],
                status: int, restarts: int, timeline: Optional[dict[str, Any]]) -> dict[str, Any]:
    """`--json` / `--report` under --restarts, pure: one object for the whole life.
    `attempts`: each attempt's single-run report (oldest first); `decisions`: the line said
    after each ("" for none; one more than `attempts` when the last could not start)."""
    joined = [{**data, "next": line} for data, line in zip(attempts, decisions)]
    return {"type": "run_restarts", "command": command, "exit_status": status,
            "restarts_allowed": restarts, "restarts_made": max(0, len(decisions) - 1),
            "end": decisions[-1] if decisions else "",
            "attempts": joined, "timeline": timeline}


def _report_life(args: argparse.Namespace, command: list[str], restarts: int, life: _Life,
                 decisions: list[str], status: int) -> None:
    """After the last attempt: the life's one report (--json, --report) and picture."""
    timeline = life.recorder.as_dict() if life.recorder is not None else None
    json_wanted = getattr(args, "json", False) or getattr(args, "report", None)
    if json_wanted and life.attempts:
        data = life_report(command, life.attempts, decisions, status, restarts, timeline)
        if getattr(args, "report", None):
            write_report(args.report, data)
        if getattr(args, "json", False):
            print(json.dumps(data), file=sys.stderr, flush=True)
    if getattr(args, "plot", None) and life.recorder is not None:
        _plot(args.plot, life.recorder, " ".join(command), f"--restarts {restarts} ")


def check_arguments(args: argparse.Namespace) -> tuple[list[str], str]:
    """CMD from the arguments, and the usage error ("" when none); pure."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        return command, "give a command: cgwatch run -- CMD [ARGS]"
    guard_options = [name for name, value in (("--signal", args.signal),
                                              ("--reserve", args.reserve),
                                              ("--checkpoint-seconds",
                                               args.checkpoint_seconds),
                                              ("--checkpoint-dir",
                                               getattr(args, "checkpoint_dir", None)),
                                              ("--observe", getattr(args, "observe", None)),
                                              ("--record", getattr(args, "record", None)),
                                              ("--save-delay",
                                               getattr(args, "save_delay", None)))
                     if value is not None]
    if getattr(args, "restarts", None) is not None:
        guard_options.append("--restarts")
    if guard_options and not args.guard:
        return command, f"{guard_options[0]} needs --guard"
    if getattr(args, "observe", None) and getattr(args, "restarts", None) is not None:
        return command, "--restarts with --observe: an observing guard never stops CMD"
    if getattr(args, "record", None) and getattr(args, "restarts", None) is not None:
        return command, "--record with --restarts: a record holds one guard's life"
    if getattr(args, "restart_delay", None) is not None and getattr(args, "restarts",
                                                                    None) is None:
        return command, "--restart-delay needs --restarts"
    return command, ""


class _Ran:
    """What running CMD left for the report."""

    def __init__(self, pid: int, returncode: int, cause: Cause, runlog: RunLog,
                 shm: ShmSampler, guarding: Optional[GuardThread],
                 recorder: Optional[Recorder], ended_at: float, saves: Saves, status: int,
                 saves_line: str) -> None:
        self.pid = pid
        self.saves = saves  # what the ranks recorded (saves.py)
        self.status = status  # run's exit status (guarded_status, then saved_status)
        self.saves_line = saves_line  # what to say of the ranks' records ("": nothing)
        self.ended_at = ended_at  # time.monotonic() when CMD's exit was reaped
        self.returncode = returncode
        self.cause = cause
        self.runlog = runlog
        self.shm = shm
        self.guarding = guarding
        self.recorder = recorder


def _run(args: argparse.Namespace, command: list[str], restart: int = 0,
         recorder: Optional[Recorder] = None,
         timed_saves: Sequence[float] = ()) -> Union[_Ran, int]:
    """Run CMD with its watchers (`restart` k > 0: CGWATCH_RESTART=k in its environment;
    `recorder`: an earlier attempt's, to go on with; `timed_saves`: the saves earlier
    attempts made, seconds from the signal to CMD's end, for the guard's lead); what it
    left, or 127/126 when it could
    not start."""
    name = os.path.basename(command[0])
    runlog = RunLog()
    with Monitor(args.root) as monitor, Events(monitor, log=False, queue_size=0) as events:
        printer = VerbosePrinter(events) if args.verbose else None

        def collect(item: Any) -> None:
            runlog.add(item)
            if printer is not None:
                printer.offer(item)

        events.subscribe(collect)
        if recorder is not None:
            recorder.monitor = monitor  # this attempt's; the timeline goes on
            events.subscribe(recorder.event)
        elif args.plot or args.json or args.report:
            from .plot import Recorder

            recorder = Recorder(monitor)
            events.subscribe(recorder.event)
        host_kills_before = read_host_oom_kills(args.root)
        guarding = GuardThread(monitor, events, args, recorder, timed_saves) \
            if args.guard else None
        with SignalRelay() as relay, ShmSampler(args.root) as shm, \
                (guarding if guarding is not None else contextlib.nullcontext()), \
                (recorder if recorder is not None else contextlib.nullcontext()):
            saves_dir = make_saves_dir()
            try:
                try:
                    proc = subprocess.Popen(command, env=child_environment(
                        guarding, restart, saves_dir))
                except FileNotFoundError:
                    print(f"cgwatch run: {command[0]}: command not found", file=sys.stderr)
                    return 127
                except OSError as e:  # not executable, not a program, ...
                    print(f"cgwatch run: {command[0]}: {e.strerror or e}", file=sys.stderr)
                    return 126
                relay.started(proc)
                if guarding is not None:
                    guarding.start(proc, command)
                prefer_not_to_be_killed(args.root)
                returncode = proc.wait()
                ended_at = time.monotonic()
                saves = all_saved(read_records(saves_dir) if saves_dir else [])
            finally:
                if saves_dir:
                    shutil.rmtree(saves_dir, ignore_errors=True)
        events.scan_now()  # rises that landed after the last notification was read
        # run's status, decided once here (the picture's end mark and the report say it)
        status, saves_line = saved_status(
            guarded_status(returncode, guarding.fired if guarding else None,
                           guarding.signum if guarding else None), saves, name)
        if recorder is not None:
            recorder.mark("exit", end_label(returncode, status), final=True,
                          exit_status=exit_status(returncode))
        if printer is not None:
            printer.close()
        cause = find_cause(name, returncode, runlog, monitor, args.root, host_kills_before,
                           shm.peak)
    return _Ran(proc.pid, returncode, cause, runlog, shm, guarding, recorder, ended_at, saves,
                status, saves_line)


def make_saves_dir() -> Optional[str]:
    """A fresh directory for the ranks' save records (saves.py), or None where none can be
    made (an unwritable $TMPDIR): CMD then runs as before, its status passed on as it is."""
    try:
        return tempfile.mkdtemp(prefix="cgwatch-saves-")
    except OSError:
        return None


def child_environment(guarding: Optional[GuardThread], restart: int,
                      saves_dir: Optional[str] = None) -> Optional[dict[str, str]]:
    """CMD's environment: ours (None), with the guard's additions, CGWATCH_RESTART and
    CGWATCH_SAVES_DIR."""
    env = guarding.environment() if guarding is not None else None
    if restart:
        env = {**(env if env is not None else os.environ), RESTART_ENV: str(restart)}
    if saves_dir is not None:
        env = {**(env if env is not None else os.environ), SAVES_ENV: saves_dir}
    return env


def _report(args: argparse.Namespace, command: list[str], ran: _Ran) -> int:
    """Say why CMD ended (text or JSON, the report file, the plot); `run`'s exit status."""
    status, data, outcome, saves_line = _build_report(args, command, ran)
    if args.report:
        write_report(args.report, data)
    if args.plot and ran.recorder is not None:
        _plot(args.plot, ran.recorder, " ".join(command))
    if args.json:
        print(json.dumps(data), file=sys.stderr, flush=True)
        return status
    _say(outcome, saves_line, ran.cause)
    return status


def _build_report(args: argparse.Namespace, command: list[str],
                  ran: _Ran) -> tuple[int, dict[str, Any], Optional[dict[str, Any]], str]:
    """`run`'s exit status, the JSON report ({} unless --json or --report), what came of
    the guard's signal (None: it did not fire) and the line on the ranks' save records ("":
    none to say)."""
    guarding = ran.guarding
    fired = guarding.fired if guarding is not None else None
    status, saves_line = ran.status, ran.saves_line
    outcome = guarding.outcome(ran.returncode, ran.ended_at, ran.cause.report is not None
                               and ran.returncode < 0) if guarding is not None else None
    data: dict[str, Any] = {}
    if args.json or args.report:
        data = report_json(command, ran.pid, ran.returncode, ran.cause, ran.runlog,
                           ran.shm.peak, ran.shm.last)
        if guarding is not None:
            data["exit_status"] = status
            data["guard"] = None if fired is None or outcome is None else {
                **fired.as_dict(), "signal": signal_name(guarding.signum),
                "seconds_to_exit": outcome["seconds"], "saved": outcome["saved"],
                "checkpoint": outcome["checkpoint"], "outcome": outcome["line"]}
            data["learned"] = guarding.learned()
            if outcome is not None and "observe" in outcome:
                data["observe"] = outcome["observe"]  # --observe (observed.py)
        if ran.saves.expected:
            data["exit_status"] = status
            data["saves"] = {**ran.saves._asdict(), "complete": ran.saves.complete,
                             "line": saves_line}
        if ran.recorder is not None:
            data["timeline"] = ran.recorder.as_dict()
    return status, data, outcome, saves_line


def _say(outcome: Optional[dict[str, Any]], saves_line: str, cause: Cause) -> None:
    """The text report: what came of the guard's signal, what the ranks' save records
    made of the status, then why CMD ended."""
    if outcome is not None:
        print(outcome["line"], file=sys.stderr, flush=True)
    if saves_line:
        print(saves_line, file=sys.stderr, flush=True)
    for text in cause.texts():
        print(text, file=sys.stderr, flush=True)


def end_label(returncode: int, status: Optional[int] = None) -> str:
    """The picture's mark at CMD's end; `status`: run's, named when the guard made it 75."""
    label = f"killed by {signal_name(-returncode)}" if returncode < 0 else f"exit {returncode}"
    if status is not None and status != exit_status(returncode):
        label += f" (saved: {status})"
    return label


def _plot(path: str, recorder: Recorder, title: str, options: str = "") -> None:
    from .plot import write_plot

    why = write_plot(path, recorder.as_dict(), f"cgwatch run {options}-- {title}")
    if why is not None:
        print(f"cgwatch run: --plot: {why}", file=sys.stderr, flush=True)
