"""The `cgwatch` command line: one parser for the table (show.py), `cgwatch watch` (watch.py)
and `cgwatch run -- CMD` (run.py), and the dispatch to them.

The subcommands' modules are imported only when one is run: the table does not load the
events layer.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Optional

from . import show

if TYPE_CHECKING:
    from ..alerts import Threshold


def _threshold(text: str) -> Threshold:
    from ..alerts import Threshold  # here: the table loads nothing of the events side

    try:
        return Threshold.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


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
        description="Show how much memory this process may really use: the memory limits on "
                    "the path from its cgroup to the top, and the headroom left.",
        epilog="More: `cgwatch watch` prints memory events as they happen; `cgwatch run -- "
               "CMD` runs CMD and explains an OOM kill (see --help of each).")
    # Not dest "json": watch's --json is another option, whose default would overwrite this
    # one's value; main rejects this one before a subcommand's name.
    top.add_argument("--json", action="store_true", dest="table_json",
                     help="print JSON (sizes in bytes)")
    # Not "command": that is run's CMD.
    subcommands = top.add_subparsers(dest="subcommand", metavar="{watch,run,serve}")

    watch = subcommands.add_parser(
        "watch", parents=[common], prog="cgwatch watch",
        help="the headroom now, then a line per memory event until Ctrl-C",
        description="Print the headroom now, then one line per memory event (OOM kills, limit "
                    "hits, ...) and per --below crossing, until Ctrl-C.")
    watch.add_argument("--json", action="store_true", help="print JSON lines (sizes in bytes)")
    watch.add_argument("--below", action="append", default=[], metavar="SIZE|PCT",
                       type=_threshold,
                       help="report when available memory drops below SIZE (512M, 2G, bytes) "
                            "or PCT of total memory (10%%), and when it recovers; repeatable")
    watch.add_argument("--all", action="store_true",
                       help="also print rises that only repeat the level below's (v2 counts a "
                            "kill at every ancestor)")
    watch.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                       help="how often what has no kernel notification is re-read (default 1)")

    run = subcommands.add_parser(
        "run", parents=[common], prog="cgwatch run",
        help="run CMD; explain an OOM kill",
        description="Run CMD in this cgroup; exit with its status; if the OOM killer struck "
                    "meanwhile, say which cgroup's limit was reached and what to do.")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="print memory events to stderr as they happen")
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
                       help="watch process PID's cgroup instead (exits when it does)")
    return {"": top, "watch": watch, "run": run, "serve": serve}


def main(argv: Optional[list[str]] = None) -> int:
    """The `cgwatch` command (argv: without the program name; None: sys.argv[1:])."""
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
    if name == "serve":
        from . import serve

        return serve.run_serve(args)
    return show.run_show(args.root, args.table_json)
