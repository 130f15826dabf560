"""A few ZeRO steps of a tiny model on DeepSpeed's CPU accelerator; prints one JSON line.

Run by tests/integration/test_deepspeed.py inside a limited cgroup, once per mode:
  python zero_steps.py plain     DeepSpeed's own CPU_Accelerator (psutil: host memory)
  python zero_steps.py cgwatch   cgwatch.integrations.deepspeed.install() first
One process, gloo, world size 1: RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT come from
the environment. Records the losses of each stage and every available_memory() answer ZeRO
asked for while it planned its flat buffers.
"""

from __future__ import annotations

import json
import sys
from typing import Any

STAGES = (1, 2)
STEPS = 4
BATCH = 8


def main(mode: str) -> dict[str, Any]:
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    if mode == "cgwatch":
        from cgwatch.integrations import deepspeed as cgds

        cgds.install()
    elif mode != "plain":
        raise SystemExit(f"unknown mode {mode!r}")

    accel = get_accelerator()
    seen: list[int] = []
    answer = accel.available_memory

    def recording_available_memory(device_index: Any = None) -> int:
        value = int(answer(device_index))
        seen.append(value)
        return value

    accel.available_memory = recording_available_memory  # instance attribute: only ZeRO's calls

    # init_distributed would JIT-compile DeepSpeed's shared-memory allreduce op on the CPU
    # accelerator (about a minute of g++ on a fresh machine), useless at world size 1: mark it
    # incompatible, which is what DeepSpeed's own check does where it cannot be built.
    deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    out: dict[str, Any] = {
        "mode": mode,
        "accelerator": type(accel).__name__,
        "total_memory": accel.total_memory(),
        "losses": {},
        "zero_available_memory": {},
    }
    gen = torch.Generator().manual_seed(1234)
    data = torch.randn(STEPS * BATCH, 16, generator=gen)
    target = torch.randn(STEPS * BATCH, 1, generator=gen)
    for stage in STAGES:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        config = {
            "train_micro_batch_size_per_gpu": BATCH,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": stage},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**6,
            "wall_clock_breakdown": False,
        }
        del seen[:]
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        out["zero_available_memory"][str(stage)] = list(seen)
        out.setdefault("optimizer", {})[str(stage)] = type(engine.optimizer).__name__
        losses = []
        for step in range(STEPS):
            xb = data[step * BATCH:(step + 1) * BATCH]
            yb = target[step * BATCH:(step + 1) * BATCH]
            loss = torch.nn.functional.mse_loss(engine(xb), yb)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        out["losses"][str(stage)] = losses
        engine.destroy()
    return out


if __name__ == "__main__":
    result = main(sys.argv[1])
    print("RESULT " + json.dumps(result), flush=True)
