"""The memory guard in Hugging Face `transformers`' Trainer: a `TrainerCallback`.

    from cgwatch.integrations.transformers import GuardCallback

    guard = GuardCallback(reserve="5%")          # keyword arguments of cgwatch.Guard
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[guard])
    trainer.train()                              # resume: train(resume_from_checkpoint=True)
    guard.exit_if_stopped()                      # stopped by the guard: its message, exit 75

At the end of every step (`on_step_end`) the callback asks `cgwatch.Guard.check(global_step)`;
when it says stop, it sets `control.should_save` and `control.should_training_stop`: the
Trainer writes `checkpoint-<step>/` as for a scheduled save (model, optimizer, scheduler, RNG
states, trainer state) and leaves `train()`. Under torchrun every rank gets the same answer
at the same step (the guard's all-reduce, cgwatch/ranks.py): a save on one rank only would
hang in its collective. The time of each save, scheduled or not (from the `on_step_end` that
asked for it to `on_save`), is reported to the guard, whose forecast allows for it; before
the first, unless the user gave `checkpoint_seconds` or `checkpoint_bytes`, the guard's
checkpoint size is the model's and optimizer's state (the Trainer's `model` and `optimizer`
at the first `on_step_end`s, `_guarded.CheckpointSize`) instead of the working set. Under
`cgwatch run` each rank also records that it started and, at `on_save` after a stop, that
it saved (cgwatch/saves.py): `run` then exits 75 once every rank saved, although torchrun
exits 1 for workers that exit 75.

Evaluation during `train()` is checked too: after every prediction step
(`on_prediction_step`, per batch of `evaluate()` and `predict()`), the same `Guard.check`
with the training's global step. The Trainer's evaluation loop has no flag to leave it by,
and a host OOM in evaluation is mostly its gathered predictions growing batch by batch, so
a stop there cannot wait for the loop's end: the callback saves there, with the Trainer's
own `_save_checkpoint` (what `enable_jit_checkpoint=True`'s callback calls too; the Trainer,
which callbacks are not given, is found up the call stack at `on_train_begin`), records the
save, waits for every rank (`accelerator.wait_for_everyone()`), and ends the process with
`Guard.exit` (SystemExit 75, raised out of `train()`). An evaluation changes no weight,
optimizer or trainer state, so that `checkpoint-<step>/` is the one a stop at that step's
end would have written, and `train(resume_from_checkpoint=True)` goes on at the next step,
as an uninterrupted run does after its evaluation. A stop at a step's end that has an
evaluation scheduled skips it (`control.should_evaluate`): the save comes first. Under
torchrun the evaluation's checks agree across ranks as the training's do: every rank must run
the same number of prediction steps, which the Trainer needs anyway (it all-gathers every
batch's outputs, and accelerate evens the shards by default). `evaluate()` and `predict()`
outside `train()` are not checked: there is no training state to save.

Importing this module imports neither torch nor transformers: `GuardCallback` is built on
first access, on top of `transformers.TrainerCallback` (tested with transformers 5.24.0).
"""

from __future__ import annotations

import os
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, Optional

from cgwatch.integrations._guarded import GuardUser, LazyClass

if TYPE_CHECKING:
    from cgwatch.guard import Guard

    GuardCallback: type  # built on first access (module __getattr__)

__all__ = ["GuardCallback", "callback_class"]


def _build() -> type:
    from transformers import TrainerCallback

    class GuardCallback(GuardUser, TrainerCallback):  # type: ignore[misc]
        """Save and stop the Trainer when the memory guard says so (module docstring).
        `guard`: a `cgwatch.Guard` to use; otherwise one is made at `on_train_begin` with
        `guard_kwargs`. After `train()`: `stopped` is the verdict acted on (None: the guard
        never stopped the run), `exit_if_stopped()` ends the job with the guard's status."""

        def __init__(self, guard: Optional[Guard] = None, **guard_kwargs: Any) -> None:
            super().__init__()
            self._use_guard(guard, guard_kwargs)
            self._save_asked: Optional[float] = None
            self._trainer: Any = None  # inside train(): the Trainer (a stop in evaluation)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self._the_guard()
            self._trainer = _trainer_holding(self)
            # torchrun sets LOCAL_WORLD_SIZE; one process (or a launcher that does not)
            # is a node of its own.
            local = os.environ.get("LOCAL_WORLD_SIZE", "")
            self._record_start(args.process_index,
                               int(local) if local.isdigit() else args.world_size)
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            guard = self._the_guard()
            if not self.checkpoint_size.done:  # the first steps only (_guarded.py)
                self._size_checkpoint(guard, kwargs.get("model"), [kwargs.get("optimizer")])
            verdict = guard.check(state.global_step)
            if verdict.stop and self.stopped is None:
                self.stopped = verdict
                control.should_save = True
                control.should_training_stop = True
                control.should_evaluate = False  # the Trainer evaluates before it saves
            if control.should_save:
                self._save_asked = time.monotonic()
            return control

        def on_prediction_step(self, args: Any, state: Any, control: Any,
                               **kwargs: Any) -> Any:
            trainer = self._trainer
            if trainer is None:  # evaluate() / predict() outside train(): nothing to save
                return control
            guard = self._the_guard()
            verdict = guard.check(state.global_step)
            if verdict.stop and self.stopped is None:
                self.stopped = verdict
                # The last finished step's state (an evaluation changes none of it), as the
                # Trainer's own save writes it; its loop cannot be left but by raising.
                with guard.saving():
                    trainer._save_checkpoint(trainer.model, trial=None)
                self._record_save(state.global_step, _checkpoint(args, state))
                trainer.accelerator.wait_for_everyone()  # no rank leaves a save half done
                guard.exit(verdict)
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self._trainer = None
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if self._save_asked is not None:
                self._the_guard().saved(time.monotonic() - self._save_asked)
                self._save_asked = None
            if self.stopped is not None:  # this rank's part of the guard's save is written
                self._record_save(state.global_step, _checkpoint(args, state))
            return control

    return GuardCallback


def _checkpoint(args: Any, state: Any) -> str:
    """The directory the Trainer saves the step's checkpoint to."""
    return os.path.join(args.output_dir, f"checkpoint-{state.global_step}")


def _trainer_holding(callback: Any, depth: int = 8) -> Any:
    """The Trainer whose callback handler holds `callback`, found in the frames that called
    its `on_train_begin` (the Trainer's `_inner_training_loop`, through the handler's
    `call_event`: transformers 5.24); None if none. The Trainer hands callbacks its model,
    optimizer and data loaders but not itself (only its own JIT-checkpoint callback is
    given it, `set_trainer`), and a save in the middle of an evaluation needs its
    `_save_checkpoint`."""
    frame: Optional[FrameType] = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        handler = getattr(owner, "callback_handler", None)
        if any(c is callback for c in getattr(handler, "callbacks", ())):
            return owner
        frame = frame.f_back
    return None


_callback = LazyClass(_build)
callback_class = _callback.get  # `GuardCallback`, built on top of the base at the first call
__getattr__ = _callback.module_getattr("GuardCallback", __name__)
