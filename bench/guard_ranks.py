"""What the guard's agreement across ranks costs (cgwatch/ranks.py): two CPU ranks over gloo,
each timing `Guard.check()` far from every threshold with `sync_every=1` (an all-reduce at
every check) next to `sync_every=0` (no all-reduce), a bare one-int64 `all_reduce` and the
guard's own (`ranks.TorchRanks.max`), in alternating rounds. Needs torch (run it with
.venv-integration, made by tests/integration/setup); not part of `python -m bench`, whose
venv has no torch:

    .venv-integration/bin/python -m bench.guard_ranks [checks per round] [rounds]

Prints one JSON line per rank: median, p90 and p99 in microseconds per call. Started by a
launcher that sets RANK (torchrun), each process is one rank of the launcher's group: the
Slurm tier's two-node case runs it under `torchrun --nnodes 2` with one rank on each node
(tests/slurm/cases_twonode.py).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Callable


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_us": round(statistics.median(ordered) * 1e6, 1),
            "p90_us": round(ordered[int(0.9 * (len(ordered) - 1))] * 1e6, 1),
            "p99_us": round(ordered[int(0.99 * (len(ordered) - 1))] * 1e6, 1)}


def rank_main(checks: int, rounds: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import cgwatch
    from cgwatch import ranks

    dist.init_process_group("gloo")
    synced = cgwatch.Guard(events=False, sync_every=1)
    alone = cgwatch.Guard(events=False, sync_every=0)
    tensor = torch.zeros(1, dtype=torch.int64)

    def bare() -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)

    group = ranks.torch_ranks()
    assert group is not None

    def reduce_only() -> None:
        group.max(0)

    calls: dict[str, Callable[[], object]] = {
        "check, sync_every=1": synced.check, "check, sync_every=0": alone.check,
        "bare all_reduce (int64, MAX)": bare, "ranks.max (the guard's all-reduce)": reduce_only}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():  # warm-up (and the first sample of each guard)
        for _ in range(100):
            call()
    for _ in range(rounds):
        for name, call in calls.items():
            dist.barrier()  # both ranks enter each round together
            for _ in range(checks):
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
    assert not synced.check().stop
    out = {"rank": dist.get_rank(), "world": dist.get_world_size(),
           "backend": dist.get_backend(), "calls": checks * rounds,
           "torch": torch.__version__}
    out.update({name: _percentiles(t) for name, t in times.items()})
    dist.destroy_process_group()
    return out


def main(argv: list[str]) -> int:
    checks = int(argv[0]) if argv else 200
    rounds = int(argv[1]) if len(argv) > 1 else 5
    if os.environ.get("RANK") is not None:
        print(json.dumps(rank_main(checks, rounds)), flush=True)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.guard_ranks",
                                       str(checks), str(rounds)], env=env))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
