"""`cgwatch run --guard -- torchrun --nproc_per_node 2 job.py`, for real (issue 25 item 1):
two gloo CPU ranks in one real v1 memory cgroup, rank 1 leaking; run's guard signals
torchrun's workers (not torchrun: signalled itself, torchrun forwards the signal and then
exits 1 whatever its workers did, torch 2.13, so a save would never read as one).

- Every rank has a SIGTERM handler that sets a flag; the ranks agree on it each step (one
  all-reduce, so they stop at the same step), each writes its checkpoint and exits 0:
  torchrun exits 0 and `run` exits 75, with no OOM kill.
- No handler: the workers die of SIGTERM, torchrun exits 1 (ChildFailedError) and `run`
  exits 1, saying that at least one worker did not save: never 75.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cgwatch.cli.ckptwatch import STATE_NAME
from tests.cgroup_helpers import MiB, Tree, oom_kills
from tests.integration.children import free_port, require
from tests.kernel_files import read

pytestmark = pytest.mark.integration

require("torch")

LIMIT = 1536 * MiB  # ~0.8 GiB for torchrun and two ranks with torch, the rest for the leak
LEAK_MIB = 2  # written per step by rank 1 (20 steps a second: ~40 MiB/s)

JOB = textwrap.dedent("""
    import json, os, signal, sys, time
    HANDLER = sys.argv[1] == "handler"
    stop = [0]
    if HANDLER:  # first, before torch's import: the guard may signal at any time
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.__setitem__(0, 1))
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = sys.argv[2]
    kept = []
    step = 0
    while True:
        step += 1
        if rank == 1:
            kept.append(b"\\x5a" * (int(sys.argv[3]) << 20))
        flag = torch.tensor([stop[0]])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if flag.item():
            with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
                json.dump({"step": step, "rank": rank}, f)
            dist.destroy_process_group()
            # Not sys.exit: the interpreter's exit can abort a gloo rank (docs/guard.md,
            # "Ending a rank"; test_run_restarts_torchrun.py's job says why).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        time.sleep(0.05)
""")


def run_torchrun(tree: Tree, env: dict[str, str], tmp: Path, mode: str) -> tuple[int, str, str]:
    cgroup = tree.make(f"torchrun-{mode}", limit=LIMIT)
    job = tmp / "job.py"
    job.write_text(JOB)
    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    torchrun = str(Path(sys.executable).parent / "torchrun")
    argv = [sys.executable, "-m", "cgwatch.cli", "run", "--guard", "--checkpoint-seconds", "2",
            "--checkpoint-dir", str(ckpt), "--", torchrun, "--nproc_per_node", "2",
            "--master_port", str(free_port()), str(job), mode, str(ckpt), str(LEAK_MIB)]
    proc = tree.spawn(cgroup, f"import sys\nos.execv(sys.executable, {argv!r})\n", env=env)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        for pid in read(os.path.join(cgroup, "cgroup.procs")).split():
            try:  # every member: torchrun's workers have sessions of their own
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        out, err = proc.communicate()
        pytest.fail(f"timed out\n{err[-3000:]}")
    assert oom_kills(cgroup, tree.version) == 0, err[-3000:]
    print("\n".join(guard_lines(err)))  # the figures, for -s
    return proc.returncode, out, err


def guard_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("cgwatch guard: ")]


def test_every_rank_saved_and_run_exits_75(tree: Tree, env: dict[str, str],
                                           tmp_path: Path) -> None:
    status, out, err = run_torchrun(tree, env, tmp_path, "handler")
    assert status == 75, err[-3000:]
    saved = [json.loads((tmp_path / "ckpt" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert saved[0]["step"] == saved[1]["step"], saved
    lines = guard_lines(err)
    assert len(lines) == 2, err[-3000:]
    assert lines[0].startswith("cgwatch guard: stopping to save: sending SIGTERM to "
                               "torchrun's 2 worker(s) (pid "), lines
    assert lines[1].startswith("cgwatch guard: torchrun's 2 worker(s) saved and exited 0 "), lines
    assert lines[1].endswith("; exit 75 (saved, may be resumed)"), lines
    assert "; checkpoint: " + str(tmp_path / "ckpt" / "rank-") in lines[1], lines


def test_workers_without_a_handler_never_make_75(tree: Tree, env: dict[str, str],
                                                 tmp_path: Path) -> None:
    status, out, err = run_torchrun(tree, env, tmp_path, "none")
    assert status == 1, err[-3000:]
    # Nothing of the job's: the one entry may be the guard's own state, which run keeps in
    # --checkpoint-dir for the next life (cli/ckptwatch.py), whatever the job did.
    assert [p.name for p in (tmp_path / "ckpt").iterdir() if p.name != STATE_NAME] == []
    lines = guard_lines(err)
    assert len(lines) == 2, err[-3000:]
    assert lines[0].startswith("cgwatch guard: stopping to save: sending SIGTERM to "
                               "torchrun's 2 worker(s) (pid "), lines
    assert lines[1].startswith("cgwatch guard: torchrun exited 1 "), lines
    assert lines[1].endswith(" to its 2 worker(s): at least one did not save and exit 0 (its "
                             "summary above names it); exit 1"), lines
