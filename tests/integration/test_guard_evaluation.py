"""The guard in a job's evaluation, for real (issue 32 item 3): the host OOM that Hugging Face
users meet most is an evaluation gathering its predictions, and the adapters once checked
only after training steps (the Trainer with `GuardCallback()` was OOM-killed in its
evaluation, 2 of 2, nothing saved). In a real v1 memory cgroup, torch on the CPU, tiny models
built locally (tests/integration/guarded_train.py's evaluation modes: an evaluation after
steps 20 and 40 that keeps ~8 MiB of predictions a batch, 800 MiB in all), the adapters with their
documented defaults, `GuardCallback()`:

- HF's Trainer and Lightning, one process, an evaluation that gathers past the limit: the
  guard stops it during that evaluation (after some of its batches, at the training's step
  20), the checkpoint of step 20 is written (HF: `checkpoint-20/`; Lightning:
  `guard-step=20.ckpt`), the job exits 75, and the kernel killed nothing. Resumed in the
  same limit, the job trains steps 21-40 (it does not redo the evaluation of step 20) with
  losses `==` an uninterrupted run's (the same job in a limit it never nears) step for step,
  then stops again, saved, in its next evaluation. The HF model trains with dropout: equal
  losses also say the RNG states saved in the evaluation are those the uninterrupted run
  trained on after it.
- HF, a healthy evaluation that takes the job to 78-95 % of its limit and lets go: not
  stopped, it runs to its end (exit 0, no OOM kill).
- HF as two gloo ranks under torchrun, under `cgwatch run` (rank 1 alone in a limited
  cgroup, as in test_guard_ranks_trainers.py; both ranks gather both ranks' predictions):
  both ranks stop at the same check of the evaluation, both save their part of
  `checkpoint-20/` and exit 75, and `run` exits 75 having read both records.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any, NamedTuple, Optional

import pytest

from tests.cgroup_helpers import MiB, Tree, limit_file, oom_kills, read
from tests.integration.children import free_port, require, run_in

pytestmark = pytest.mark.integration

require("torch", "transformers", "lightning", "torchdata")

from cgwatch import GUARD_EXIT_STATUS  # noqa: E402
from tests.integration.test_guard_ranks_trainers import launch  # noqa: E402
from tests.integration.test_guard_training import LAUNCH, TRAIN  # noqa: E402

EVAL_AT = 20  # guarded_train.EVAL_AT: evaluations after steps 20 and 40
STEPS = 40
LIMIT = 768 * MiB  # torch + a framework take ~250-450 MiB of it
ROOMY = 2048 * MiB  # the uninterrupted run: its evaluation's 800 MiB fit
GATHERED_MIB = 800  # an evaluation's predictions in all: 100 batches of 8 MiB, past LIMIT
SPIKE_MIB = 440  # the healthy evaluation's: 55 batches, to 78-95 % of SPIKE_LIMIT
# (seen: 80.6-89.8 %, 5 runs at load 10-15; the cgroup's page cache moves it by ~100 MiB,
# and 460 MiB once reached 95 %, where the reserve stops a job by design)
SPIKE_LIMIT = 1024 * MiB
TIMEOUT = 420  # at load 10-20 one run's imports alone took up to 100 s (8 s unloaded)


class Run(NamedTuple):
    rc: Any
    result: Optional[dict[str, Any]]  # None: it wrote none (killed)
    oom_kills: int
    peak: int  # the cgroup's highest usage (v1 memory.max_usage_in_bytes)
    log: str


def run(tree: Tree, env: dict[str, str], out: Path, framework: str, mode: str, limit: int,
        gathered_mib: int = GATHERED_MIB) -> Run:
    """One single-process run of guarded_train.py in a fresh cgroup of `limit` bytes."""
    cgroup = tree.make(f"eval-{framework}-{mode}-{uuid.uuid4().hex[:6]}", limit)
    args = (str(TRAIN), framework, mode, STEPS, str(out), gathered_mib, 1, free_port(),
            TIMEOUT)
    got = run_in(tree, cgroup, f"ARGS = {args!r}\n" + LAUNCH, env, timeout=TIMEOUT + 30)
    path, log = out / f"{mode}-rank0.json", out / f"{mode}-rank0.log"
    result = json.loads(path.read_text()) if path.exists() else None
    peak_file = "memory.max_usage_in_bytes" if tree.version == 1 else "memory.peak"
    peak = int(read(f"{cgroup}/{peak_file}"))
    set_limit = int(read(f"{cgroup}/{limit_file(tree.version)}"))
    assert set_limit == limit, (set_limit, limit)
    text = f"--- {mode} (rc {got['rcs'][0]}):\n" + (log.read_text()[-4000:] if log.exists() else "")
    print(f"{framework} {mode}: rc {got['rcs'][0]} in {got['seconds']:.1f} s, highest usage "
          f"{peak / MiB:.0f} MiB of {limit // MiB}, eval batches "
          f"{(result or {}).get('eval_batches')}, verdict "
          f"{(result or {}).get('verdict', {}).get('message')}")
    return Run(got["rcs"][0], result, oom_kills(cgroup, tree.version), peak, text)


def steps(result: Optional[dict[str, Any]]) -> list[int]:
    assert result is not None
    return sorted(map(int, result["losses"]))


def checkpoint_of(framework: str, out: Path, step: int) -> Path:
    directory = out / f"{framework}-checkpoint"
    if framework == "hf":
        path = directory / f"checkpoint-{step}"
        state = json.loads((path / "trainer_state.json").read_text())
        assert state["global_step"] == step, state
        names = {p.name for p in path.iterdir()}
        assert {"model.safetensors", "optimizer.pt"} <= names, names
        assert "rng_state.pth" in names or "rng_state_1.pth" in names, names  # 1 or 2 ranks
        return path
    return directory / f"guard-step={step}.ckpt"


def stopped_in_evaluation(got: Run, framework: str, out: Path, step: int) -> None:
    """Saved and stopped by the guard during the evaluation after `step`: its status, no
    kill, the checkpoint of that step."""
    assert got.rc == GUARD_EXIT_STATUS, got.log
    assert got.oom_kills == 0, got.log
    result = got.result
    assert result is not None and result.get("stopped_in_eval"), got.log
    verdict = result["verdict"]
    assert verdict["stop"] and verdict["step"] == step, verdict
    assert verdict["message"].startswith(f"cgwatch guard: save and stop at step {step}: ")
    assert verdict["message"] in got.log  # printed by guard.exit on stderr
    assert max(steps(result)) == step  # no training step after the evaluation began
    assert Path(result["checkpoint"]) == checkpoint_of(framework, out, step), result
    assert checkpoint_of(framework, out, step).exists()


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_a_stop_in_evaluation_saves_the_step_and_resumes_exactly(
        tree: Tree, env: dict[str, str], tmp_path: Path, framework: str) -> None:
    guarded = run(tree, env, tmp_path, framework, "evalguard", LIMIT)
    stopped_in_evaluation(guarded, framework, tmp_path, EVAL_AT)
    assert guarded.result is not None
    assert steps(guarded.result) == list(range(1, EVAL_AT + 1))
    # Stopped in that evaluation, after some of its batches, long before its 200.
    seen = guarded.result["eval_batches"] - (2 if framework == "lightning" else 0)  # sanity
    assert 0 < seen < GATHERED_MIB // 8, guarded.result["eval_batches"]

    reference = run(tree, env, tmp_path, framework, "evalreference", ROOMY)
    assert reference.rc == 0 and reference.oom_kills == 0, reference.log
    assert steps(reference.result) == list(range(1, STEPS + 1))
    resumed = run(tree, env, tmp_path, framework, "evalresume", LIMIT)
    # Steps 21-40, then its next evaluation, which stops it again, saved.
    stopped_in_evaluation(resumed, framework, tmp_path, STEPS)
    assert steps(resumed.result) == list(range(EVAL_AT + 1, STEPS + 1)), \
        "the resumed run goes on at the step after the saved one"
    whole = reference.result["losses"]  # type: ignore[index]
    before, after = guarded.result["losses"], resumed.result["losses"]  # type: ignore[index]
    assert [before[str(s)] for s in range(1, EVAL_AT + 1)] == \
        [whole[str(s)] for s in range(1, EVAL_AT + 1)]
    assert [after[str(s)] for s in range(EVAL_AT + 1, STEPS + 1)] == \
        [whole[str(s)] for s in range(EVAL_AT + 1, STEPS + 1)]


def test_a_healthy_evaluation_near_the_limit_is_not_stopped(
        tree: Tree, env: dict[str, str], tmp_path: Path) -> None:
    got = run(tree, env, tmp_path, "hf", "evalspike", SPIKE_LIMIT, SPIKE_MIB)
    assert got.result is not None and "verdict" not in got.result, \
        f"the guard stopped a healthy evaluation: {(got.result or {}).get('verdict')}"
    assert got.rc == 0 and got.oom_kills == 0, got.log
    assert steps(got.result) == list(range(1, STEPS + 1))
    assert got.result["eval_batches"] == 2 * -(-SPIKE_MIB // 8)  # both evaluations, whole
    # The premise: the evaluations took the job near its limit.
    assert 0.78 * SPIKE_LIMIT <= got.peak <= 0.95 * SPIKE_LIMIT, got.peak / SPIKE_LIMIT


RANKS_GATHERED_MIB = 800  # each rank holds both ranks' predictions: 16 MiB a batch


def test_two_ranks_stop_in_evaluation_together_and_run_exits_75(
        tree: Tree, env: dict[str, str], tmp_path: Path) -> None:
    got = launch(tree, env, tmp_path, "hf", mode="evalonecgroup", steps=STEPS,
                 wrap=(sys.executable, "-m", "cgwatch", "run", "--"),
                 faults={"GUARDTEST_EVAL_MIB": str(RANKS_GATHERED_MIB)})
    assert got.oom_kills == 0, got.logs
    assert got.statuses == [GUARD_EXIT_STATUS] * 2, got.logs
    v0, v1 = (r["verdict"] for r in got.results)
    assert v0["step"] == v1["step"] == EVAL_AT, (v0, v1)
    assert v1["rank"] is None and v0["rank"] == 1, (v0, v1)
    # The same number of evaluation batches on both ranks: they stopped at one check.
    batches = [r["eval_batches"] for r in got.results]
    assert batches[0] == batches[1] and 0 < batches[0] < RANKS_GATHERED_MIB // 16, batches
    for r, result in enumerate(got.results):
        assert result["stopped_in_eval"] and max(map(int, result["losses"])) == EVAL_AT, r
    path = checkpoint_of("hf", tmp_path, EVAL_AT)
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in path.iterdir()}
    assert (f"cgwatch run: every rank (2) saved at step {EVAL_AT} after the guard's stop; "
            ) in got.launcher_log, got.launcher_log[-3000:]
    assert got.launcher_rc == GUARD_EXIT_STATUS, got.logs

