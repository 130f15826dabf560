"""A tiny training job per framework, with a leak at a controlled rate and cgwatch's guard;
run by tests/integration/test_guard_training.py and test_guard_ranks_trainers.py in
memory-limited cgroups.

    python guarded_train.py FRAMEWORK MODE STEPS OUT [LEAK_MIB | SHAPE_MIB]

FRAMEWORK: plain (a PyTorch loop with DDP; run it as two ranks), hf (transformers' Trainer
with cgwatch.integrations.transformers.GuardCallback), lightning (with
cgwatch.integrations.lightning.GuardCallback and torchdata's StatefulDataLoader), deepspeed
(ZeRO-2 on the CPU accelerator with cgwatch.integrations.deepspeed_guard.guard_step).
MODE: guard (leak + guard: saves and exits with the guard's status), onerank (plain only,
no leak: the last rank's guard has a reserve above any limit, the others none), onecgroup
(hf, lightning, deepspeed as two ranks: leak + guard, the leak and a limited cgroup on one
rank only, below), control (leak, no guard: the kernel kills it), reference (no leak, no
guard, STEPS steps), resume (from the checkpoint the guard run wrote, up to STEPS), requeue
(hf only, one life of a job that `cgwatch run --guard -- torchrun` guards and a scheduler
requeues: leak, no guard of its own, resume from the newest checkpoint when there is one; on
SIGTERM every rank agrees at the end of the step, the Trainer saves there, and each rank
exits 0; its results go to requeue<L>-rank<r>.json, L being $SLURM_RESTART_COUNT or 0: the
Slurm tier's tests/slurm/cases_requeue.py), and the
healthy shapes (hf and lightning, no leak, the adapter's GuardCallback() with its documented
defaults, STEPS steps, then the framework's own checkpoint, whose size on disk and the
guard's estimate of it go to the result): sawtooth (a temporary of SHAPE_MIB MiB, written at every
SAW_PERIOD-th step, kept for half the period, then freed) and step (SHAPE_MIB MiB written
at step STEP_AT and kept to the end: a plateau). Every
step's loss, the guard's verdict and the checkpoint go to OUT/<mode>-rank<r>.json before the
process exits. The models are built here (nothing is downloaded); the data are seeded random
numbers.

The evaluation modes (hf, lightning; tests/integration/test_guard_evaluation.py): an
evaluation every EVAL_AT steps that gathers its predictions, ~8 MiB a batch of EVAL_BATCH,
SHAPE_MIB MiB in all (HF: the Trainer's own gathering of the logits for its
`compute_metrics`, kept per batch, `eval_do_concat_batches=False`; Lightning: the documented
`validation_step_outputs` list, cleared at the epoch's end), with the adapter's
GuardCallback() and its documented defaults: evalguard (the evaluation gathers past the
limit), evalresume (evalguard's job resumed from the newest checkpoint), evalreference (the
same job, no guard), evalspike (a healthy evaluation, near the limit), evalonecgroup (hf as
two ranks, rank 1 alone in a limited cgroup as in onecgroup, with a reserve for its late
agreement, GUARD_RANKS_EVAL; $GUARDTEST_EVAL_MIB, when set, replaces SHAPE_MIB). The HF model
has dropout there, so that the resume is exact only if the RNG states saved in the
evaluation are the ones an uninterrupted run trains on after it. The result also counts the
evaluation batches seen (`eval_batches`) and the process's highest RSS (`max_rss_kib`).

The leak is LEAK_MIB MiB of written bytes after every step (a calloc'ed zero buffer may not
be charged), on the last rank only; in onecgroup mode on rank $GUARDTEST_CGROUP_RANK only,
which first moves itself into the cgroup directory $GUARDTEST_CGROUP when that is set (before
importing anything big, so all it allocates is charged there; unset, it stays where it is:
the Slurm tier's two-node case, where only that rank's node's step cgroup fills) and writes
$GUARDTEST_BALLAST_MIB MiB there before its first step. onecgroup ranks each send their output
to OUT/onecgroup-rank<r>.log (a launcher's streams are shared). The
rank is $RANK (torchrun) or $LOCAL_RANK (Lightning's own launcher sets only that); the world
size $WORLD_SIZE, or $GUARDTEST_WORLD where nothing sets it yet (Lightning's first process).
Each rank's exit status also goes to OUT/<mode>-rank<r>.status as it starts to leave.
Two faults for tests/integration/test_launcher_exit_75.py: rank $GUARDTEST_KILL_AT_SAVE
(hf) SIGKILLs itself at the guard's save, in a callback that runs before GuardCallback's
`on_save`, once rank 0 recorded its save (its part written, its record of the save not: a
rank killed mid-save); and rank
0 lingers $GUARDTEST_LINGER_RANK0 seconds before it leaves (Lightning's launcher meanwhile
sees rank 1's 75).
In the healthy shapes, the highest usage of $GUARDTEST_USAGE (a cgroup's usage file) read
while the shape is at its top goes to the result as `peak_usage`: what the test's limit
leaves free at the job's highest.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

STEP_SECONDS = 0.01  # each step also sleeps this: a step of a real job, not only a memset
BATCH = 8
SAMPLES = 800
GUARD = {"reserve": "12%", "checkpoint_seconds": 1.0, "interval": 0.2}
# evalonecgroup: rank 1 gathers 16 MiB a batch (both ranks' predictions) and the ranks agree
# every 10th check: the reserve holds the 9 batches a stop can come late (144 MiB).
GUARD_RANKS_EVAL = {"reserve": "25%", "checkpoint_seconds": 1.0, "interval": 0.2}
SYNC_EVERY = 2  # the plain loop's two ranks agree every other step
HEALTHY = ("sawtooth", "step")  # modes with the adapters' documented defaults and no leak
EVAL = ("evalguard", "evalresume", "evalreference", "evalspike", "evalonecgroup")
EVAL_AT = 20  # the evaluation modes evaluate after steps 20, 40, ...
EVAL_BATCH = 64  # HF: 64 x 32 tokens x 1000 logits x 4 bytes = 8 MiB gathered a batch
PREDICTION_WIDTH = 32768  # Lightning: 64 x 32768 x 4 bytes = 8 MiB kept a batch
RANKED = ("onecgroup", "evalonecgroup")  # each rank its own log; one rank in a cgroup
SAW_PERIOD = 6  # sawtooth: the temporary is written at step 1, 7, 13, ... and freed 3 later
STEP_AT = 3  # step: the allocation kept from this step on

_leaked: list[bytes] = []
_sigterm = [0]  # requeue mode: set by SIGTERM (the handler, in main, comes before any import)
_temporary: list[bytes] = []  # the healthy shapes' memory


class Job:
    def __init__(self, framework: str, mode: str, steps: int, out: str, leak_mib: int) -> None:
        self.framework = framework
        self.mode = mode
        self.steps = steps
        self.out = out
        self.rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
        self.world = int(os.environ.get("WORLD_SIZE", os.environ.get("GUARDTEST_WORLD", "1")))
        leaking = mode in ("guard", "control", "requeue") and self.rank == self.world - 1
        self.ballast = False
        if mode in RANKED:
            leaking = self.rank == int(os.environ["GUARDTEST_CGROUP_RANK"])
        if mode == "evalonecgroup":  # its evaluation grows, not its steps: ballast only
            self.ballast = leaking
            leaking = False
        self.leak_bytes = leak_mib << 20 if leaking else 0
        self.shape_bytes = leak_mib << 20 if mode in HEALTHY else 0
        eval_mib = int(os.environ.get("GUARDTEST_EVAL_MIB", leak_mib))
        self.eval_samples = eval_mib * EVAL_BATCH // 8 if mode in EVAL else 0
        self.eval_batches = 0
        self.done_steps = 0
        self.usage_file = os.environ.get("GUARDTEST_USAGE")
        self.peak_usage = 0
        self.losses: dict[int, float] = {}
        self.result: dict[str, Any] = {"framework": framework, "mode": mode,
                                       "rank": self.rank, "world": self.world,
                                       "node": os.environ.get("SLURMD_NODENAME")}
        self.checkpoint = os.path.join(out, f"{framework}-checkpoint")
        # the name of this run's result files: one per life in requeue mode
        self.tag = mode + os.environ.get("SLURM_RESTART_COUNT", "0") if mode == "requeue" \
            else mode

    def step_done(self) -> None:
        """After every optimizer step: the leak or the healthy shape, and the pace of a real
        step."""
        self.done_steps += 1
        if self.done_steps == 1:
            self.result["started"] = time.monotonic()
        if self.leak_bytes:
            _leaked.append(b"\x01" * self.leak_bytes)
        if self.shape_bytes:
            self.shape(self.done_steps)
        time.sleep(STEP_SECONDS)

    def shape(self, step: int) -> None:
        """The healthy shapes: written bytes (so charged), no growth."""
        if self.mode == "sawtooth":
            phase = (step - 1) % SAW_PERIOD
            if phase == 0:
                _temporary.append(b"\x02" * self.shape_bytes)
                self.read_peak()
            elif phase == SAW_PERIOD // 2:
                _temporary.clear()
        elif step == STEP_AT:
            _temporary.append(b"\x03" * self.shape_bytes)
        if self.mode == "step" and step >= STEP_AT and step % SAW_PERIOD == 0:
            self.read_peak()

    def read_peak(self) -> None:
        if self.usage_file:
            with open(self.usage_file) as f:
                self.peak_usage = max(self.peak_usage, int(f.read()))

    def write(self, verdict: Any = None, **extra: Any) -> None:
        self.result["losses"] = {str(k): v for k, v in sorted(self.losses.items())}
        self.result["steps_done"] = self.done_steps
        self.result["peak_usage"] = self.peak_usage
        self.result["eval_batches"] = self.eval_batches
        self.result["max_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.result["train_seconds"] = time.monotonic() - self.result.get("started", 0.0)
        if verdict is not None:
            self.result["verdict"] = {
                "stop": verdict.stop, "trigger": verdict.trigger, "level": verdict.level,
                "step": verdict.step, "rank": verdict.rank, "message": verdict.message()}
        self.result.update(extra)
        path = os.path.join(self.out, f"{self.tag}-rank{self.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.result, f)
        os.replace(path + ".tmp", path)


def data() -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(1234)
    return torch.randn(SAMPLES, 32, generator=gen), torch.randn(SAMPLES, 1, generator=gen)


def mlp() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(),
                               torch.nn.Linear(256, 1))


# ---- plain PyTorch: DDP over gloo, the guard in the loop --------------------------------------


def plain(job: Job) -> None:
    import torch
    import torch.distributed as dist

    import cgwatch

    dist.init_process_group("gloo")
    model = mlp()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = data()
    batches = SAMPLES // BATCH
    start = 0
    if job.mode == "resume":
        state = torch.load(os.path.join(job.checkpoint, "state.pt"), weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    guard = None
    if job.mode == "guard":
        guard = cgwatch.Guard(**GUARD, sync_every=SYNC_EVERY)
    elif job.mode == "onerank":  # only the last rank's guard has a reason to stop (at once)
        reserve = 1 << 50 if job.rank == job.world - 1 else 1
        guard = cgwatch.Guard(reserve=reserve, sync_every=SYNC_EVERY)
    for step in range(start + 1, job.steps + 1):
        i = ((step - 1) * job.world + job.rank) % batches  # the data index: from the step
        xb, yb = x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]
        loss = torch.nn.functional.mse_loss(ddp(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        job.losses[step] = loss.item()
        job.step_done()
        if guard is None:
            continue
        verdict = guard.check(step)
        if verdict.stop:
            if job.rank == 0:  # DDP keeps the replicas equal: one writer
                os.makedirs(job.checkpoint, exist_ok=True)
                with guard.saving():
                    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                "step": step}, os.path.join(job.checkpoint, "state.pt"))
            dist.barrier()  # the file is whole before any rank leaves
            job.write(verdict, checkpoint=job.checkpoint)
            guard.exit(verdict)
    job.write()


# ---- Hugging Face transformers: Trainer + GuardCallback ---------------------------------------


def hf(job: Job) -> None:
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

    class Recording(Trainer):  # type: ignore[misc]
        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            if model.training:  # an evaluation's losses are not the steps'
                job.losses[self.state.global_step + 1] = float(loss.detach())
            return loss

    class Leak(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            job.step_done()

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if os.environ.get("GUARDTEST_KILL_AT_SAVE") == str(job.rank):
                _wait_for_rank0_record()
                os.kill(os.getpid(), signal.SIGKILL)  # before GuardCallback.on_save

    class Evaluating(TrainerCallback):  # type: ignore[misc]
        def on_prediction_step(self, args: Any, state: Any, control: Any,
                               **kwargs: Any) -> None:
            job.eval_batches += 1

    class OnSigterm(TrainerCallback):  # type: ignore[misc]
        """requeue mode: the ranks agree on the SIGTERM flag at every step's end (one
        all-reduce: a save on one rank only would hang in its collective), then the Trainer
        saves checkpoint-<step>/ and leaves train()."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            flag = torch.tensor([_sigterm[0]])
            if torch.distributed.is_initialized():
                torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            if flag.item() and "stopped_at" not in job.result:
                job.result["stopped_at"] = state.global_step
                control.should_save = True
                control.should_training_stop = True
            return control

    transformers.set_seed(0)  # before building: Trainer seeds only in __init__
    dropout = 0.1 if job.mode in EVAL else 0.0
    model = GPT2LMHeadModel(GPT2Config(
        n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=32, bos_token_id=0,
        eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout))
    # The healthy shapes end with the Trainer's own checkpoint at the last step: the one the
    # guard's estimate of a checkpoint (GuardCallback's, from the model and optimizer) is
    # compared with (tests/integration/test_guard_healthy.py).
    save = {"save_strategy": "steps", "save_steps": job.steps} if job.mode in HEALTHY \
        else {"save_strategy": "no"}
    evaluation: dict[str, Any] = {}
    eval_set = None
    if job.mode in EVAL:
        evaluation = {"eval_strategy": "steps", "eval_steps": EVAL_AT,
                      "per_device_eval_batch_size": EVAL_BATCH,
                      "eval_do_concat_batches": False}
        eval_ids = torch.randint(0, 1000, (job.eval_samples, 32),
                                 generator=torch.Generator().manual_seed(4321))
        eval_set = [{"input_ids": row, "labels": row} for row in eval_ids]
    args = TrainingArguments(
        output_dir=job.checkpoint, max_steps=job.steps, per_device_train_batch_size=BATCH,
        learning_rate=1e-3, lr_scheduler_type="constant", use_cpu=True, report_to=[],
        logging_strategy="no", disable_tqdm=True, seed=0,
        dataloader_num_workers=0, ddp_find_unused_parameters=False, **save, **evaluation)
    callbacks: list[Any] = [Leak(), Evaluating()]
    guard = None
    if job.mode in ("guard", "onecgroup"):
        guard = GuardCallback(**GUARD)
        callbacks.append(guard)
    elif job.mode == "evalonecgroup":
        guard = GuardCallback(**GUARD_RANKS_EVAL)
        callbacks.append(guard)
    elif job.mode in HEALTHY or (job.mode in EVAL and job.mode != "evalreference"):
        guard = GuardCallback()  # the documented defaults
        callbacks.append(guard)
    elif job.mode == "requeue":
        callbacks.append(OnSigterm())
    trainer = Recording(model=model, args=args, train_dataset=Tokens(), eval_dataset=eval_set,
                        callbacks=callbacks,
                        compute_metrics=_batches_seen if job.mode in EVAL else None)
    resume = job.result["resumed_from"] = _last_hf_checkpoint(job.checkpoint) \
        if job.mode in ("resume", "requeue", "evalresume") else None
    with _result_on_exit(job, guard, lambda: _last_hf_checkpoint(job.checkpoint)):
        trainer.train(resume_from_checkpoint=resume)
    if guard is not None and guard.stopped is not None:
        job.write(guard.stopped, checkpoint=_last_hf_checkpoint(job.checkpoint))
        guard.exit_if_stopped()
    if job.mode in HEALTHY and guard is not None:
        _record_checkpoint_size(job, guard, _last_hf_checkpoint(job.checkpoint))
    job.write()


def _batches_seen(prediction: Any) -> dict[str, float]:
    """A metric, so that the Trainer keeps every batch's logits to the evaluation's end (it
    keeps only the losses when it has no `compute_metrics`)."""
    return {"batches": float(len(prediction.predictions))}


@contextlib.contextmanager
def _result_on_exit(job: Job, guard: Any, checkpoint: Callable[[], Any]) -> Iterator[None]:
    """A stop in an evaluation leaves train() / fit() by the guard's SystemExit: the result,
    with its verdict and checkpoint, is written first."""
    try:
        yield
    except SystemExit:
        if guard is not None and guard.stopped is not None:
            job.write(guard.stopped, checkpoint=checkpoint(), stopped_in_eval=True)
        raise


def _record_checkpoint_size(job: Job, guard: Any, path: Optional[str]) -> None:
    """The guard's checkpoint size (the adapter's estimate) and the bytes the framework
    wrote at `path` (a file, or a directory's files)."""
    job.result["checkpoint_estimate"] = guard.guard.checkpoint_bytes
    if path is None:
        return
    files = [path] if os.path.isfile(path) else [
        os.path.join(root, name) for root, _, names in os.walk(path) for name in names]
    job.result["checkpoint_on_disk"] = sum(os.path.getsize(f) for f in files)


def _wait_for_rank0_record(seconds: float = 60.0) -> None:
    """The kill-at-save fault: first let rank 0 record its save (cgwatch/saves.py), so the
    run shows a save recorded by one rank only, not none (torchrun SIGTERMs rank 0 0.1 s
    after this rank's death)."""
    path = os.path.join(os.environ.get("CGWATCH_SAVES_DIR", "/nonexistent"), "rank-0.json")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                if json.load(f).get("saved"):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)


def _last_hf_checkpoint(directory: str) -> Optional[str]:
    found = [d for d in os.listdir(directory) if d.startswith("checkpoint-")] \
        if os.path.isdir(directory) else []
    if not found:
        return None
    return os.path.join(directory, max(found, key=lambda d: int(d.split("-")[1])))


# ---- Lightning: GuardCallback, a resumable loader ---------------------------------------------


def lightning(job: Job) -> None:
    import lightning as L
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    from cgwatch.integrations.lightning import GuardCallback

    class Module(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            xb, yb = batch
            loss = torch.nn.functional.mse_loss(self.net(xb), yb)
            job.losses[self.global_step + 1] = loss.item()
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            xb, _ = batch  # the predictions kept to the epoch's end, as Lightning documents
            self.outputs.append(self.net(xb).expand(-1, PREDICTION_WIDTH).clone())
            job.eval_batches += 1

        def on_validation_epoch_end(self) -> None:
            self.outputs.clear()

    class Leak(L.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, *args: Any) -> None:
            job.step_done()

    x, y = data()
    loader = StatefulDataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH,
                                shuffle=False, num_workers=0)
    callbacks: list[Any] = [Leak()]
    guard = None
    if job.mode in ("guard", "onecgroup"):
        guard = GuardCallback(dirpath=job.checkpoint, **GUARD)
        callbacks.append(guard)
    elif job.mode in HEALTHY:
        guard = GuardCallback()  # the documented defaults
        callbacks.append(guard)
    elif job.mode in EVAL and job.mode != "evalreference":
        guard = GuardCallback(dirpath=job.checkpoint)  # the documented defaults
        callbacks.append(guard)
    validation: dict[str, Any] = {}
    val_loader = None
    if job.mode in EVAL:
        validation = {"val_check_interval": EVAL_AT, "check_val_every_n_epoch": None}
        gen = torch.Generator().manual_seed(4321)
        val_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
            torch.randn(job.eval_samples, 32, generator=gen),
            torch.randn(job.eval_samples, 1, generator=gen)), batch_size=EVAL_BATCH)
    # Two ranks as Lightning's users run them on the CPU: it starts rank 1 itself
    # (docs/guard.md, "What the adapters rely on").
    trainer = L.Trainer(accelerator="cpu", devices=job.world,
                        strategy="ddp" if job.world > 1 else "auto", max_steps=job.steps,
                        logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=job.out,
                        callbacks=callbacks, **validation)
    ckpt = None
    if job.mode in ("resume", "evalresume"):
        ckpt = job.result["resumed_from"] = os.path.join(
            job.checkpoint, max(os.listdir(job.checkpoint), key=_step_of))
    module = Module()
    module.outputs = []
    with _result_on_exit(job, guard, lambda: guard.path):
        trainer.fit(module, loader, val_loader, ckpt_path=ckpt)
    if guard is not None and guard.stopped is not None:
        job.write(guard.stopped, checkpoint=guard.path)
        guard.exit_if_stopped()
    if job.mode in HEALTHY and guard is not None:
        path = os.path.join(job.out, f"{job.mode}-last.ckpt")  # what the guard's save writes
        trainer.save_checkpoint(path)
        _record_checkpoint_size(job, guard, path)
    job.write()


def _step_of(name: str) -> int:
    """The step in a Lightning checkpoint's name (guard-step=<step>.ckpt)."""
    return int(name.rsplit("=", 1)[-1].split(".")[0])


# ---- DeepSpeed ZeRO-2 on the CPU accelerator: guard_step around save_checkpoint --------------


def deepspeed_zero2(job: Job) -> None:
    import deepspeed
    import torch

    import cgwatch
    from cgwatch.integrations.deepspeed_guard import guard_step

    # No JIT build of the shared-memory allreduce op (useless here; see zero_steps.py).
    deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    model = mlp()
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10**6, "wall_clock_breakdown": False}
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=config)
    x, y = data()
    batches = SAMPLES // BATCH
    start = 0
    if job.mode == "resume":
        _, client = engine.load_checkpoint(job.checkpoint)  # tag None: the `latest` file
        start = client["step"]
    guard = cgwatch.Guard(**GUARD) if job.mode in ("guard", "onecgroup") else None
    for step in range(start + 1, job.steps + 1):
        i = ((step - 1) * job.world + job.rank) % batches
        loss = torch.nn.functional.mse_loss(engine(x[i * BATCH:(i + 1) * BATCH]),
                                            y[i * BATCH:(i + 1) * BATCH])
        engine.backward(loss)
        engine.step()
        job.losses[step] = loss.item()
        job.step_done()
        if guard is None:
            continue
        verdict = guard_step(guard, engine, step, job.checkpoint, tag=f"step{step}",
                             client_state={"step": step})
        if verdict.stop:
            job.write(verdict, checkpoint=job.checkpoint)
            guard.exit(verdict)
    job.write()


FRAMEWORKS: dict[str, Callable[[Job], None]] = {
    "plain": plain, "hf": hf, "lightning": lightning, "deepspeed": deepspeed_zero2}


def main(argv: list[str]) -> int:
    framework, mode, steps, out = argv[:4]
    if mode == "requeue":
        import signal

        signal.signal(signal.SIGTERM, lambda signum, frame: _sigterm.__setitem__(0, 1))
    job = Job(framework, mode, int(steps), out, int(argv[4]) if len(argv) > 4 else 0)
    if mode in RANKED:
        _own_log_and_cgroup(job)
    status = 0
    try:
        FRAMEWORKS[framework](job)
    except SystemExit as e:  # the guard's exit: its status, after the group is torn down
        status = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the status file must say it failed
        import traceback

        traceback.print_exc()
        status = 1
    # Before the teardown: a launcher may kill a rank that is still leaving (below).
    with open(os.path.join(job.out, f"{job.tag}-rank{job.rank}.status"), "w") as f:
        f.write(str(status))
    # Tear the group down and leave without the interpreter's exit: torch + gloo ranks can
    # abort there (`terminate called without an active exception`; docs/guard.md, "What the
    # adapters rely on").
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        if mode in RANKED and status == 75:
            # Leave together: torchrun SIGTERMs the ranks still running 0.1 s (its
            # --monitor-interval) after one exits non-zero, Lightning's launcher SIGKILLs
            # rank 0 when its child exits non-zero first (docs/guard.md).
            dist.barrier()
        dist.destroy_process_group()
    if job.rank == 0:
        time.sleep(float(os.environ.get("GUARDTEST_LINGER_RANK0", "0")))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _own_log_and_cgroup(job: Job) -> None:
    """onecgroup mode: this rank's output to its own log (both ranks share the launcher's
    streams), and the limited rank into its cgroup before it imports torch."""
    log = os.open(os.path.join(job.out, f"{job.mode}-rank{job.rank}.log"),
                  os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    limited = job.leak_bytes or job.ballast
    if limited and os.environ.get("GUARDTEST_CGROUP"):
        with open(os.path.join(os.environ["GUARDTEST_CGROUP"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if limited:
        # A head start (written, so charged): fewer leaking steps to the reserve.
        _leaked.append(b"\x01" * (int(os.environ.get("GUARDTEST_BALLAST_MIB", "0")) << 20))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
