"""The `cgwatch` command line: one parser for the table (show.py), `cgwatch watch` (watch.py)
and `cgwatch run -- CMD` (run.py), and the dispatch to them.

The subcommands' modules are imported only when one is run: the table does not load the
events layer. A closed output pipe (`cgwatch --json | head -1`) ends the command quietly with
status 141 (Python's documented SIGPIPE advice: point stdout at /dev/null, exit).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from typing import TYPE_CHECKING, Optional

from .. import __version__
from . import show

if TYPE_CHECKING:
    from ..alerts import Threshold


def _threshold(text: str) -> Threshold:
    from ..alerts import Threshold  # here: the table loads nothing of the events side

    try:
        return Threshold.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (0 or less would spin a core; nan never ends)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def _signal(text: str) -> int:
    """A signal for --guard to send: a name (SIGUSR1, USR1, sigterm) or a number."""
    import signal

    name = text.strip().upper()
    if name.isascii() and name.isdigit():
        number = int(name)
        if number in set(signal.valid_signals()) and number != 0:
            return number
        raise argparse.ArgumentTypeError(f"not a signal number here: {text!r}")
    try:
        return int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
    except KeyError:
        raise argparse.ArgumentTypeError(f"not a signal name: {text!r} (give e.g. SIGUSR1 "
                                         "or SIGTERM)") from None


def _at_least(text: str, least: float, what: str, unit: str) -> float:
    """A finite number, `least` or more; the errors call it `what` and its `unit`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if not math.isfinite(value) or value < least:
        raise argparse.ArgumentTypeError(f"must be {least:g} or more{unit}: {text!r}")
    return value


def _checkpoint_seconds(text: str) -> float:
    """0 or more seconds (0: a save takes no time; the forecast then never fires)."""
    return _at_least(text, 0, "a number of seconds", " seconds")


def _margin(text: str) -> float:
    """A number 1 or more (the guard's margin: the lead is a save's time times it)."""
    return _at_least(text, 1, "a number", "")


def _count(text: str) -> int:
    """A whole number, 0 or more."""
    if not (text.strip().isascii() and text.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more: {text!r}")
    return int(text)


def _percent(text: str) -> float:
    """A fill level in percent, more than 0 and at most 100 (`90` or `90%`)."""
    stripped = text.strip()
    try:
        value = float(stripped[:-1] if stripped.endswith("%") else stripped)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 100: {text!r}")
    return value


SIZES_HELP = ("Sizes: a byte count (1048576) or a number with K, M, G or T; every spelling "
              "is a power of 1024: 512M = 512Mi = 512MiB = 512MB = 512 * 2**20 bytes (as "
              "docker --memory; unlike Kubernetes, M is not 10**6).")
EXIT_HELP = ("Exit status: 0 done; 1 error; 2 usage error; 141 the output pipe was closed "
             "(`| head`), as for a program killed by SIGPIPE. `cgwatch run`: CMD's own "
             "status, 128+N when a signal N ended it, 126 CMD not executable, 127 not found; "
             "with --guard, 75 (EX_TEMPFAIL: saved, may be resumed) when CMD exited 0 or 75 "
             "after the guard's signal; a CMD that died of the signal saved nothing: 128+N.")


def _paragraphs(*texts: str) -> str:
    """Help text kept as paragraphs (RawDescriptionHelpFormatter keeps these line breaks)."""
    return "\n\n".join(textwrap.fill(t, 78) for t in texts)


GUARD_HELP = ("--guard: while CMD runs, the memory guard (cgwatch.Guard) watches this "
              "cgroup, CMD's: when headroom falls below --reserve (plus 1.25 x the largest "
              "piece CMD took twice), when the working set is "
              "predicted to reach a limit sooner than a save takes ((--save-delay + "
              "--checkpoint-seconds) x 1.5), when another process of the cgroup is "
              "OOM-killed, or after 30 s of "
              "throttling above memory.high (v2), it says why on stderr and sends CMD "
              "--signal once (default SIGTERM; SIGUSR1 is what Lightning's Slurm support "
              "answers with a checkpoint). CMD should save on it and exit 0 (or 75): then "
              "`run` says where the save went (--checkpoint-dir) and exits 75; a CMD that "
              "dies of the signal had no handler and saved nothing, and `run` says so and "
              "exits 128+N. If the kill comes anyway it is explained as without --guard.")
RESTARTS_HELP = ("--restarts N: a run that would exit 75 (CMD saved after the guard's signal) "
                 "starts CMD again, same arguments and environment plus CGWATCH_RESTART=k, "
                 "after --restart-delay seconds doubled at each restart (at most 60), up to N "
                 "times; CMD resumes from its checkpoint. A stop at the same step as the "
                 "last one (the number in the saved checkpoint's name, --checkpoint-dir) is "
                 "not a leak a restart outruns: run says so and exits 75 without using the "
                 "rest. Any other status ends the run with it.")
REPLAY_HELP = _paragraphs(
    "Feed a guard's record (cgwatch run --guard --record FILE, or cgwatch.Guard(record=FILE)) "
    "to the guard's decision again. With no option: the live decisions, each checked (exit 1 "
    "if one differs). With options: where a guard with them would have stopped the job, and "
    "each would-be stop judged by what followed: false (the job went on), or needed (it was "
    "OOM-killed while the stop stood or within its lead), with the lead it had.")
COALESCE_HELP = ("Bursts are coalesced: the first rise of a counter at a level is printed at "
                 "once; further rises of it within 1 s make one line at the end of that second, "
                 "with the number of rises (`[37 rises in 1s]`).")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """The parser of each command: "" is `cgwatch` itself (the table), the others its
    subcommands, by name."""
    common = argparse.ArgumentParser(add_help=False)
    # A fake /proc + /sys tree, for the tests. Default SUPPRESS: a subcommand's parser would
    # otherwise write its default over a --root given before the subcommand's name (main
    # starts from root="/").
    common.add_argument("--root", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    top = argparse.ArgumentParser(
        prog="cgwatch", parents=[common],
        description=_paragraphs(
            "Show how much memory this process may really use: the memory limits on "
            "the path from its cgroup to the top, and the headroom left."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_paragraphs("More: `cgwatch watch` prints memory events as they happen; "
                           "`cgwatch run -- CMD` runs CMD and explains an OOM kill (see "
                           "--help of each). /dev/shm is shown when it is smaller than the "
                           "available memory.", SIZES_HELP, EXIT_HELP))
    top.add_argument("-V", "--version", action="version", version=f"cgwatch {__version__}")
    # Not dest "json": watch's --json is another option, whose default would overwrite this
    # one's value; main rejects this one before a subcommand's name.
    top.add_argument("--json", action="store_true", dest="table_json",
                     help="print JSON (sizes in bytes)")
    top.add_argument("--sample", type=_seconds, default=None, metavar="SECONDS",
                     help="first sample the levels for SECONDS (10 is a good start) and show "
                          "each limited level's working-set growth and the time until its "
                          "limit at that rate (without it: no history, no forecast)")
    # Not "command": that is run's CMD.
    # No metavar: argparse lists every registered subcommand in the usage line and --help.
    subcommands = top.add_subparsers(dest="subcommand", title="commands")

    watch = subcommands.add_parser(
        "watch", parents=[common], prog="cgwatch watch",
        help="the headroom now, then a line per memory event until Ctrl-C",
        description=_paragraphs(
            "Print the headroom now, then one line per memory event (OOM kills, limit "
            "hits, ...) and per --below crossing, until Ctrl-C or SIGTERM."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_paragraphs(COALESCE_HELP, SIZES_HELP, EXIT_HELP))
    watch.add_argument("--json", action="store_true", help="print JSON lines (sizes in bytes)")
    watch.add_argument("--below", action="append", default=[], metavar="SIZE|PCT",
                       type=_threshold,
                       help="report when available memory drops below SIZE (512Mi, 2G, bytes) "
                            "or PCT of total memory (10%%), and when it recovers; repeatable")
    watch.add_argument("--all", action="store_true",
                       help="also print rises that only repeat the level below's (v2 counts a "
                            "kill at every ancestor)")
    watch.add_argument("--interval", type=_seconds, default=1.0, metavar="SECONDS",
                       help="how often what has no kernel notification is re-read (default 1)")
    watch.add_argument("--shm-above", type=_percent, default=90.0, metavar="PCT",
                       help="warn when /dev/shm is fuller than PCT (default 90); a full "
                            "/dev/shm kills with SIGBUS")
    watch.add_argument("--plot", metavar="FILE",
                       help="at the end, draw memory over time to FILE (.png, .svg or .pdf), "
                            "sampled every --interval; needs cgwatch[plot] (matplotlib)")

    run = subcommands.add_parser(
        "run", parents=[common], prog="cgwatch run",
        help="run CMD; explain an OOM kill",
        description=_paragraphs(
            "Run CMD in this cgroup; exit with its status; if the OOM killer struck "
            "meanwhile, say which cgroup's limit was reached and what to do; if CMD "
            "died of SIGBUS while /dev/shm was full, say so. Once CMD runs, cgwatch "
            "lowers its own oom_score_adj to -500 (never raises it: a lower value "
            "found is kept; needs root) so the OOM killer takes CMD's processes "
            "before the watcher that explains the kill. It keeps counts and the "
            "first and last event per counter and level, not every event."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_paragraphs(GUARD_HELP, RESTARTS_HELP, COALESCE_HELP, SIZES_HELP, EXIT_HELP))
    run.add_argument("-v", "--verbose", action="store_true",
                     help="print memory events to stderr as they happen (bursts coalesced)")
    run.add_argument("--json", action="store_true",
                     help="the report as one JSON object on stderr instead of text, always "
                          "(also when nothing happened)")
    run.add_argument("--report", metavar="FILE",
                     help="also write the report as JSON to FILE, always")
    run.add_argument("--plot", metavar="FILE",
                     help="draw CMD's memory over time to FILE (.png, .svg or .pdf): usage, "
                          "working set, limits and memory.high per limited level, events, "
                          "the guard's signal, the end; needs cgwatch[plot] (matplotlib). "
                          "--json and --report get the same series as `timeline`")
    run.add_argument("--guard", action="store_true",
                     help="signal CMD to save and stop before the OOM killer strikes (below)")
    run.add_argument("--signal", type=_signal, default=None, metavar="SIGNAL",
                     help="what --guard sends CMD: SIGTERM (default), SIGUSR1, SIGINT, ...")
    run.add_argument("--reserve", type=_threshold, default=None, metavar="SIZE|PCT",
                     help="--guard: headroom to keep at every limited level, SIZE or PCT of "
                          "that level's limit (default 5%%)")
    run.add_argument("--checkpoint-seconds", type=_checkpoint_seconds, default=None,
                     metavar="SECONDS",
                     help="--guard: what CMD's save takes (default: CMD's working set at "
                          "100 MiB/s, at least 1 s)")
    run.add_argument("--save-delay", type=_checkpoint_seconds, default=None,
                     metavar="SECONDS",
                     help="--guard: how long CMD waits after the signal before it saves "
                          "(HF's TrainingArguments(enable_jit_checkpoint=True): 3, then its "
                          "next step); the guard's lead holds it: (it + the save) x 1.5")
    run.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                     help="--guard: where CMD saves (given to it as CGWATCH_CHECKPOINT_DIR): "
                          "the saves CMD writes there set the guard's lead, kept for the "
                          "next run in DIR/.cgwatch-guard.json; after a stop's save, the "
                          "newest entry of DIR is named")
    run.add_argument("--observe", action="store_true", default=None,
                     help="--guard: decide, but send nothing: each would-be stop is a line "
                          "when it comes, and is judged by what followed once CMD ended "
                          "(false, or needed and with what lead)")
    run.add_argument("--record", default=None, metavar="FILE",
                     help="--guard: write every input of the guard's decision to FILE, for "
                          "`cgwatch replay FILE`")
    run.add_argument("--restarts", type=_count, default=None, metavar="N",
                     help="--guard: start CMD again after a save, up to N times (below)")
    run.add_argument("--restart-delay", type=_checkpoint_seconds, default=None,
                     metavar="SECONDS", help="--restarts: the first wait, doubled at each "
                                             "restart (default 1)")
    # REMAINDER: everything from CMD on is CMD's, its options included.
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS]",
                     help="the command to run")

    serve = subcommands.add_parser(
        "serve", parents=[common], prog="cgwatch serve",
        help="serve Prometheus metrics (/metrics) until SIGTERM",
        description="Serve this process's (or --pid's) cgroup memory figures and the kernel's "
                    "memory event counters as Prometheus metrics on http://HOST:PORT/metrics, "
                    "until SIGTERM or SIGINT, or until the --pid process exits. Needs "
                    "cgwatch[prometheus].")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: loopback only)")
    serve.add_argument("--port", type=int, default=10109,
                       help="port (default 10109, outside the exporters' 9100-9999; 0: any)")
    serve.add_argument("--pid", type=int, default=None,
                       help="watch process PID's cgroup instead, through its own mount "
                            "namespace (/proc/PID/root) when it has another, e.g. from a "
                            "sidecar; exits when it does, and exits 1 at start if its cgroup "
                            "cannot be found")
    replay = subcommands.add_parser(
        "replay", parents=[common], prog="cgwatch replay", description=REPLAY_HELP,
        help="replay a guard's record: its live decisions, or where other options stop",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_paragraphs(SIZES_HELP))
    replay.add_argument("file", metavar="FILE", help="the record")
    replay.add_argument("--reserve", type=_threshold, default=None, metavar="SIZE|PCT",
                        help="replay with this reserve (as run --reserve)")
    replay.add_argument("--checkpoint-seconds", type=_checkpoint_seconds, default=None,
                        metavar="SECONDS", help="replay with this save time")
    replay.add_argument("--margin", type=_margin, default=None, metavar="X",
                        help="replay with this margin (the lead is a save's time x X)")
    replay.add_argument("--rise-margin", type=_checkpoint_seconds, default=None, metavar="X",
                        help="replay with this rise margin (0: no room for the largest rise)")
    replay.add_argument("--json", action="store_true", help="the replay as one JSON object")
    replay.add_argument("--plot", metavar="FILE",
                        help="draw the replay to FILE (.png, .svg, .pdf): working set and "
                             "limit, the would-be stops and their leads; needs cgwatch[plot]")
    return {"": top, "watch": watch, "run": run, "serve": serve, "replay": replay}


def main(argv: Optional[list[str]] = None) -> int:
    """The `cgwatch` command (argv: without the program name; None: sys.argv[1:])."""
    try:
        status = _dispatch(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe must be seen inside the try
    except BrokenPipeError:
        # https://docs.python.org/3/library/signal.html#note-on-sigpipe: the reader is gone;
        # stdout to /dev/null so the interpreter's final flush cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE: what a shell reports for `yes | head -1`'s yes
    return status


def _dispatch(argv: Optional[list[str]]) -> int:
    parsers = _parsers()
    args, extra = parsers[""].parse_known_args(argv, argparse.Namespace(root="/"))
    name = args.subcommand or ""
    if extra:
        # What parse_args would say, but from the parser of the command they were given to.
        parsers[name].error(f"unrecognized arguments: {' '.join(extra)}")
    if name and args.table_json:
        parsers[""].error(f"--json before {name!r}: the options of `cgwatch {name}` go after "
                          f"its name (see cgwatch {name} --help)")
    if name == "watch":
        from . import watch  # only the subcommands need the events layer

        return watch.run_watch(args)
    if name == "run":
        from . import run

        return run.run_command(args)
    if name == "replay":
        from . import replay

        return replay.run_replay(args)
    if name == "serve":
        from . import serve

        return serve.run_serve(args)
    if name and args.sample:
        parsers[""].error(f"--sample before {name!r}: it is an option of the table only")
    return show.run_show(args.root, args.table_json, args.sample)
