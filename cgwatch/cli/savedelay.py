"""Internal. `cgwatch run --guard --save-delay SECONDS`: a CMD that begins its save a while after
the guard's signal, and what run says when such a CMD saved nothing.

Hugging Face's own SIGTERM save (`TrainingArguments(enable_jit_checkpoint=True)`, transformers
5.24, `trainer_jit_checkpoint.py`): `CheckpointManager._sigterm_handler` starts a
`threading.Timer` of `kill_wait` = 3 s; when it fires, `JITCheckpointCallback` saves
`checkpoint-<global_step>/` at the next `on_step_begin`, `on_pre_optimizer_step`,
`on_step_end` or `on_epoch_end` and stops training. So from the signal a save takes those
3 s, up to one step more, then the save itself: the guard's lead must hold all three. Here
the delay is part of what a save takes (the guard's `save_delay`, decision.py:
`checkpoint_seconds` = the delay + the save), so it gets the guard's margin (x 1.5) as the
save does, and the margin covers the step.

A save that waits for a step boundary saves nothing while the job is in a loop without one:
HF's evaluation and prediction loops call only `on_prediction_step` per batch (and
`on_evaluate` at the end), which the jit callback does not answer. A stop that comes while an
evaluation gathers predictions past the limit therefore cannot save: the kernel kills the job
first. `killed_line` says exactly that, from what run sees: the job killed, nothing in
`--checkpoint-dir` changed since the signal, and more time than the delay gone by.
"""

from __future__ import annotations

from typing import Optional

from .explain import signal_name


def timed_save(seconds: float, save_delay: float) -> float:
    """The save an attempt made, from the signal to CMD's end (`seconds`), without the delay
    the guard adds itself (its `save_delay`): what the next attempt's guard is told."""
    return max(0.0, seconds - save_delay)


def killed_line(name: str, killer: int, signum: int, seconds: float, save_delay: float,
                directory: Optional[str], changed: Optional[str], status: int) -> str:
    """The line after CMD was killed (by `killer`, not the guard's `signum`) `seconds` after
    the guard's signal: what came of the save, as far as run can tell. `directory`: where
    CMD saves (None: unknown); `changed`: its newest entry changed since the signal (None:
    none); `save_delay`: seconds CMD waits after the signal before it saves. Pure."""
    head = (f"{name} was killed by {signal_name(killer)} {seconds_text(seconds)} after "
            f"{signal_name(signum)}")
    if directory is None:
        return f"cgwatch guard: {head}, before it could finish a save; exit {status}"
    if changed is not None:
        return (f"cgwatch guard: {head}, during its save ({changed} changed since the "
                f"signal and may be incomplete); exit {status}")
    nothing = f"nothing in {directory} changed since the signal"
    if save_delay and seconds <= save_delay:
        return (f"cgwatch guard: nothing was saved: {head}, before its save could begin "
                f"({seconds_text(save_delay)} after the signal, --save-delay); {nothing}; "
                f"exit {status}")
    if save_delay:
        waited = (f"its save waits {seconds_text(save_delay)} (--save-delay), then for a step "
                  f"boundary, and none came in the {seconds_text(seconds - save_delay)} after")
    else:
        waited = f"its save had not begun in those {seconds_text(seconds)}"
    return (f"cgwatch guard: nothing was saved: {head}, and {nothing}: {waited}: stopped "
            f"during an evaluation or prediction loop, which has no step boundary until it "
            f"ends (HF's enable_jit_checkpoint saves only at one), or in a step longer than "
            f"that; exit {status}")


def seconds_text(value: float) -> str:
    """Seconds as run's guard lines give them: "42 s", "3.1 s"."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"
