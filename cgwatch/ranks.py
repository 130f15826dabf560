"""Internal. The same decision on every rank: the guard's verdicts of all ranks of a
distributed job meet in one small all-reduce, so every rank saves and stops at the same step.

Why: a checkpoint that is collective (DeepSpeed ZeRO's `save_checkpoint`, FSDP's, Lightning's
`trainer.save_checkpoint` under DDP, HF Trainer's save with a sharded optimizer) waits for
every rank. A rank that decides alone sits in the save's collective while the others sit in
the next step's gradient all-reduce: both wait for gloo's or NCCL's timeout (30 min by
default). Measured with HF Trainer 5.24 and two gloo ranks: `should_save` on rank 0 only
hangs; on both it writes `checkpoint-20` and stops (docs/guard.md, "What the adapters rely on").

What goes over the wire: one int64 per rank, MAX-reduced. 0 says "go on"; a stopping rank
sends `code << 32 | rank`, where `code` ranks its trigger by urgency (RESERVE highest), so the
result names the most urgent trigger any rank saw and the highest rank that saw it.

torch is never imported here: `torch_ranks()` looks for an already imported
`torch.distributed` in `sys.modules` (a job that never imported it cannot have initialised
it), so `import cgwatch` and a guard in a job without torch stay light.
"""

from __future__ import annotations

import sys

from . import policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional, Protocol

    class Ranks(Protocol):
        """What the guard needs from a process group: this process's rank, and the MAX of
        one integer over every rank (a collective: every rank must call it)."""

        @property
        def rank(self) -> int: ...

        def max(self, value: int) -> int: ...

_RANK_BITS = 32
# Highest code for the most urgent trigger: MAX then picks it (policy.TRIGGERS is in order).
_CODES = {trigger: len(policy.TRIGGERS) - i for i, trigger in enumerate(policy.TRIGGERS)}
_TRIGGERS = {code: trigger for trigger, code in _CODES.items()}


def encode(stop: bool, trigger: str, rank: int) -> int:
    """This rank's contribution to the all-reduce (module docstring)."""
    if not stop:
        return 0
    return _CODES.get(trigger, 1) << _RANK_BITS | rank


def decode(value: int) -> Optional[tuple[str, int]]:
    """(trigger, rank) of the MAX over ranks; None when no rank said stop."""
    if value <= 0:
        return None
    code, rank = value >> _RANK_BITS, value & ((1 << _RANK_BITS) - 1)
    return _TRIGGERS.get(code, policy.RESERVE), rank


class TorchRanks:
    """The default process group of an initialised torch.distributed."""

    def __init__(self, dist: Any) -> None:
        import torch

        self._dist = dist
        self.rank: int = dist.get_rank()
        # NCCL reduces only CUDA tensors; gloo (and a "cpu:gloo,cuda:nccl" group) CPU ones.
        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        self._tensor = torch.zeros(1, dtype=torch.int64, device=device)  # reused every time

    def max(self, value: int) -> int:
        self._tensor.fill_(value)
        self._dist.all_reduce(self._tensor, op=self._dist.ReduceOp.MAX)
        return int(self._tensor.item())


def torch_ranks() -> Optional[TorchRanks]:
    """torch.distributed's default group when it is initialised with more than one rank,
    else None; never imports torch."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        return TorchRanks(dist)
    except Exception:  # noqa: BLE001 - a half-torn-down group: decide alone
        return None
