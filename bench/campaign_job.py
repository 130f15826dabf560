"""A job of bench/campaign.py (run as a script in its own memory cgroup, not imported).

    python bench/campaign_job.py --cgroup DIR --shape NAME --seed N --out FILE \
        --mode guard|signal|none [--learned] [--framework plain|hf|lightning] [--quick]

Its memory follows one shape of bench/campaign_shapes.py: every 10 ms step it allocates (bytes
written page by page) or frees pieces so that it holds the shape's target beyond what it had
once started. Modes:
- `guard`: the job's own loop calls `cgwatch.Guard().check(step)` (the documented defaults;
  `--learned`: first a real save timed with `guard.saving()`, as a job that saved once has);
  told to stop, it saves (timed with `guard.saving()`) and exits with the guard's status.
  With `--framework hf|lightning` the guard is the framework's `GuardCallback()`.
- `signal`: no guard of its own (run it under `cgwatch run --guard`): SIGTERM makes it save
  at the end of the step and exit 0.
- `none`: no guard: a leaking shape runs until the kernel kills it.
The save writes a small checkpoint (a state dict with torch, else 2 MiB), fsyncs it and
renames it into place. It writes FILE.start once started (its room, the shape's life) and
FILE at the end (what happened, when); a run the kernel kills has no FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import campaign_shapes as shapes  # noqa: E402

PIECE = 256 << 10  # the least piece allocated: each its own mmap (MALLOC_MMAP_THRESHOLD_)
CACHE_RATE = 40 * shapes.MiB  # the page-cache writer's bytes per second
CACHE_CHUNK = shapes.MiB  # ... written from one buffer of this size (write_cache: why)
CACHE_BYTES = memoryview(b"\xa5" * CACHE_CHUNK)


def write_json(path: str, data: dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def cgroup_figures(directory: str) -> tuple[int, int]:
    """(usage, limit) of the job's cgroup, v1 or v2."""
    def read(name: str) -> str:
        with open(os.path.join(directory, name)) as f:
            return f.read().strip()
    if os.path.exists(os.path.join(directory, "memory.limit_in_bytes")):
        return int(read("memory.usage_in_bytes")), int(read("memory.limit_in_bytes"))
    return int(read("memory.current")), int(read("memory.max"))


class Holder:
    """Pieces of written memory, adjusted to a target every step."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.held = 0

    def follow(self, target: float) -> None:
        while self.pieces and self.held - len(self.pieces[-1]) >= target:
            self.held -= len(self.pieces.pop())
        if self.pieces and self.held > target + 4 * PIECE:
            self.held -= len(self.pieces.pop())
        missing = int(target) - self.held
        if missing >= PIECE:
            self.pieces.append(b"\x5a" * missing)  # written: every page charged
            self.held += missing


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.shape = shapes.BY_NAME[args.shape]
        self.asked: Optional[float] = None  # when SIGTERM came (signal mode)
        self.t0 = 0.0
        self.save_fn: Optional[Callable[[str], None]] = None  # a framework's own save
        self.holder = Holder()
        self.target: shapes.Target = lambda t: 0.0
        self.cache_file: Any = None
        self.cache_written = 0
        self.worker = 0
        self.result: dict[str, Any] = {"shape": args.shape, "mode": args.mode,
                                       "learned": args.learned, "framework": args.framework}

    # ---- the shape ----------------------------------------------------------------------------

    def begin(self) -> None:
        usage, limit = cgroup_figures(self.args.cgroup)
        room = limit - usage
        # A framework's job is a sized fraction of what is left once it is loaded (its own
        # hundreds of MiB come first); a plain job's shape is a fraction of the limit.
        scale = room if self.args.framework != "plain" else limit
        seconds = self.shape.seconds
        if self.args.quick and not self.shape.leaks:
            seconds = min(seconds, 20.0)
        if self.args.quick and self.shape.leaks:
            seconds = min(seconds, 25.0)
        rng = random.Random(self.args.seed)
        self.target = self.shape.make(rng, scale, room, seconds)
        life = shapes.life_of(self.target, room, seconds * 3) if self.shape.leaks else None
        ceiling = shapes.ceiling_of(self.target, room, int(limit * shapes.RESERVE_SHARE),
                                    seconds * 3) if self.shape.leaks else None
        self.result.update(limit=limit, usage_at_start=usage, room=room, seconds=seconds,
                           life=life, ceiling=ceiling)
        write_json(self.args.out + ".start", dict(self.result, t0_wall=time.time()))
        if self.shape.kind == "worker":
            self.start_worker()
        if self.shape.kind == "cache":
            os.makedirs(self.args.workdir, exist_ok=True)
        self.t0 = time.monotonic()

    def start_worker(self) -> None:
        parent = os.getpid()
        t0 = time.monotonic()
        pid = os.fork()
        if pid:
            self.worker = pid
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        holder = Holder()
        while os.getppid() == parent:  # the worker leaks until its job ends
            holder.follow(self.target(time.monotonic() - t0))
            time.sleep(shapes.TICK)
        os._exit(0)

    def tick(self) -> float:
        t = time.monotonic() - self.t0
        if self.shape.kind != "worker":
            self.holder.follow(self.target(t))
        if self.shape.kind == "cache":
            self.write_cache(t)
        return t

    def write_cache(self, t: float) -> None:
        due = int(CACHE_RATE * t) - self.cache_written
        if due <= 0:
            return
        if self.cache_file is None or self.cache_written % (64 * shapes.MiB) < due:
            if self.cache_file is not None:
                self.cache_file.close()
            name = os.path.join(self.args.workdir, f"cache-{self.cache_written}")
            self.cache_file = open(name, "wb")  # noqa: SIM115 - kept open across steps
        # From one 1 MiB buffer: a step that comes late (the VM's emulation: steps of 1-3 s)
        # catches up without holding its whole due, 40-120 MiB, as anonymous memory beside
        # the page cache this shape is about (in the VM, 3 of 3 such runs were OOM-killed).
        for offset in range(0, due, CACHE_CHUNK):
            self.cache_file.write(CACHE_BYTES[:min(CACHE_CHUNK, due - offset)])
        self.cache_written += due

    def done(self, t: float) -> bool:
        if not self.shape.leaks:
            return bool(t >= self.result["seconds"])
        # A leak the kernel never killed (the shape was mis-sized): end, say so.
        return bool(t >= 3 * self.result["seconds"] + 60)

    # ---- saving and the end -------------------------------------------------------------------

    def save(self) -> float:
        began = time.monotonic()
        path = self.args.checkpoint
        if self.save_fn is not None:
            self.save_fn(path + ".tmp")
        else:
            with open(path + ".tmp", "wb") as f:
                f.write(b"\x01" * (2 * shapes.MiB))
                f.flush()
                os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        return time.monotonic() - began

    def finish(self, outcome: str, status: int, **extra: Any) -> int:
        if self.worker:
            os.kill(self.worker, signal.SIGKILL)
            os.waitpid(self.worker, 0)
        self.result.update(outcome=outcome, ended_at=time.monotonic() - self.t0, **extra)
        write_json(self.args.out, self.result)
        return status


def verdict_fields(verdict: Any) -> dict[str, Any]:
    try:
        return {"verdict": verdict.as_dict(), "message": verdict.message()}
    except Exception as e:  # noqa: BLE001 - a record of the run must not fail it
        return {"verdict": repr(verdict), "message": repr(e)}


def recorded(job: Job) -> dict[str, Any]:
    """The guard's one option beyond the defaults: `record=` the file the campaign replays
    (bench/campaign.py: each run's decisions checked against the live ones); it changes no
    decision."""
    return {"record": job.args.record} if job.args.record else {}


def run_plain(job: Job) -> int:
    guard = None
    if job.args.mode == "guard":
        import cgwatch

        guard = cgwatch.Guard(**recorded(job))  # the documented defaults
        if job.args.learned:
            with guard.saving():
                job.save()
            os.remove(job.args.checkpoint)
    job.begin()
    step = 0
    due = time.monotonic()
    while True:
        step += 1
        t = job.tick()
        due += shapes.TICK
        time.sleep(max(0.0, due - time.monotonic()))
        if guard is not None:
            verdict = guard.check(step)
            if verdict.stop:
                stop_at = time.monotonic() - job.t0
                with guard.saving():
                    took = job.save()
                return job.finish("stopped", 75, stop_at=stop_at, save_seconds=took,
                                  step=step, **verdict_fields(verdict))
        if job.asked is not None:
            took = job.save()
            return job.finish("signalled", 0, stop_at=job.asked - job.t0, save_seconds=took,
                              step=step)
        if job.worker and os.waitpid(job.worker, os.WNOHANG)[0]:
            # A DataLoader's main process raises once a worker died: so does this job.
            job.worker = 0
            return job.finish("worker died", 1, step=step)
        if job.done(t):
            return job.finish("finished" if not job.shape.leaks else "outlived", 0, step=step)


# ---- real frameworks: a tiny model built here (nothing downloaded), random data -------------

SAMPLES, BATCH = 800, 8


def mlp() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(),
                               torch.nn.Linear(256, 1))


def framework_tick(job: Job) -> None:
    """In every step, before the guard's check (a callback ahead of GuardCallback): follow
    the shape at a real step's pace. A real job's leak is in its step (forward, backward, a
    cache), which the check at the step's end sees; a shape followed after the check (this
    job before) put each step's whole allocation past the check that should have seen it."""
    job.tick()
    time.sleep(shapes.TICK)


def framework_step(job: Job, guard_cb: Any) -> str:
    """After the guard's check (a callback behind GuardCallback): say what next: ""
    (go on), "stop" (training should end: the shape's time is over or SIGTERM saved)."""
    t = time.monotonic() - job.t0
    if guard_cb is not None and guard_cb.stopped is not None and "stop_at" not in job.result:
        job.result["stop_at"] = t
        job.result.update(verdict_fields(guard_cb.stopped))
    if job.asked is not None:
        took = job.save()
        job.finish("signalled", 0, stop_at=job.asked - job.t0, save_seconds=took)
        os._exit(0)
    return "stop" if job.done(t) else ""


def run_hf(job: Job) -> int:
    import torch
    import transformers
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from cgwatch.integrations.transformers import GuardCallback

    ids = torch.randint(0, 1000, (SAMPLES, 32), generator=torch.Generator().manual_seed(1234))

    class Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return SAMPLES

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": ids[i], "labels": ids[i]}

    guard = GuardCallback(**recorded(job)) if job.args.mode == "guard" else None

    class Shaper(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            framework_tick(job)

    class Pacer(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if framework_step(job, guard):
                control.should_training_stop = True

    transformers.set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=32, bos_token_id=0,
        eos_token_id=0))
    job.save_fn = lambda path: torch.save(model.state_dict(), path)
    args = TrainingArguments(
        output_dir=os.path.join(job.args.workdir, "hf"), max_steps=10**6,
        per_device_train_batch_size=BATCH, learning_rate=1e-3, use_cpu=True, report_to=[],
        save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0,
        dataloader_num_workers=0)
    callbacks: list[Any] = [Shaper()] + ([guard] if guard is not None else []) + [Pacer()]
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)
    job.begin()
    trainer.train()
    return framework_end(job, guard)


def framework_end(job: Job, guard: Any) -> int:
    if guard is not None and guard.stopped is not None:
        # The callback's own save (the framework's checkpoint) is done once train()/fit()
        # has returned: the stop's save completed here.
        return job.finish("stopped", 75, saved_at=time.monotonic() - job.t0)
    return job.finish("finished" if not job.shape.leaks else "outlived", 0)


def run_lightning(job: Job) -> int:
    import lightning as L
    import torch

    from cgwatch.integrations.lightning import GuardCallback

    gen = torch.Generator().manual_seed(1234)
    x, y = torch.randn(SAMPLES, 32, generator=gen), torch.randn(SAMPLES, 1, generator=gen)

    class Module(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            xb, yb = batch
            return torch.nn.functional.mse_loss(self.net(xb), yb)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    guard = GuardCallback(dirpath=os.path.join(job.args.workdir, "lightning"),
                          **recorded(job)) if job.args.mode == "guard" else None

    class Shaper(L.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            framework_tick(job)

    class Pacer(L.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if framework_step(job, guard):
                trainer.should_stop = True

    module = Module()
    job.save_fn = lambda path: torch.save(module.state_dict(), path)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=BATCH, shuffle=True)
    callbacks: list[Any] = [Shaper()] + ([guard] if guard is not None else []) + [Pacer()]
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=10**6, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        default_root_dir=os.path.join(job.args.workdir, "lightning"),
                        callbacks=callbacks)
    job.begin()
    trainer.fit(module, loader)
    return framework_end(job, guard)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cgroup", required=True)
    parser.add_argument("--shape", required=True, choices=sorted(shapes.BY_NAME))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--mode", choices=("guard", "signal", "none"), required=True)
    parser.add_argument("--learned", action="store_true")
    parser.add_argument("--record", default="", help="the guard records its checks here")
    parser.add_argument("--framework", choices=("plain", "hf", "lightning"), default="plain")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    args.checkpoint = os.path.join(args.workdir, "checkpoint")
    os.makedirs(args.workdir, exist_ok=True)
    job = Job(args)
    if args.mode == "signal":
        def asked(signum: int, frame: Any) -> None:
            if job.asked is None:
                job.asked = time.monotonic()
        signal.signal(signal.SIGTERM, asked)
    runner = {"plain": run_plain, "hf": run_hf, "lightning": run_lightning}[args.framework]
    return runner(job)


if __name__ == "__main__":
    sys.exit(main())
