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

import logging
import sys

from . import policy
from .frozen import replace
from .policy import Verdict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Protocol

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


class Agreement:
    """The verdict a rank acts on (guard.py's module docstring, "Distributed jobs"): every
    `sync_every`-th check one all-reduce across `group` (None: torch.distributed's default
    group, looked for at each check until found, so a group initialised after the guard was
    made is used from its first check on); between, the last agreed verdict stands.
    `announce` is called with another rank's stop when the agreed decision changes to it."""

    def __init__(self, sync_every: int, group: Optional[Ranks], first: Verdict,
                 announce: Callable[[Verdict], None]) -> None:
        self.sync_every = sync_every
        self.group = group
        self.agreed = first  # what the ranks last agreed on
        self._announce = announce
        self._calls = 0  # checks since the group was found: every sync_every-th agrees

    def at_check(self, verdict: Verdict, step: Optional[int]) -> Verdict:
        """This rank's `verdict` at check `step` -> the one all ranks act on."""
        if not self.sync_every:
            return verdict
        group = self.group
        if group is None:
            group = self.group = torch_ranks()  # a sys.modules lookup without torch
            if group is None:
                return verdict
            self._calls = 0
        self._calls += 1
        if (self._calls - 1) % self.sync_every:
            return self.agreed
        return self._agree(group, verdict, step)

    def _agree(self, group: Ranks, verdict: Verdict, step: Optional[int]) -> Verdict:
        try:
            rank = group.rank
            agreed = decode(group.max(encode(verdict.stop, verdict.trigger, rank)))
        except Exception as e:  # noqa: BLE001 - a peer gone: its socket is closed, decide alone
            logging.getLogger("cgwatch").warning(
                "cgwatch guard: the all-reduce across ranks failed (%r); this rank decides "
                "alone from now on", e)
            self.sync_every = 0
            return verdict
        previous = self.agreed
        if agreed is None:
            self.agreed = verdict  # no rank, this one included, said stop
        elif verdict.stop and agreed[0] == verdict.trigger:
            # Ours says it all (another rank may have said the same), at the step all act.
            self.agreed = verdict if verdict.step == step else replace(verdict, step=step)
        else:
            self.agreed = Verdict(True, agreed[0], lead=verdict.lead, step=step,
                                  rank=agreed[1])
        if self.agreed.rank is not None and self.agreed.key() != previous.key():
            self._announce(self.agreed)
        return self.agreed
