"""A training job stand-in whose memory takes one shape, for the guard's real-kernel tests
(tests/test_guard_real.py, tests/v2/test_v2_guard.py): a `cgwatch.Guard` with the documented
defaults checks after every step, as in a training loop. The shape follows the steps, 20 to
a second of its own time (t = step / 20), as a training job's allocations follow its steps:
a loaded machine makes it slower, not lumpier (a time-driven shape took 8 of its pieces in
one step when a step stalled 0.4 s, and the guard rightly learned an 82 MiB piece).

    python tests/shape_child.py --shape SHAPE --limit BYTES --seconds S --checkpoint PATH

Shapes, in shares of `--limit` (the cgroup's), on top of the interpreter's own pages:
- `sawtooth`: from 20% to 60% in 10 pieces, freed at once; `--period` seconds a cycle (0.5).
- `step`: one piece of 25% after 2 s, then flat.
- `ramp`: 40% over the first 3 s (imports, a model load), then flat.
- `stairs`: a piece of `--stair` (share) every second, until stopped or killed.
- `leak`: `--rate` MiB/s, until stopped or killed.
Near the limit (issue 32's rows; the interpreter adds ~5 % of 512 MiB):
- `saw90`: from 25 % to 85 % in 10 pieces over 2 s (or `--period`), freed at once.
- `saw80`: from 20 % toward 82 % over 0.5 s (its 10 steps reach 76 %), freed at once.
- `peak90`: 30 %, and 85 % for the first 0.25 s of every second (a forward pass's peak).
- `warm85`: 80 % at an even pace over the first 10 s (a cache warming), then flat.
- `first90`: 85 % at the first step (a model load), then flat.
`--no-guard`: the shape alone, for `cgwatch run --guard` to watch from outside.
Every page is written (bytearray repetition), so it is charged at once. On a stop the
checkpoint (a small JSON file: the step, the verdict, the save's seconds) is saved inside
`guard.saving()` and the process exits 75; if the shape ends without a stop it prints "done"
and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STEPS_PER_SECOND = 20
MiB = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", required=True,
                        choices=("sawtooth", "step", "ramp", "stairs", "leak", "saw90",
                                 "saw80", "peak90", "warm85", "first90"))
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--period", type=float, default=None)
    parser.add_argument("--stair", type=float, default=0.15)
    parser.add_argument("--rate", type=float, default=8.0)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--no-guard", action="store_true")
    args = parser.parse_args()
    import cgwatch

    limit = args.limit
    guard = None if args.no_guard else cgwatch.Guard()  # the documented defaults
    kept: list[bytes] = []
    step = 0
    print("started", flush=True)
    while True:
        step += 1
        t = step / STEPS_PER_SECOND
        if t >= args.seconds:
            print("done", flush=True)
            return 0
        want = target(args, limit, t)
        have = sum(len(b) for b in kept)
        if want > have:
            kept.append(b"\x5a" * (want - have))
        elif want < have:
            kept.clear()
            if want:
                kept.append(b"\x5a" * want)
        verdict = guard.check(step) if guard is not None else None
        if verdict is not None and verdict.stop:
            started = time.monotonic()
            with guard.saving():
                path = args.checkpoint
                with open(path + ".tmp", "w") as f:
                    json.dump({"step": step, "t": t, "verdict": verdict.as_dict(),
                               "held": sum(len(b) for b in kept)}, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(path + ".tmp", path)
            print(f"{verdict.message()} (saved in {time.monotonic() - started:.2f} s)",
                  file=sys.stderr, flush=True)
            return cgwatch.GUARD_EXIT_STATUS
        time.sleep(1 / STEPS_PER_SECOND)


def target(args: argparse.Namespace, limit: int, t: float) -> int:
    """The bytes the shape holds at `t` seconds."""
    if args.shape == "sawtooth":
        period = args.period or 0.5
        phase = (t % period) / period
        return int(limit * (0.20 + 0.40 * min(1.0, int(phase * 11) / 10)))
    if args.shape == "step":
        return int(limit * 0.25) if t >= 2.0 else 0
    if args.shape == "ramp":
        return int(limit * 0.40 * min(1.0, t / 3.0))
    if args.shape == "stairs":
        return int(limit * args.stair) * (1 + int(t))
    if args.shape in ("saw90", "saw80"):
        low, high, period = (0.25, 0.85, 2.0) if args.shape == "saw90" else (0.20, 0.82, 0.5)
        period = args.period or period
        phase = (t % period) / period
        return int(limit * (low + (high - low) * min(1.0, int(phase * 11) / 10)))
    if args.shape == "peak90":
        return int(limit * (0.85 if t % 1.0 < 0.25 else 0.30))
    if args.shape == "warm85":
        return int(limit * 0.80 * min(1.0, t / 10.0))
    if args.shape == "first90":
        return int(limit * 0.85)
    return int(args.rate * MiB * t)  # leak


if __name__ == "__main__":
    sys.exit(main())
