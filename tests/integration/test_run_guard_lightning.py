"""Lightning's own SIGTERM save under `cgwatch run --guard --restarts`, for real (issue 32
item 4): Lightning 2.6.6's signal connector is installed at every `fit()`, Slurm or not, and
turns SIGTERM into `SIGTERMException` at the next batch boundary; the stock
`OnExceptionCheckpoint` callback saves then, the job exits 0 (the exception is a SystemExit
without a code), and the next `fit()` resumes from that checkpoint by itself
(tests/integration/sigterm_lightning.py: no cgwatch and no handler in it). In a real v1
memory cgroup, a leak that restarts with the process: stopped, saved, restarted, resumed,
finished, every step's loss equal to an uninterrupted run's, nothing OOM-killed.

Lightning's SIGUSR1 requeue is not this path: outside Slurm nothing handles SIGUSR1 (it kills
the job, 138, nothing saved; training.NOTES §5), and inside Slurm its handler saves and
then asks Slurm to requeue the job (docs/never-lose-a-job.md says what that gives).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cgroup_helpers import MiB, Tree, oom_kills
from tests.integration.children import require
from tests.integration.test_run_guard_jit import guarded_run, losses, resumed_exactly

pytestmark = pytest.mark.integration

require("torch", "lightning", "torchdata")

JOB = str(Path(__file__).with_name("sigterm_lightning.py"))
LIMIT = 1024 * MiB  # ~0.45 GiB for the job (torch, Lightning) and run; ~550 steps of leak
STEPS = 800  # one restart, two at most


def test_lightning_sigterm_save_under_run_guard_restarts_resumes_exactly(
        tree: Tree, quiet_env: dict[str, str], tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    subprocess.run([sys.executable, JOB, str(reference), str(STEPS), "0"], env=quiet_env,
                   check=True, capture_output=True, timeout=600)
    want = {step: loss for _, step, loss in losses(reference)}
    assert sorted(want) == list(range(1, STEPS + 1))

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    argv = ["--guard", "--checkpoint-seconds", "1", "--checkpoint-dir", str(ckpt),
            "--restarts", "3", "--restart-delay", "0.5", "--", sys.executable, JOB,
            str(ckpt), str(STEPS), "1"]
    status, out, err, cgroup = guarded_run(tree, quiet_env, "lightning-restarts", LIMIT, argv)
    assert oom_kills(cgroup, tree.version) == 0, err[-3000:]
    assert status == 0, err[-3000:]
    restarts = re.findall(r"cgwatch run: restart (\d) of 3 in ", err)
    assert 1 <= len(restarts) <= 2, err[-3000:]
    assert len(re.findall(r"cgwatch guard: python3?[\w.]* saved and exited 0 [\d.]+ s after "
                          r"SIGTERM; checkpoint: \S+/on_exception\.ckpt; exit 75", err)) \
        == len(restarts), err[-3000:]
    resumed = [int(step) for step in re.findall(r"^resumed from step (\d+)$", out, re.M)]
    assert len(resumed) == len(restarts), out
    assert f"ended at step {STEPS}" in out
    resumed_exactly(ckpt, want, resumed)
    # Lightning's teardown removes on_exception.ckpt once a fit finishes
    assert not (ckpt / "on_exception.ckpt").exists()
