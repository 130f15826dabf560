"""A training job stand-in that resumes from its checkpoint, for `cgwatch run --guard
--restarts N`'s real-kernel test (tests/test_cli_restarts_real.py) and the pattern
docs/never-lose-a-job.md shows. Plain Python, no cgwatch inside.

    python tests/restart_job.py --dir DIR --steps N [--step-seconds S] [--leak-mib M]
        [--need-at STEP --need-mib M] [--save-at STEP,... --save-mib M --save-seconds S]
        [--log FILE]

The model: a linear regression fitted by SGD on samples drawn from its own random.Random;
each step logs its loss. The state is the step, the RNG's state, the weights and the losses:
a run resumed from a checkpoint computes the same losses, bit for bit, as one that never
stopped.
- On start it loads the checkpoint with the highest step in DIR (`step-000120.json`: the
  step in the name is how `run --restarts` tells progress) and prints `resumed at step K`
  (or `started`), and `restart K` when CGWATCH_RESTART is set.
- SIGTERM sets a flag; the job saves at the end of the step (or at once while it is
  gathering `--need-mib`) and exits 0: the save is at the stop, so nothing is redone.
- `--leak-mib M`: every step keeps M MiB more, written page by page (bytes repetition writes
  every page: an allocation alone maps the zero page). The leak restarts with the process.
- `--need-at K --need-mib M`: from step K on, the step needs M MiB held (gathered 0.4 MiB
  every 0.05 s, 8 MiB/s) before it can run: a steady state that does not fit a smaller limit,
  which no restart outruns.
- `--save-at K,...`: a periodic checkpoint at the end of step K (as a training loop's
  save_steps): `step-K.json`, then `payload-K.bin`, `--save-mib` MiB written in 16 pieces
  over `--save-seconds` seconds (a checkpoint's big files, the optimizer's state, say: what
  `run --guard --checkpoint-dir` learns a save's time from).
- `--log FILE`: one line `attempt step loss` per step done, appended (attempt: the restart
  number, 0 first), to count redone steps.
At the end it saves a last checkpoint (`step-N.json`, the losses complete) and prints `done`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from typing import Any, Optional, TextIO

MiB = 1 << 20
DIMENSION = 8
RATE = 0.01
stop = False


def on_sigterm(signum: int, frame: object) -> None:
    global stop
    stop = True


def newest(directory: str) -> Optional[str]:
    steps = [(int(name[5:11]), name) for name in os.listdir(directory)
             if name.startswith("step-") and name.endswith(".json")]
    return os.path.join(directory, max(steps)[1]) if steps else None


def fresh() -> dict[str, Any]:
    rng = random.Random(1234)
    return {"step": 0, "weights": [0.0] * DIMENSION, "losses": [],
            "truth": [rng.uniform(-1, 1) for _ in range(DIMENSION)],
            "rng": _state(rng)}


def _state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def save(directory: str, state: dict[str, Any]) -> None:
    path = os.path.join(directory, f"step-{state['step']:06d}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(path + ".tmp", path)


def train_step(state: dict[str, Any], rng: random.Random) -> float:
    """One SGD step on a fresh sample; the loss before the update."""
    x = [rng.gauss(0.0, 1.0) for _ in range(DIMENSION)]
    target = sum(t * v for t, v in zip(state["truth"], x)) + rng.gauss(0.0, 0.1)
    error = sum(w * v for w, v in zip(state["weights"], x)) - target
    state["weights"] = [w - RATE * 2 * error * v for w, v in zip(state["weights"], x)]
    return error * error


def gather(need: int, held: list[bytes]) -> bool:
    """Hold `need` bytes in `held`; False when SIGTERM came first."""
    while sum(len(b) for b in held) < need:
        if stop:
            return False
        held.append(b"\x01" * (MiB * 2 // 5))
        time.sleep(0.05)
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--leak-mib", type=float, default=0.0)
    parser.add_argument("--need-at", type=int, default=-1)
    parser.add_argument("--need-mib", type=float, default=0.0)
    parser.add_argument("--save-at", type=lambda text: {int(k) for k in text.split(",")},
                        default=set())
    parser.add_argument("--save-mib", type=float, default=8.0)
    parser.add_argument("--save-seconds", type=float, default=0.0)
    parser.add_argument("--log", default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)
    attempt = int(os.environ.get("CGWATCH_RESTART", "0"))
    found = newest(args.dir)
    if found is None:
        state = fresh()
        print("started", flush=True)
    else:
        with open(found) as f:
            state = json.load(f)
        print(f"resumed at step {state['step']}", flush=True)
    if attempt:
        print(f"restart {attempt}", flush=True)
    version, internal, gauss = state["rng"]
    rng = random.Random()
    rng.setstate((version, tuple(internal), gauss))
    with open(args.log or os.devnull, "a") as log:
        train(args, state, rng, attempt, log)
    save(args.dir, state)
    print("saved" if stop else "done", state["step"], flush=True)
    return 0


def train(args: argparse.Namespace, state: dict[str, Any], rng: random.Random, attempt: int,
          log: TextIO) -> None:
    """Steps until the last, or until SIGTERM (at the end of a step, or while gathering)."""
    leaked: list[bytes] = []
    held: list[bytes] = []
    while state["step"] < args.steps and not stop:
        if 0 <= args.need_at <= state["step"] and not gather(int(args.need_mib * MiB), held):
            break
        loss = train_step(state, rng)
        state["losses"].append(loss)
        state["rng"] = _state(rng)
        log.write(f"{attempt} {state['step']} {loss!r}\n")
        log.flush()
        state["step"] += 1
        if args.leak_mib:
            leaked.append(b"\x01" * int(args.leak_mib * MiB))
        if state["step"] in args.save_at:
            save(args.dir, state)
            write_payload(os.path.join(args.dir, f"payload-{state['step']:06d}.bin"),
                          int(args.save_mib * MiB), args.save_seconds)
        time.sleep(args.step_seconds)


def write_payload(path: str, size: int, seconds: float) -> None:
    """`size` bytes in 16 pieces over `seconds` (a checkpoint's big file written)."""
    with open(path, "wb") as f:
        for k in range(16):
            if k:
                time.sleep(seconds / 15)
            f.write(b"\x02" * (size // 16))
            f.flush()


if __name__ == "__main__":
    sys.exit(main())
