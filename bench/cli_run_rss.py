"""`cgwatch run`'s RSS around a job that lives at its memory limit (issue 11): a real v1 (or
v2) cgroup below ours, limited to 48 MiB, where `dd` rewrites a 128 MiB file over and over,
so the limit is hit all the time (page cache is reclaimed; failcnt / `max` rise) and nothing
is killed. The watcher's poll interval is forced down (`--poll`) so a minute stands for hours
of a v2 job's ~50 `max` events a second. RSS of `cgwatch run` is read from /proc at the start
and at the end.

    .venv/bin/python -m bench.cli_run_rss [--tree DIR] [--seconds 60] [--poll 0.001]

`--tree`: a source tree of cgwatch to measure (default: this one), e.g. an older commit
unpacked with `git archive`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from bench.cgroups import MiB, cgroup_tree, read

# READY_FD (optional): a pipe the driver writes "ready" to once `cgwatch run` has made its
# Events, i.e. after its imports and start-up: a test samples RSS from there, not after a
# fixed sleep that a loaded, emulated machine can outlast.
DRIVER = """
import os, sys
sys.path.insert(0, {tree!r})
import cgwatch.events as events
original = events.Events.__init__
def forced(self, *args, **kw):
    kw["poll_interval"] = {poll!r}
    original(self, *args, **kw)
    ready = os.environ.pop("READY_FD", None)
    if ready:
        os.write(int(ready), b"ready\\n")
        os.close(int(ready))
events.Events.__init__ = forced
from cgwatch.cli import main
sys.exit(main(["run", "--", "timeout", "{seconds}", "sh", "-c",
               "while :; do dd if=/dev/zero of={scratch} bs=1M count=128 status=none; done"]))
"""


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A /proc/PID/status size in KiB: VmRSS, or RssAnon (the heap and other private
    memory: what keeping every event grew; Linux 4.5+)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--poll", type=float, default=0.001)
    args = parser.parse_args()
    scratch = f"/var/tmp/cgwatch-rss-{os.getpid()}"
    with cgroup_tree() as tree:
        job = tree.make("job", limit=48 * MiB)
        counter = "memory.failcnt" if tree.version == 1 else "memory.events"
        proc = tree.spawn(job, DRIVER.format(tree=os.path.abspath(args.tree), poll=args.poll,
                                             seconds=args.seconds, scratch=scratch),
                          stdout=subprocess.DEVNULL)
        try:
            time.sleep(3)
            before, counted_before = rss_kib(proc.pid), read(os.path.join(job, counter))
            time.sleep(args.seconds - 4)
            after, counted_after = rss_kib(proc.pid), read(os.path.join(job, counter))
            proc.wait(timeout=30)
        finally:
            if os.path.exists(scratch):
                os.unlink(scratch)
    def count(text: str) -> str:  # v1 failcnt; v2 the `max` line of memory.events
        return text.split()[-1] if tree.version == 1 else \
            text.split("max ", 1)[1].split()[0]

    print(f"tree {args.tree}: poll {args.poll}s, {args.seconds}s: RSS {before} -> {after} KiB "
          f"(+{after - before}); {counter} {count(counted_before)} -> {count(counted_after)}; "
          f"exit {proc.returncode}")

if __name__ == "__main__":
    sys.exit(main())
