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

In an evaluation loop, call it after every batch too, with the last finished training step
(an evaluation changes no weight or optimizer state: the save is that step's), every rank
as often (the agreement is a collective; a stop comes at most `sync_every - 1` calls late);
on a stop, `guard.exit(verdict)` there: the evaluation cannot be finished first, its
gathered outputs growing with each batch (docs/guard.md, "In evaluation").

Before a save is timed, unless the guard was given `checkpoint_seconds` or
`checkpoint_bytes`, its checkpoint size is this rank's part of the state: `engine.module`'s
and `engine.optimizer`'s (ZeRO's partition of the optimizer state and of the fp32 master
weights), counted at the first calls (`_guarded.CheckpointSize`) instead of the working set.

Under `cgwatch run`, `guard_step` also records, at its first call for a guard and right
after the save, that this rank started and saved (cgwatch/saves.py, with
`engine.global_rank`): `run` then exits 75 once every rank saved, although torchrun exits 1
for workers that exit 75.

Importing this module imports neither torch nor DeepSpeed (it only calls the engine you
pass; tested with deepspeed 0.19.8, ZeRO-2 on the CPU accelerator).
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any, Optional

from cgwatch import saves
from cgwatch.integrations._guarded import CheckpointSize

if TYPE_CHECKING:
    from cgwatch.guard import Guard
    from cgwatch.policy import Verdict

__all__ = ["guard_step", "save_checkpoint"]

_started: weakref.WeakSet[Any] = weakref.WeakSet()  # guards whose rank recorded its start
# Per guard, its checkpoint's estimate from the engine (_guarded.CheckpointSize).
_sizes: weakref.WeakKeyDictionary[Any, CheckpointSize] = weakref.WeakKeyDictionary()


def save_checkpoint(guard: Guard, engine: Any, save_dir: str, **kwargs: Any) -> Any:
    """`engine.save_checkpoint(save_dir, **kwargs)`, timed for the guard (`guard.saving()`);
    returns what DeepSpeed returns. A collective: every rank calls it."""
    with guard.saving():
        return engine.save_checkpoint(save_dir, **kwargs)


def guard_step(guard: Guard, engine: Any, step: Optional[int], save_dir: str,
               **kwargs: Any) -> Verdict:
    """`guard.check(step)`; when it says stop, save first (`save_checkpoint`). Returns the
    verdict: the loop then stops (`guard.exit(verdict)`)."""
    if guard not in _started:
        _started.add(guard)
        saves.record_start(*_rank(engine))
    size = _sizes.get(guard)
    if size is None:
        size = _sizes[guard] = CheckpointSize()
    if not size.done:  # the first steps only
        size.update(guard, getattr(engine, "module", None),
                    [getattr(engine, "optimizer", None)])
    verdict = guard.check(step)
    if verdict.stop:
        save_checkpoint(guard, engine, save_dir, **kwargs)
        saves.record_save(*_rank(engine), step, save_dir)
    return verdict


def _rank(engine: Any) -> tuple[int, int]:
    """(global rank, ranks on this node): torchrun sets LOCAL_WORLD_SIZE; without it, one
    node of the engine's world size."""
    rank = int(getattr(engine, "global_rank", 0))
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return rank, int(local) if local.isdigit() else int(getattr(engine, "world_size", 1))
