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
asked for it to `on_save`), is reported to the guard, whose forecast allows for it.

Importing this module imports neither torch nor transformers: `GuardCallback` is built on
first access, on top of `transformers.TrainerCallback` (tested with transformers 5.24.0).
"""

from __future__ import annotations

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
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            verdict = self._the_guard().check(state.global_step)
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
            return control

    return GuardCallback


_callback = LazyClass(_build)
callback_class = _callback.get  # `GuardCallback`, built on top of the base at the first call
__getattr__ = _callback.module_getattr("GuardCallback", __name__)
