"""The zero-code path for Hugging Face users, for real (issue 32 items 3 and 4): an HF Trainer
job with transformers' own SIGTERM save (`TrainingArguments(enable_jit_checkpoint=True)`,
tests/integration/jit_train.py: no cgwatch and no handler in it) under `cgwatch run --guard
--save-delay 3`, in a real v1 memory cgroup.

- A leak that restarts with the process, `--restarts 3`: run's guard signals early enough for
  HF's 3 s wait, the step and the save (the lead holds `--save-delay`), the Trainer writes
  `checkpoint-<step>/` and exits 0, run restarts it, it resumes from that checkpoint, and it
  finishes: every step's loss equals an uninterrupted run's, and nothing is OOM-killed.
- A stop during an evaluation that gathers predictions past the limit: the jit checkpoint
  waits for a step boundary, and an evaluation has none until it ends, so the kernel kills
  the job with nothing saved; run says exactly that, never "saved".
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cgroup_helpers import MiB, Tree, oom_kills
from tests.integration.children import require
from tests.kernel_files import read

pytestmark = pytest.mark.integration

require("torch", "transformers")

JOB = str(Path(__file__).with_name("jit_train.py"))
# ~0.45 GiB for the job (torch, transformers) and run, the rest for a 1 MiB-a-step leak:
# ~1000 steps, ~40 s a life at ~26 steps a second, long enough for the forecast to see the
# growth 3 x its lead ((3 s + the 1 s save) x 1.5) ahead.
LIMIT = 1536 * MiB
STEPS = 1200  # one restart, two at most (the first life stopped at step 1128 at load 12)
EVAL_LIMIT = 1024 * MiB  # the evaluation's logits, ~25 MiB/s, reach it in ~25 s


def guarded(tree: Tree, env: dict[str, str], name: str, limit: int, ckpt: Path,
            options: list[str], job: list[str]) -> tuple[int, str, str, str]:
    """`cgwatch run --guard --save-delay 3 OPTIONS -- python jit_train.py JOB` in a cgroup
    of its own: run's status, stdout, stderr and the cgroup."""
    return guarded_run(tree, env, name, limit, [
        "--guard", "--save-delay", "3", "--checkpoint-seconds", "1", "--checkpoint-dir",
        str(ckpt), *options, "--", sys.executable, JOB, str(ckpt), *job])


def guarded_run(tree: Tree, env: dict[str, str], name: str, limit: int,
                options: list[str]) -> tuple[int, str, str, str]:
    """`cgwatch run OPTIONS` (CMD included) in a cgroup of its own, limited to `limit`:
    run's status, stdout, stderr and the cgroup."""
    cgroup = tree.make(name, limit=limit)
    argv = [sys.executable, "-m", "cgwatch.cli", "run", *options]
    proc = tree.spawn(cgroup, f"import sys\nos.execv(sys.executable, {argv!r})\n", env=env)
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        for pid in read(os.path.join(cgroup, "cgroup.procs")).split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        out, err = proc.communicate()
        pytest.fail(f"timed out\n{err[-3000:]}")
    lines = [line for line in err.splitlines() if line.startswith(("cgwatch guard: ",
                                                                   "cgwatch run: "))]
    print("\n".join(lines))  # the figures, for -s
    return proc.returncode, out, err, cgroup


def losses(ckpt: Path) -> list[tuple[str, int, float]]:
    """(life, step, loss) of every training step logged, in order."""
    rows = []
    for line in (ckpt / "losses.log").read_text().splitlines():
        life, step, loss = line.split()
        rows.append((life, int(step), float(loss)))
    return rows


def resumed_exactly(ckpt: Path, want: dict[int, float], saved_at: list[int]) -> None:
    """Every step ran; every step's loss logged (a step after the save runs again after the
    resume, and logs again) equals the uninterrupted run's, `==` on the floats; life k began
    at the step after the k-th save's."""
    got = losses(ckpt)
    assert {step for _, step, _ in got} == set(want)
    assert [(step, loss) for _, step, loss in got if loss != want[step]] == []
    for k, step in enumerate(saved_at, start=1):
        assert min(s for life, s, _ in got if life == str(k)) == step + 1, (k, step)


def test_hf_jit_checkpoint_under_run_guard_restarts_resumes_exactly(
        tree: Tree, quiet_env: dict[str, str], tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    subprocess.run([sys.executable, JOB, str(reference), str(STEPS), "train", "0"],
                   env=quiet_env, check=True, capture_output=True, timeout=600)
    want = {step: loss for _, step, loss in losses(reference)}
    assert sorted(want) == list(range(1, STEPS + 1))

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    status, out, err, cgroup = guarded(tree, quiet_env, "jit-restarts", LIMIT, ckpt,
                                       ["--restarts", "3", "--restart-delay", "0.5"],
                                       [str(STEPS), "train", "1"])
    assert oom_kills(cgroup, tree.version) == 0, err[-3000:]
    assert status == 0, err[-3000:]
    restarts = [int(step) for step in
                re.findall(r"cgwatch run: restart \d of 3 from step (\d+) in ", err)]
    assert 1 <= len(restarts) <= 2, err[-3000:]
    saved = re.findall(r"cgwatch guard: python3?[\w.]* saved and exited 0 ([\d.]+) s after "
                       r"SIGTERM; checkpoint: (\S+); exit 75", err)
    assert [Path(path).name for _, path in saved] == [f"checkpoint-{s}" for s in restarts], err
    # HF's jit checkpoint waits 3 s after the signal, then saves at the next step boundary
    assert all(float(seconds) >= 3.0 for seconds, _ in saved), saved
    assert [f"resumed from checkpoint-{s}" for s in restarts] == \
        [line for line in out.splitlines() if line.startswith("resumed from ")], out
    assert f"ended at step {STEPS}" in out
    resumed_exactly(ckpt, want, restarts)


def test_a_stop_during_evaluation_says_why_nothing_was_saved(
        tree: Tree, quiet_env: dict[str, str], tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    status, out, err, cgroup = guarded(tree, quiet_env, "jit-eval", EVAL_LIMIT, ckpt, [],
                                       ["100", "eval"])
    assert oom_kills(cgroup, tree.version) >= 1, err[-3000:]
    assert status == 137, err[-3000:]
    assert not list(ckpt.glob("checkpoint-*")), list(ckpt.iterdir())
    lines = [line for line in err.splitlines() if line.startswith("cgwatch guard: ")]
    assert len(lines) == 2, err[-3000:]
    assert lines[0].startswith("cgwatch guard: stopping to save: sending SIGTERM to "), lines
    # the training stopped at step 5 for the evaluation, and never went on
    assert max(step for _, step, _ in losses(ckpt)) == 5
    said = re.fullmatch(
        r"cgwatch guard: nothing was saved: python3?[\w.]* was killed by SIGKILL ([\d.]+) s "
        r"after SIGTERM, and nothing in (\S+) changed since the signal: its save waits 3\.0 s "
        r"\(--save-delay\), then for a step boundary, and none came in the [\d.]+ s after: "
        r"stopped during an evaluation or prediction loop, which has no step boundary until "
        r"it ends \(HF's enable_jit_checkpoint saves only at one\), or in a step longer than "
        r"that; exit 137", lines[1])
    assert said is not None, lines
    assert said.group(2) == str(ckpt)
