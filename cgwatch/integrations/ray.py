"""The memory guard in a Ray Train worker loop: check every step, and on a stop report a
checkpoint and end the attempt so that Ray Train restarts it from exactly that checkpoint.

    import cgwatch, ray.train
    from cgwatch.integrations.ray import fit, guard_step, report_checkpoint

    def train_loop(config):                      # TorchTrainer's train_loop_per_worker
        guard = cgwatch.Guard(reserve="5%")
        first = 1
        checkpoint = ray.train.get_checkpoint()  # the one the stop reported, after a restart
        if checkpoint:
            with checkpoint.as_directory() as directory:
                first = load(directory) + 1      # model, optimizer, step
        for step in range(first, config["steps"] + 1):
            loss = train_one_step(step)
            guard_step(guard, step, save, metrics={"loss": loss})  # save(directory) writes
            if step % 1000 == 0:                 # a scheduled checkpoint, timed for the guard
                report_checkpoint(guard, save, {"loss": loss, "step": step})

    trainer = TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(failure_config=FailureConfig(max_failures=3)))
    result = fit(trainer)                        # stops beyond max_failures: exit 75

`guard_step` asks `guard.check(step)`; when it says stop it calls `report_checkpoint`:
`save(directory)` writes this worker's files into a fresh local directory, and
`ray.train.report(metrics, checkpoint=Checkpoint.from_directory(directory))` uploads them
into the run's storage (every worker reports, into one checkpoint directory: name the files
by rank), both timed for the guard (`guard.saving()`). It then waits until Ray Train has
committed that checkpoint (`ray.train.get_all_reported_checkpoints(COMMITTED)`) and raises
`GuardStopped`, the verdict's message as its text.

Why an exception: Ray Train 2.60 (its default "v2" controller) counts an attempt as failed
when the training function of any worker raises; the controller then shuts the whole worker
group down (its actors, and so the processes holding the leak, are killed), and
`FailureConfig(max_failures=N)` starts a new group, whose `ray.train.get_checkpoint()` is
the newest committed checkpoint: the stop's. A `sys.exit` in the loop would look the same
to Ray (it catches BaseException in the worker's training thread) but says nothing. Why the
wait: the controller registers a checkpoint only once it has polled every worker's report
(`ReportCallbackHandler`, every rank), and it acts on a worker's error at the poll that
sees it; a worker that raised at once could end the attempt before a slower worker's
report was polled, and the restart would resume from the checkpoint before.

Every worker decides at the same step: Ray Train's `TorchTrainer` initialises
torch.distributed in every worker (gloo on CPU, NCCL on GPU) before the loop, and the
guard's all-reduce (cgwatch/ranks.py, every `sync_every`-th check) uses it. Every worker
must call `guard_step` at every step: `report` is a collective (Ray syncs its checkpoint
directory name across ranks).

`fit(trainer)` is `trainer.fit()`, except when the run failed because the guard stopped
every worker more often than `max_failures` allows: then it prints the stop's message and
exits 75 (`cgwatch.GUARD_EXIT_STATUS`: saved, may be resumed; a new `fit` with the same
`RunConfig(name=..., storage_path=...)` resumes from the checkpoint). Under `cgwatch run`,
each worker also records that it started and that it saved (cgwatch/saves.py).

Before a save is timed, unless the guard was given `checkpoint_seconds` or
`checkpoint_bytes`, its checkpoint size is the `model`'s and `optimizers`' state when
`guard_step` is given them (`_guarded.CheckpointSize`), else the working set.

Importing this module imports neither Ray nor torch (tested with ray[train] 2.60.0 and torch
2.13.0 on CPU workers).
"""

from __future__ import annotations

import os
import sys
import tempfile
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

from cgwatch import saves
from cgwatch.integrations._guarded import CheckpointSize

if TYPE_CHECKING:
    from cgwatch.guard import Guard
    from cgwatch.policy import Verdict

__all__ = ["GuardStopped", "fit", "guard_step", "report_checkpoint", "stopped_by_guard"]

_started: weakref.WeakSet[Any] = weakref.WeakSet()  # guards whose worker recorded its start
_sizes: weakref.WeakKeyDictionary[Any, CheckpointSize] = weakref.WeakKeyDictionary()


class GuardStopped(RuntimeError):
    """Raised in a worker after its stop's checkpoint is committed: Ray Train ends the
    attempt and restarts it from that checkpoint. Its text is the guard's verdict; `step`
    the step saved."""

    def __init__(self, message: str, step: Optional[int] = None) -> None:
        super().__init__(message)
        self.step = step

    def __reduce__(self) -> tuple[Any, ...]:  # Ray pickles it to the controller and driver
        return (self.__class__, (str(self), self.step))


def report_checkpoint(guard: Guard, save: Callable[[str], object],
                      metrics: Optional[Mapping[str, Any]] = None, *,
                      scratch: Optional[str] = None) -> None:
    """`save(directory)` into a fresh directory (under `scratch`, default the temporary
    directory: not a tmpfs, whose pages are charged to the job's memory), then
    `ray.train.report(metrics, checkpoint=...)` of it, timed together for the guard. A
    collective: every worker calls it."""
    import ray.train

    with guard.saving(), tempfile.TemporaryDirectory(prefix="cgwatch-ray-",
                                                     dir=scratch) as directory:
        save(directory)
        ray.train.report(dict(metrics or {}),
                         checkpoint=ray.train.Checkpoint.from_directory(directory))


def guard_step(guard: Guard, step: Optional[int], save: Callable[[str], object], *,
               metrics: Optional[Mapping[str, Any]] = None, model: Any = None,
               optimizers: Iterable[Any] = (), scratch: Optional[str] = None) -> Verdict:
    """`guard.check(step)`; the verdict when it says go on. When it says stop:
    `report_checkpoint(guard, save, metrics)` (metrics plus `cgwatch_stop_step`), wait until
    Ray Train committed it, and raise `GuardStopped` (module docstring)."""
    if guard not in _started:
        _started.add(guard)
        saves.record_start(*_rank())
    size = _sizes.get(guard)
    if size is None:
        size = _sizes[guard] = CheckpointSize()
    if not size.done and model is not None:  # the first steps only
        size.update(guard, model, optimizers)
    verdict = guard.check(step)
    if not verdict.stop:
        return verdict
    _stop(guard, verdict, step, save, metrics, scratch)


def _stop(guard: Guard, verdict: Verdict, step: Optional[int], save: Callable[[str], object],
          metrics: Optional[Mapping[str, Any]], scratch: Optional[str]) -> NoReturn:
    import ray.train

    report_checkpoint(guard, save, {**(metrics or {}), "cgwatch_stop_step": step},
                      scratch=scratch)
    ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED)
    saves.record_save(*_rank(), step, None)
    raise GuardStopped(verdict.message(), step)


def stopped_by_guard(error: BaseException) -> Optional[GuardStopped]:
    """The `GuardStopped` behind `error` when every failed worker of a Ray Train run was
    stopped by its guard (`ray.train.WorkerGroupError.worker_failures`), else None."""
    failures = getattr(error, "worker_failures", None)
    if not isinstance(failures, Mapping) or not failures:
        return None
    found = [f for f in failures.values() if isinstance(f, GuardStopped)]
    return found[0] if len(found) == len(failures) else None


def fit(trainer: Any) -> Any:
    """`trainer.fit()`; when the run failed because every worker's guard stopped it and
    `max_failures` was used up: the stop's message on stderr, exit 75 (module docstring)."""
    try:
        return trainer.fit()
    except Exception as error:
        stop = stopped_by_guard(error)
        if stop is None:
            raise
        from cgwatch.policy import EXIT_STATUS

        print(f"{stop} (Ray Train's max_failures used up; the checkpoint of step "
              f"{stop.step} resumes the run)", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_STATUS) from None


def _rank() -> tuple[int, int]:
    """(world rank, workers on this node) from Ray Train's context; (0, 1) outside one."""
    try:
        import ray.train

        context = ray.train.get_context()
        return int(context.get_world_rank()), int(context.get_local_world_size())
    except Exception:  # noqa: BLE001 - a record is a best effort; no context: one worker
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        return 0, int(local) if local.isdigit() else 1
