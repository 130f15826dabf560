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

Importing this module imports neither torch nor transformers: `GuardCallback` is built on
first access, on top of `transformers.TrainerCallback` (tested with transformers 5.24.0).
"""

from __future__ import annotations

import os
import time
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

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self._the_guard()
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
            if control.should_save:
                self._save_asked = time.monotonic()
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if self._save_asked is not None:
                self._the_guard().saved(time.monotonic() - self._save_asked)
                self._save_asked = None
            if self.stopped is not None:  # this rank's part of the guard's save is written
                self._record_save(state.global_step, os.path.join(
                    args.output_dir, f"checkpoint-{state.global_step}"))
            return control

    return GuardCallback


_callback = LazyClass(_build)
callback_class = _callback.get  # `GuardCallback`, built on top of the base at the first call
__getattr__ = _callback.module_getattr("GuardCallback", __name__)
