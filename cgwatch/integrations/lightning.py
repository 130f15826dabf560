"""The memory guard in Lightning: a `lightning.pytorch.Callback`.

    from cgwatch.integrations.lightning import GuardCallback

    guard = GuardCallback(reserve="5%")          # keyword arguments of cgwatch.Guard
    trainer = L.Trainer(..., callbacks=[guard])
    trainer.fit(model, loader)                   # resume: fit(..., ckpt_path=guard.path)
    guard.exit_if_stopped()                      # stopped by the guard: its message, exit 75

After every training batch (`on_train_batch_end`) the callback asks
`cgwatch.Guard.check(trainer.global_step)`; when it says stop, it saves with
`trainer.save_checkpoint()` (what `ModelCheckpoint` does at that hook, so the file resumes
mid-epoch like one of its own: with a resumable loader such as torchdata's
`StatefulDataLoader`) to `dirpath/filename` (default: the trainer's `default_root_dir`,
`guard-step=<step>.ckpt`), times the save for the guard, and sets `trainer.should_stop`.
Before a save is timed, unless the user gave `checkpoint_seconds` or `checkpoint_bytes`, the
guard's checkpoint size is the module's and `trainer.optimizers`' state (at the first
batches, `_guarded.CheckpointSize`) instead of the working set.
Under DDP every rank gets the same answer at the same step (the guard's all-reduce,
cgwatch/ranks.py): Lightning does not sync `should_stop`, and a save is a collective. Under
`cgwatch run` each rank also records that it started (`setup`) and that it saved (right
after the save; cgwatch/saves.py): `run` then exits 75 once every rank saved, whatever
Lightning's launcher ended with (137 when its observer killed rank 0 after rank 1's 75).

Validation during `fit()` is checked too (`on_validation_batch_end`, the sanity check's
batches included), with the same `Guard.check` and the training's global step. A stop there
saves the same way, records it, and ends the process with `Guard.exit` (SystemExit 75,
raised out of `fit()`: Lightning itself leaves an evaluation that way on SIGTERM, its
`SIGTERMException`), since a validation loop cannot be told to stop and its memory (gathered
outputs, a metric's state) grows batch by batch. A validation changes no weight or optimizer
state: the file holds the last finished step's state, and `fit(..., ckpt_path=...)` goes on
at the next training step (Lightning 2.6.6 takes a checkpoint written in a validation batch
hook as written after it: it neither finishes nor repeats that validation). And since
Lightning validates before it leaves when `should_stop` is set, a stop in training leaves at
`on_validation_start` instead, its save done. Under DDP every rank must run the same number
of validation batches, as Lightning's default `DistributedSampler` gives (it pads the last
shard). `validate()`, `test()` and `predict()` outside `fit()` are not checked: there is no
training state to save, and Lightning's predict sampler gives ranks unequal batch counts
(the guard's agreement is a collective every rank must join as often).

Lightning's own SIGUSR1 auto-requeue (Slurm) is left alone: this callback installs no signal
handler (Lightning installs its own only where SIGUSR1 has none, so one of ours would turn
the requeue off: docs/guard.md, "What the adapters rely on").

Importing this module imports neither torch nor Lightning: `GuardCallback` is built on first
access, on top of `lightning.pytorch.Callback` (tested with lightning 2.6.6; the standalone
`pytorch_lightning` package is used when `lightning` is not installed).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional

from cgwatch.integrations._guarded import GuardUser, LazyClass

if TYPE_CHECKING:
    from cgwatch.guard import Guard
    from cgwatch.policy import Verdict

    GuardCallback: type  # built on first access (module __getattr__)

__all__ = ["GuardCallback", "callback_class"]


def _build() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    class GuardCallback(GuardUser, Callback):  # type: ignore[misc]
        """Save and stop the Lightning Trainer when the memory guard says so (module
        docstring). `guard`: a `cgwatch.Guard` to use; otherwise one is made at `setup`
        with `guard_kwargs`. After `fit()`: `stopped` is the verdict acted on (None: the
        guard never stopped the run), `path` the checkpoint written, `exit_if_stopped()`
        ends the job with the guard's status."""

        def __init__(self, guard: Optional[Guard] = None, *, dirpath: Optional[str] = None,
                     filename: str = "guard-step={step}.ckpt", **guard_kwargs: Any) -> None:
            super().__init__()
            self._use_guard(guard, guard_kwargs)
            self.dirpath = dirpath
            self.filename = filename
            self.path: Optional[str] = None

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            self._the_guard()
            # On every rank, after the launcher started them; num_devices: ranks per node.
            self._record_start(trainer.global_rank, trainer.num_devices)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            guard = self._the_guard()
            if not self.checkpoint_size.done:  # the first steps only (_guarded.py)
                self._size_checkpoint(guard, pl_module, trainer.optimizers)
            verdict = guard.check(trainer.global_step)
            if not verdict.stop or self.stopped is not None:
                return
            self._save(trainer, guard, verdict)
            trainer.should_stop = True

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            if self.stopped is not None and _fitting(trainer):  # saved: leave, not validate
                self._the_guard().exit(self.stopped)

        def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any,
                                    batch: Any, batch_idx: int,
                                    dataloader_idx: int = 0) -> None:
            if not _fitting(trainer):  # validate() outside fit(): nothing to save
                return
            guard = self._the_guard()
            verdict = guard.check(trainer.global_step)
            if verdict.stop and self.stopped is None:
                self._save(trainer, guard, verdict)
                guard.exit(verdict)

        def _save(self, trainer: Any, guard: Guard, verdict: Verdict) -> None:
            self.stopped = verdict
            directory = self.dirpath or trainer.default_root_dir
            path = os.path.join(directory, self.filename.format(step=trainer.global_step))
            with guard.saving():
                trainer.save_checkpoint(path)  # a collective, with a barrier in it
            self.path = path
            self._record_save(trainer.global_step, path)

    return GuardCallback


def _fitting(trainer: Any) -> bool:
    """Whether `trainer` runs `fit()` (its `state.fn`, a str enum equal to "fit")."""
    return bool(getattr(trainer.state, "fn", None) == "fit")


_callback = LazyClass(_build)
callback_class = _callback.get  # `GuardCallback`, built on top of the base at the first call
__getattr__ = _callback.module_getattr("GuardCallback", __name__)
