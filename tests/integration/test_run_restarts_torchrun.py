"""`cgwatch run --guard --restarts 3 -- torchrun --nproc_per_node 2 job.py`, for real (issue 25
items 2 and 5): a tiny DDP model (torch CPU, gloo) in one real v1 memory cgroup, rank 1
leaking in a way that restarts with the process. run's guard signals the workers; each rank
agrees on the flag (one all-reduce a step), saves its state at that step
(`rank{R}-step-{K}.pt`: model, optimizer, its generator, its losses) and exits 0; torchrun
exits 0 and run, seeing a save, starts torchrun again with CGWATCH_RESTART=k; the ranks
resume from their newest checkpoint. The job runs all its steps, its losses equal an
uninterrupted run's step for step, no step is redone, and nothing is OOM-killed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cgroup_helpers import MiB, Tree, oom_kills
from tests.integration.children import free_port, require
from tests.kernel_files import read

pytestmark = pytest.mark.integration

require("torch")

LIMIT = 1536 * MiB  # ~0.8 GiB for torchrun and two ranks with torch, the rest for the leak
LEAK_MIB = 2  # written per step by rank 1 (20 steps a second: ~40 MiB/s)
STEPS = 1000  # ~420 a life here: two restarts

JOB = textwrap.dedent("""
    import glob, os, signal, sys, time
    stop = [0]
    # first, before torch's import: the guard may signal at any time
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.__setitem__(0, 1))
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out, steps, leak, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    truth = torch.arange(16, dtype=torch.float32) / 16
    step, losses = 0, []
    saved = sorted(glob.glob(os.path.join(out, f"rank{rank}-step-*.pt")))
    if saved:
        state = torch.load(saved[-1], weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, losses = state["step"], state["losses"]
        print(f"rank {rank} resumed at step {step}", flush=True)
    kept = []
    with open(os.path.join(out, f"rank{rank}.log"), "a") as log:
        while step < steps:
            x = torch.randn(8, 16, generator=gen)
            y = x @ truth + 0.1 * torch.randn(8, generator=gen)
            loss = ((model(x).squeeze(1) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            log.write(f"{os.environ.get('CGWATCH_RESTART', '0')} {step}\\n")
            log.flush()
            step += 1
            if rank == 1 and leak:
                kept.append(b"\\x5a" * (leak << 20))
            flag = torch.tensor([stop[0]])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if flag.item():
                break
            time.sleep(pause)
    path = os.path.join(out, f"rank{rank}-step-{step:06d}.pt")
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                "gen": gen.get_state(), "step": step, "losses": losses}, path + ".tmp")
    os.rename(path + ".tmp", path)
    dist.destroy_process_group()
    # Leave without the interpreter's exit (docs/guard.md, "Ending a rank"): a gloo worker
    # thread may still be releasing the last all-reduce's work, and with it `flag`, whose
    # Python object it must decref under the GIL; once Py_Finalize has begun, CPython ends
    # a thread that asks for the GIL with pthread_exit, whose unwinding crosses a noexcept
    # C++ destructor (~AsyncWork): std::terminate, SIGABRT (torch 2.13 CPU, Python 3.11).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
""")


def torchrun_argv(job: Path, ckpt: Path, leak: int, pause: float) -> list[str]:
    torchrun = str(Path(sys.executable).parent / "torchrun")
    return [torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()), str(job),
            str(ckpt), str(STEPS), str(leak), str(pause)]


def kill_members(cgroup: str) -> None:
    for pid in read(os.path.join(cgroup, "cgroup.procs")).split():
        try:  # every member: torchrun's workers have sessions of their own
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def final_losses(ckpt: Path, rank: int) -> list[float]:
    import torch

    state = torch.load(ckpt / f"rank{rank}-step-{STEPS:06d}.pt", weights_only=False)
    losses: list[float] = state["losses"]
    return losses


def test_restarts_around_torchrun_finish_the_job(tree: Tree, env: dict[str, str],
                                                 tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    reference = tmp_path / "reference"
    reference.mkdir()
    subprocess.run(torchrun_argv(job, reference, 0, 0.0), env=env, check=True,
                   capture_output=True, timeout=300)
    cgroup = tree.make("torchrun-restarts", limit=LIMIT)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    argv = [sys.executable, "-m", "cgwatch.cli", "run", "--guard", "--checkpoint-seconds", "2",
            "--checkpoint-dir", str(ckpt), "--restarts", "3", "--restart-delay", "0.5", "--",
            *torchrun_argv(job, ckpt, LEAK_MIB, 0.05)]
    proc = tree.spawn(cgroup, f"import sys\nos.execv(sys.executable, {argv!r})\n", env=env)
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        kill_members(cgroup)
        out, err = proc.communicate()
        pytest.fail(f"timed out\n{err[-3000:]}")
    lines = [line for line in err.splitlines() if line.startswith(("cgwatch guard: ",
                                                                   "cgwatch run: "))]
    print("\n".join(lines))  # the figures, for -s
    assert oom_kills(cgroup, tree.version) == 0, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    restarts = [int(step) for step in
                re.findall(r"cgwatch run: restart \d of 3 from step (\d+) in ", err)]
    assert 2 <= len(restarts) <= 3, lines
    assert lines[-1].startswith("cgwatch run: torchrun ended with exit 0 after "), lines
    assert sum(" worker(s) saved and exited 0 " in line for line in lines) == len(restarts)
    for rank in (0, 1):
        # Every step once, in order: the save is at the stop, nothing is redone.
        logged = (ckpt / f"rank{rank}.log").read_text().split("\n")[:-1]
        assert [int(line.split()[1]) for line in logged] == list(range(STEPS)), rank
        for k, step in enumerate(restarts, start=1):
            assert f"{k} {step}" in logged and f"rank {rank} resumed at step {step}" in out
        assert final_losses(ckpt, rank) == final_losses(reference, rank), rank
