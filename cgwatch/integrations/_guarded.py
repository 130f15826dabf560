"""Internal. What the adapters share. The memory guard's framework callbacks
(`transformers.py`, `lightning.py`): their guard (given, or made from keyword arguments at
first use), the verdict they acted on, the exit after the framework has returned. Every
adapter (those two and `deepspeed.py`'s accelerator): the class built on top of the
framework's base only when first asked for (`LazyClass`: importing an adapter imports no
framework, and this module imports no guard until one is made). The callbacks also say,
under `cgwatch run`, that this rank started and that it saved after its guard's stop
(`cgwatch/saves.py`: how `run` exits 75 when the launcher cannot say it). And every guarding
adapter (the two callbacks, `deepspeed_guard.guard_step`) tells a guard the user gave no
save time or size what its checkpoint holds (`state_bytes`, `CheckpointSize`): the lead
before the first timed save is then that size over the disk's rate, not the working set."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from cgwatch.guard import Guard
    from cgwatch.policy import Verdict


# The framework's files beside the model's and optimizer's tensors, for the estimate. Measured
# with tests/integration's tiny models (transformers 5.24.0, lightning 2.6.6): the Trainer's
# checkpoint-<step>/ held 22 KiB besides model.safetensors and optimizer.pt (rng_state.pth
# 14 KiB, training_args.bin 5 KiB, scheduler.pt, trainer_state.json, config.json,
# generation_config.json) and those two held the tensors' bytes to 2.5 % (pickle framing); a
# Lightning .ckpt held 7 KiB besides its tensors (loops, callbacks, hyper-parameters).
# 64 KiB covers those with room (a longer log history in trainer_state.json), and is
# negligible in the lead (0.6 ms at 100 MiB/s; a small model's lead is the 1 s floor) while
# keeping a small model's estimate near its real file (the test holds it within 0.5-2x).
EXTRAS_BYTES = 64 << 10
_ESTIMATES = 3  # estimates at most per guard: until an optimizer has state (its first step)


def state_bytes(model: Any, optimizers: Iterable[Any] = ()) -> int:
    """Bytes of a checkpoint's tensors: `model`'s parameters and buffers (`parameters()`,
    `buffers()`), each optimizer's state tensors (`optimizer.state`: parameter -> {name:
    tensor}, Adam's exp_avg, exp_avg_sq and step) and its parameters that are not the
    model's (a ZeRO or mixed-precision optimizer's fp32 master copies, which its
    checkpoint holds too). Duck-typed: a tensor is anything with `numel()` and
    `element_size()`; one storage is counted once, by `data_ptr()` (tied weights, a
    parameter also passed as a buffer), else by identity. Reads nothing: no torch import."""
    seen: dict[int, int] = {}

    def add(tensor: Any) -> None:
        numel = getattr(tensor, "numel", None)
        size = getattr(tensor, "element_size", None)
        if not callable(numel) or not callable(size):
            return  # a Python number (an old optimizer's int step): no tensor
        pointer = getattr(tensor, "data_ptr", None)
        key = pointer() if callable(pointer) else 0
        if not key:  # no storage address (an empty or a meta tensor, a fake): identity
            key = -id(tensor)
        seen[key] = max(seen.get(key, 0), int(numel()) * int(size()))

    for name in ("parameters", "buffers"):
        tensors = getattr(model, name, None)
        if callable(tensors):
            for tensor in tensors():
                add(tensor)
    for optimizer in optimizers:
        if optimizer is None:
            continue
        for per_parameter in _optimizer_state(optimizer).values():
            values = per_parameter.values() if isinstance(per_parameter, Mapping) \
                else (per_parameter,)
            for value in values:
                add(value)
        for group in getattr(optimizer, "param_groups", None) or ():
            for tensor in group.get("params", ()) if isinstance(group, Mapping) else ():
                add(tensor)
    return sum(seen.values())


def has_state(optimizers: Iterable[Any]) -> bool:
    """Whether any optimizer holds state yet (Adam's appears at its first `step()`)."""
    return any(optimizer is not None and len(_optimizer_state(optimizer)) > 0
               for optimizer in optimizers)


def _optimizer_state(optimizer: Any) -> Mapping[Any, Any]:
    state = getattr(optimizer, "state", None)
    return state if isinstance(state, Mapping) else {}


class CheckpointSize:
    """Gives one guard the estimate of its job's checkpoint (`state_bytes` plus
    EXTRAS_BYTES): at the first steps, until an optimizer has state, at most _ESTIMATES
    times (an optimizer with no state at all, SGD without momentum, stops there), and never
    when the user gave a save's time or size (`Guard.estimate_checkpoint` refuses). After
    that, `update` is one attribute test a step."""

    def __init__(self) -> None:
        self.done = False
        self.estimates = 0
        self.nbytes: Optional[int] = None  # the last estimate taken by the guard

    def update(self, guard: Guard, model: Any, optimizers: Iterable[Any]) -> None:
        if self.done:
            return
        optimizers = [o for o in optimizers if o is not None]
        self.estimates += 1
        self.done = has_state(optimizers) or self.estimates >= _ESTIMATES
        nbytes = state_bytes(model, optimizers) + EXTRAS_BYTES
        if guard.estimate_checkpoint(nbytes):
            self.nbytes = nbytes
        else:
            self.done = True  # the user's figure stands


class GuardUser:
    """Mixed into a framework's callback class (before the framework's base)."""

    guard: Optional[Guard]
    stopped: Optional[Verdict]  # the verdict acted on; None: the guard never stopped the run
    _guard_kwargs: dict[str, Any]

    def _use_guard(self, guard: Optional[Guard], guard_kwargs: dict[str, Any]) -> None:
        self.guard = guard
        self.stopped = None
        self._guard_kwargs = guard_kwargs
        self._rank: Optional[tuple[int, int]] = None  # (global rank, ranks on this node)
        self.checkpoint_size = CheckpointSize()

    def _record_start(self, rank: int, local_world_size: int) -> None:
        """This rank's trainer started (for `cgwatch run`, saves.py; nothing elsewhere)."""
        from cgwatch import saves

        self._rank = (rank, local_world_size)
        saves.record_start(rank, local_world_size)

    def _record_save(self, step: Optional[int], checkpoint: Optional[str]) -> None:
        """This rank's part of the guard's save is done (saves.py)."""
        if self._rank is not None:
            from cgwatch import saves

            saves.record_save(*self._rank, step, checkpoint)

    def _size_checkpoint(self, guard: Guard, model: Any, optimizers: Iterable[Any]) -> None:
        """At the first steps: the guard's checkpoint size from the model and optimizers
        (`CheckpointSize`), unless the user gave one."""
        if not self.checkpoint_size.done:
            self.checkpoint_size.update(guard, model, optimizers)

    def _the_guard(self) -> Guard:
        if self.guard is None:
            from cgwatch.guard import Guard  # here: LazyClass's users need no guard

            self.guard = Guard(**self._guard_kwargs)
        return self.guard

    def exit_if_stopped(self) -> None:
        """If the guard stopped training: print its verdict and exit with
        `cgwatch.GUARD_EXIT_STATUS` (75). Otherwise return."""
        if self.stopped is not None:
            self._the_guard().exit(self.stopped)


class LazyClass:
    """A class built once, at the first `get()`, by `build()` (which imports the framework)."""

    def __init__(self, build: Callable[[], type]) -> None:
        self._build = build
        # Reentrant: the framework's import inside build() can run an import hook that asks
        # for the class again on this thread (DeepSpeed's accelerator: the autoload hook
        # fires while `import deepspeed` runs), which must not deadlock.
        self._lock = threading.RLock()
        self._class: Optional[type] = None

    def get(self) -> type:
        """The class (built by the first call)."""
        with self._lock:
            if self._class is None:
                built = self._build()
                if self._class is None:  # else a get() inside the build built it: keep that
                    self._class = built
            return self._class

    def built(self) -> Optional[type]:
        """The class if a `get()` has built it, else None (never builds)."""
        return self._class

    def module_getattr(self, name: str, module: str) -> Callable[[str], Any]:
        """A module `__getattr__` that answers `name` with the class, built then."""

        def __getattr__(attribute: str) -> Any:
            if attribute == name:
                return self.get()
            raise AttributeError(f"module {module!r} has no attribute {attribute!r}")

        return __getattr__
