"""The memory guard in a DeepSpeed training loop: two helpers around `engine.save_checkpoint`.

    import cgwatch
    from cgwatch.integrations.deepspeed_guard import guard_step, save_checkpoint

    guard = cgwatch.Guard(reserve="5%")
    for step, batch in enumerate(loader, start=first_step):
        loss = engine(batch); engine.backward(loss); engine.step()
        verdict = guard_step(guard, engine, step, "ckpt", tag=f"step{step}",
                             client_state={"step": step})
        if verdict.stop:
            guard.exit(verdict)              # its message on stderr, exit 75
        if step % 1000 == 0:                 # a scheduled save, timed for the guard's forecast
            save_checkpoint(guard, engine, "ckpt", tag=f"step{step}")

`guard_step` asks `guard.check(step)` and, when it says stop, calls
`engine.save_checkpoint(save_dir, **kwargs)` inside `guard.saving()`. Every rank must call it
at every step: ZeRO's save is a collective (each rank writes its optimizer partition), and
the guard's all-reduce (cgwatch/ranks.py) gives every rank the same answer at the same step.
Resume with `engine.load_checkpoint(save_dir, tag)` (tag None: the `latest` file).

Importing this module imports neither torch nor DeepSpeed (it only calls the engine you
pass; tested with deepspeed 0.19.8, ZeRO-2 on the CPU accelerator).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from cgwatch.guard import Guard
    from cgwatch.policy import Verdict

__all__ = ["guard_step", "save_checkpoint"]


def save_checkpoint(guard: Guard, engine: Any, save_dir: str, **kwargs: Any) -> Any:
    """`engine.save_checkpoint(save_dir, **kwargs)`, timed for the guard (`guard.saving()`);
    returns what DeepSpeed returns. A collective: every rank calls it."""
    with guard.saving():
        return engine.save_checkpoint(save_dir, **kwargs)


def guard_step(guard: Guard, engine: Any, step: Optional[int], save_dir: str,
               **kwargs: Any) -> Verdict:
    """`guard.check(step)`; when it says stop, save first (`save_checkpoint`). Returns the
    verdict: the loop then stops (`guard.exit(verdict)`)."""
    verdict = guard.check(step)
    if verdict.stop:
        save_checkpoint(guard, engine, save_dir, **kwargs)
    return verdict
