"""A small Ray Train job for the Ray side-by-side (bench/ray_side_by_side.py) and the
integration test of the Ray adapter (tests/integration/test_ray_train.py): a local Ray
(`ray.init(num_cpus=2)`, its session directory under the run's own directory), a
`TorchTrainer` of 2 CPU workers (gloo) training a tiny seeded model built here, one worker
leaking, and a line per trained step in a file per rank, so that a caller can count the
steps trained twice and compare losses with an uninterrupted run's.

    python bench/ray_train_job.py CONFIG_JSON

CONFIG_JSON keys (all optional but `dir`):
- dir: the run's directory (Ray's session dir `ray/` unless `ray_dir` names another: the
  path of its sockets must stay under 107 bytes; storage `storage/`, step lines
  `steps/rank<R>.jsonl`);
- ray_init: more keyword arguments of `ray.init` (`object_store_memory`, `_memory`);
- guard: "cgwatch" (cgwatch.integrations.ray.guard_step every step) or "none";
- steps, every (a scheduled checkpoint every `every` steps; 0: none), max_failures;
- leak_mib (written after every step by rank `leak_rank`), ballast_mib (written once before
  the first step), leak_attempts ("first": only an attempt that starts with no checkpoint
  leaks; "all"), sawtooth (0: a leak; K: the leak is freed every K steps, the healthy twin);
- rank_cgroup: a cgroup directory the leaking rank moves itself into before anything else;
- step_seconds: a sleep per step (a slower job gives the guard more steps).

Prints `RESULT {json}` (the run's end: "finished"; "exit 75" when the guard's stops used up
max_failures, from the adapter's `fit`; or "failed" and the error) and exits 0 unless the
driver itself failed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

LEAK: list[bytes] = []


def train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist
    from ray.train.torch import prepare_model

    rank = ray.train.get_context().get_world_rank()
    checkpoint = ray.train.get_checkpoint()
    leaks = rank == config.get("leak_rank", 1) and (
        config.get("leak_attempts", "first") == "all" or checkpoint is None)
    if leaks and config.get("rank_cgroup"):
        with open(os.path.join(config["rank_cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = 1
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, f"rank{rank}.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = state["step"] + 1
    step = first - 1

    def save(directory: str) -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step}, os.path.join(directory, f"rank{rank}.pt"))

    guard = None
    if config.get("guard") == "cgwatch":
        import cgwatch
        from cgwatch.integrations.ray import guard_step, report_checkpoint

        guard = cgwatch.Guard(**config.get("guard_kwargs", {}))
    if leaks and config.get("ballast_mib"):
        LEAK.append(b"\x01" * (config["ballast_mib"] << 20))
    every = config.get("every", 0)
    path = os.path.join(config["dir"], "steps", f"rank{rank}.jsonl")
    with open(path, "a") as lines:
        for step in range(first, config["steps"] + 1):
            g = torch.Generator().manual_seed(step * 1000 + rank)
            x = torch.randn(64, 32, generator=g)
            y = x.sum(dim=1, keepdim=True).sin()
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            lines.write(json.dumps({"pid": os.getpid(), "step": step, "loss": loss.item(),
                                    "first": first}) + "\n")
            lines.flush()
            if leaks and config.get("leak_mib"):
                sawtooth = config.get("sawtooth", 0)
                if sawtooth and step % sawtooth == 0:
                    del LEAK[1 if config.get("ballast_mib") else 0:]
                else:
                    LEAK.append(b"\x01" * (config["leak_mib"] << 20))
            if config.get("step_seconds"):
                time.sleep(config["step_seconds"])
            metrics = {"loss": loss.item(), "step": step}
            if guard is not None:
                guard_step(guard, step, save, metrics=metrics, model=model,
                           optimizers=[optimizer])
            if every and step % every == 0:
                if guard is not None:
                    report_checkpoint(guard, save, metrics)
                else:
                    import tempfile

                    with tempfile.TemporaryDirectory() as directory:
                        save(directory)
                        ray.train.report(metrics,
                                         checkpoint=ray.train.Checkpoint.from_directory(directory))
    dist.barrier()


def main() -> int:
    config = json.loads(sys.argv[1])
    root = config["dir"]
    os.makedirs(os.path.join(root, "steps"), exist_ok=True)
    started = time.monotonic()
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # Ray's session directory: its sockets' paths must stay under 107 bytes (AF_UNIX).
    ray.init(num_cpus=2, include_dashboard=False,
             _temp_dir=config.get("ray_dir") or os.path.join(root, "ray"),
             **config.get("ray_init", {}))
    result: dict[str, Any] = {}
    try:
        trainer = TorchTrainer(
            train_loop, train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(
                name="job", storage_path=os.path.join(root, "storage"),
                failure_config=FailureConfig(max_failures=config.get("max_failures", 3))))
        from cgwatch.integrations.ray import fit, stopped_by_guard

        try:
            if config.get("guard") == "cgwatch":
                fit(trainer)  # the adapter's: exit 75 when the stops used up max_failures
            else:
                trainer.fit()
            result["end"] = "finished"
        except SystemExit as exit:
            result["end"] = f"exit {exit.code}"
        except Exception as error:  # noqa: BLE001 - the run's end is what is measured
            result["end"] = "failed"
            result["error"] = f"{type(error).__name__}: {error}"[:2000]
            result["guard_stop"] = stopped_by_guard(error) is not None
    finally:
        ray.shutdown()
    result["seconds"] = round(time.monotonic() - started, 1)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
