"""A training job stand-in for bench/save_campaign.py (run as a script, not imported).

    python bench/save_child.py --cgroup DIR --checkpoint PATH leak --rate MIB_S --save-seconds S
    python bench/save_child.py --cgroup DIR --checkpoint PATH sawtooth --seconds S --seed N

It first moves itself into DIR (cgroup.procs), so every page it touches is charged there.
- `leak`: a thread keeps `rate` MiB/s more (every 10 ms, written page by page), as a leaking
  DataLoader worker or a growing cache would: it does not pause while the job saves. The
  main loop is the training loop: a 10 ms step, then `Guard.check(step)`; when the guard
  says stop, the "save" writes PATH (fsync) and takes `save-seconds` in all, then renames it
  into place and exits 75. A kill before the rename leaves no checkpoint.
- `sawtooth`: a flat 64 MiB base, then allocate/free cycles (seeded random 40-120 MiB over
  0.5-3 s, freed at once, as a garbage collector or a batch allocator does) for `seconds`;
  the guard is checked every step and every change of its decision is counted (goal: 0
  stops).
Prints one JSON line with what happened.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MiB = 1 << 20
STEP = 0.010


def leak(args: argparse.Namespace) -> int:
    import cgwatch

    kept: list[bytes] = []
    stop = threading.Event()
    chunk = int(args.rate * MiB * STEP)

    def grow() -> None:
        due = time.monotonic()
        while not stop.is_set():
            kept.append(b"\x5a" * chunk)
            due += STEP
            time.sleep(max(0.0, due - time.monotonic()))

    guard = cgwatch.Guard(reserve="5%", checkpoint_seconds=args.save_seconds,
                          margin=args.margin, events=False)
    room = cgwatch.available_memory()  # before the leak: what it has to fill
    start = time.monotonic()
    threading.Thread(target=grow, daemon=True).start()
    step = 0
    while True:
        step += 1
        time.sleep(STEP)
        verdict = guard.check(step)
        if verdict.stop:
            fired = time.monotonic() - start
            begin = time.monotonic()
            with open(args.checkpoint + ".tmp", "w") as f:
                f.write(json.dumps({"step": step}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            time.sleep(max(0.0, args.save_seconds - (time.monotonic() - begin)))
            os.rename(args.checkpoint + ".tmp", args.checkpoint)
            print(json.dumps({"saved": True, "fired_at": fired, "step": step,
                              "trigger": verdict.trigger, "seconds_left": verdict.seconds_left,
                              "growth": verdict.growth, "headroom": verdict.headroom,
                              "room_at_start": room,
                              "save_took": time.monotonic() - begin}), flush=True)
            return cgwatch.GUARD_EXIT_STATUS
        if step == 1:
            # Said at once too: a run the kernel kills prints nothing at the end.
            print(json.dumps({"room_at_start": room}), flush=True)


def sawtooth(args: argparse.Namespace) -> int:
    import cgwatch

    rng = random.Random(args.seed)
    base = [b"\x5a" * MiB for _ in range(64)]
    guard = cgwatch.Guard(reserve="5%", checkpoint_seconds=args.save_seconds, events=False)
    stops: list[dict[str, object]] = []
    guard.subscribe(lambda v: stops.append(v.as_dict()) if v.stop else None)
    start = time.monotonic()
    step = cycles = 0
    while time.monotonic() - start < args.seconds:
        size, length = rng.randint(40, 120), rng.uniform(0.5, 3.0)
        per_step = max(1, int(size * MiB * STEP / length))
        heap: list[bytes] = []
        cycle_start = time.monotonic()
        while time.monotonic() - cycle_start < length:
            heap.append(b"\x5a" * per_step)
            step += 1
            time.sleep(STEP)
            guard.check(step)
        del heap  # freed at once: the sawtooth's drop
        cycles += 1
    print(json.dumps({"seconds": time.monotonic() - start, "steps": step, "cycles": cycles,
                      "base_mib": len(base), "stops": stops}), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cgroup", required=True)
    parser.add_argument("--checkpoint", default=os.devnull)
    parser.add_argument("--save-seconds", type=float, default=1.0)
    parser.add_argument("--margin", type=float, default=1.5, help="Guard(margin=)")
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("leak")
    p.add_argument("--rate", type=float, required=True)
    p = sub.add_parser("sawtooth")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    return leak(args) if args.mode == "leak" else sawtooth(args)


if __name__ == "__main__":
    sys.exit(main())
