"""A training job stand-in that leaks memory at a controlled rate, for the guard's real-kernel
tests (tests/test_guard_real.py, tests/test_cli_guard_real.py).

    python tests/leak_child.py --mode guard|none|signal --checkpoint PATH [--rate MIB_PER_S]
        [--signal SIGUSR1|SIGTERM] [--worker]

Every step (20 a second) keeps `rate / 20` MiB more, written byte by byte (bytearray
repetition writes every page: an allocation alone would only map the zero page). Modes:
- `guard`: `cgwatch.Guard.check(step)` after every step; when it says stop, the checkpoint
  is saved (timed with `guard.saving()`), the verdict's message printed to stderr and the
  process exits with cgwatch.GUARD_EXIT_STATUS.
- `signal`: no guard; `--signal` (SIGUSR1, what Lightning's Slurm integration saves on; or
  SIGTERM, what a script's own handler catches) makes it save at the end of the step and exit
  0, as under `cgwatch run --guard`.
- `none`: it leaks until the kernel kills it (the control case).
The checkpoint is a small JSON file: the step, and the verdict in guard mode.

`--worker`: the leak is a forked child's (a DataLoader worker's stand-in, in the same cgroup);
the main process only steps (and checks, or waits for the signal), and at its stop saves,
ends the worker with SIGKILL (as torch does a DataLoader's workers at shutdown) and reaps it.
Its stdout says `worker PID` after `started`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STEPS_PER_SECOND = 20
MiB = 1 << 20


def save(path: str, data: dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(path + ".tmp", path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("guard", "none", "signal"), required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--rate", type=float, default=8.0, help="MiB per second")
    parser.add_argument("--checkpoint-seconds", type=float, default=2.0)
    parser.add_argument("--signal", default="SIGUSR1", choices=("SIGUSR1", "SIGTERM"))
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    chunk = int(args.rate * MiB / STEPS_PER_SECOND)
    asked: list[int] = []
    if args.mode == "signal":
        signal.signal(getattr(signal, args.signal), lambda signum, frame: asked.append(signum))
    kept: list[bytes] = []
    print("started", flush=True)
    worker = 0
    if args.worker:
        # Forked before the guard exists, as a DataLoader forks its workers: no thread of
        # ours is copied into the worker.
        worker = os.fork()
        if worker == 0:  # the worker: leaks until it is ended (or the kernel kills it)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            while True:
                kept.append(b"\x5a" * chunk)
                time.sleep(1 / STEPS_PER_SECOND)
        print(f"worker {worker}", flush=True)
    guard = None
    if args.mode == "guard":
        import cgwatch

        guard = cgwatch.Guard(reserve="5%", checkpoint_seconds=args.checkpoint_seconds)
    try:
        return steps(args, guard, asked, kept, chunk)
    finally:
        if worker:
            os.kill(worker, signal.SIGKILL)
            os.waitpid(worker, 0)


def steps(args: argparse.Namespace, guard: Any, asked: list[int], kept: list[bytes],
          chunk: int) -> int:
    step = 0
    while True:
        step += 1
        if not args.worker:
            kept.append(b"\x5a" * chunk)
        if guard is not None:
            verdict = guard.check(step)
            if verdict.stop:
                with guard.saving():
                    save(args.checkpoint, {"step": step, "verdict": verdict.as_dict()})
                print(verdict.message(), file=sys.stderr, flush=True)
                import cgwatch

                return cgwatch.GUARD_EXIT_STATUS
        if asked:
            save(args.checkpoint, {"step": step, "signal": asked[0]})
            return 0
        time.sleep(1 / STEPS_PER_SECOND)


if __name__ == "__main__":
    sys.exit(main())
