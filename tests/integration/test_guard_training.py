"""The memory guard where users train, for real: a leak at a controlled rate inside a real
memory-limited cgroup (v1 here), torch on the CPU, tiny models built locally.

For each of plain PyTorch (two gloo ranks, DDP), Hugging Face's Trainer, Lightning and
DeepSpeed ZeRO-2 on the CPU accelerator (tests/integration/guarded_train.py):
- with the guard, the job saves a checkpoint, stops before the kernel kills it (no OOM kill
  in its cgroup) and exits with the guard's status on every rank, at the same step on every
  rank, with the message naming the trigger, the level and the figures;
- an uninterrupted run of the same steps (no leak) has the same losses up to the stop, and
  resuming from the guard's checkpoint gives the same losses as that run for the steps after;
- without the guard (the control), the same leak is killed by the kernel.

Every run happens in child processes moved into a fresh cgroup below ours; this pytest
process imports neither torch nor a framework.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any, NamedTuple, Optional

import pytest

from tests.cgroup_helpers import MiB, Tree, oom_kills
from tests.integration.children import free_port, require, run_in

pytestmark = pytest.mark.integration

require("torch", "transformers", "lightning", "torchdata", "deepspeed")

from cgwatch import GUARD_EXIT_STATUS  # noqa: E402

TRAIN = Path(__file__).resolve().parent / "guarded_train.py"
GUARD_STEPS = 5000  # never reached: the guard (or the kernel) ends the run first
AFTER = 10  # steps run after the guard's stop, by the reference and by the resumed run


class Case(NamedTuple):
    ranks: int
    limit: int  # the cgroup's limit: a few hundred MiB above what the job needs at start
    leak_mib: int  # written per step on the last rank


CASES = {
    "plain": Case(2, 1024 * MiB, 8),
    "hf": Case(1, 1024 * MiB, 8),
    "lightning": Case(1, 1024 * MiB, 8),
    "deepspeed": Case(1, 1024 * MiB, 8),
}

# In the cgroup: start the ranks (each its own log), wait, report their exit statuses.
LAUNCH = textwrap.dedent("""
    import json, os, subprocess, sys, time
    script, framework, mode, steps, out, leak, ranks, port, timeout = ARGS
    procs = []
    for r in range(ranks):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        log = open(os.path.join(out, f"{mode}-rank{r}.log"), "w")
        procs.append(subprocess.Popen(
            [sys.executable, script, framework, mode, str(steps), out, str(leak)],
            stdout=log, stderr=subprocess.STDOUT, env=env))
    start = time.monotonic()
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(max(0.1, start + timeout - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rcs.append("timeout")
    print("RESULT " + json.dumps({"rcs": rcs, "seconds": time.monotonic() - start}))
""")


class Run(NamedTuple):
    rcs: list[Any]
    results: list[Optional[dict[str, Any]]]  # per rank; None: it wrote none (killed)
    oom_kills: int
    logs: str


def run(tree: Tree, env: dict[str, str], out: Path, framework: str, mode: str,
        steps: int, leak_mib: int = 0, timeout: float = 420) -> Run:
    """One run of guarded_train.py; `timeout` is generous: at load 10-20 on the 2-core
    machine one run's imports alone took up to 100 s (8 s unloaded)."""
    case = CASES[framework]
    cgroup = tree.make(f"{framework}-{mode}-{uuid.uuid4().hex[:6]}", case.limit)
    args = (str(TRAIN), framework, mode, steps, str(out), leak_mib, case.ranks, free_port(),
            timeout)
    got = run_in(tree, cgroup, f"ARGS = {args!r}\n" + LAUNCH, env, timeout=timeout + 30)
    results = []
    logs = []
    for r in range(case.ranks):
        path = out / f"{mode}-rank{r}.json"
        results.append(json.loads(path.read_text()) if path.exists() else None)
        log = out / f"{mode}-rank{r}.log"
        logs.append(f"--- {mode} rank {r} (rc {got['rcs'][r]}):\n"
                    + (log.read_text()[-3000:] if log.exists() else ""))
    print(f"{framework} {mode}: rcs {got['rcs']} in {got['seconds']:.1f} s")
    return Run(got["rcs"], results, oom_kills(cgroup, tree.version), "\n".join(logs))


def losses(result: Optional[dict[str, Any]], first: int, last: int) -> list[float]:
    assert result is not None
    return [result["losses"][str(s)] for s in range(first, last + 1)]


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path


@pytest.mark.parametrize("framework", list(CASES))
def test_guard_saves_stops_in_time_and_resumes_identically(
        tree: Tree, env: dict[str, str], out: Path, framework: str) -> None:
    case = CASES[framework]
    guarded = run(tree, env, out, framework, "guard", GUARD_STEPS, case.leak_mib)
    # Stopped by the guard, not by the kernel, with the guard's status on every rank.
    assert guarded.rcs == [GUARD_EXIT_STATUS] * case.ranks, guarded.logs
    assert guarded.oom_kills == 0, guarded.logs
    verdicts = [r["verdict"] for r in guarded.results if r is not None]
    assert len(verdicts) == case.ranks, guarded.logs
    stop = verdicts[0]["step"]
    assert all(v["stop"] and v["step"] == stop for v in verdicts), verdicts  # same step
    assert 0 < stop < GUARD_STEPS
    deciding = [v for v in verdicts if v["rank"] is None]
    assert deciding, verdicts  # at least one rank's own verdict, with the figures
    for v in deciding:
        assert v["trigger"] in ("reserve", "forecast"), v
        assert v["message"].startswith(f"cgwatch guard: save and stop at step {stop}: cgroup ")
        assert "headroom" in v["message"] and v["level"], v
        assert v["message"] in guarded.logs  # printed by guard.exit on stderr
    checkpoint = guarded.results[0]["checkpoint"]  # type: ignore[index]
    assert checkpoint and os.path.exists(checkpoint)

    # The same steps uninterrupted (no leak), and the resumed run from the guard's save.
    last = stop + AFTER
    reference = run(tree, env, out, framework, "reference", last)
    assert reference.rcs == [0] * case.ranks, reference.logs
    resumed = run(tree, env, out, framework, "resume", last)
    assert resumed.rcs == [0] * case.ranks, resumed.logs
    for r in range(case.ranks):
        assert losses(guarded.results[r], 1, stop) == losses(reference.results[r], 1, stop)
        assert sorted(map(int, resumed.results[r]["losses"])) == list(  # type: ignore[index]
            range(stop + 1, last + 1)), "the resumed run starts after the saved step"
        assert losses(resumed.results[r], stop + 1, last) == \
            losses(reference.results[r], stop + 1, last)


def test_plain_ranks_stop_together_when_one_rank_decides(tree: Tree, env: dict[str, str],
                                                        out: Path) -> None:
    """Only rank 1's guard says stop (its reserve is above any limit); rank 0's never would.
    Both stop at the first agreement (check 1), both save's barrier is passed, both exit 75;
    rank 0's verdict names rank 1 (without the all-reduce rank 1 would wait in the barrier
    while rank 0 trains on: a hang)."""
    got = run(tree, env, out, "plain", "onerank", GUARD_STEPS)
    assert got.rcs == [GUARD_EXIT_STATUS] * 2, got.logs
    v0, v1 = (r["verdict"] for r in got.results)  # type: ignore[index]
    assert v0["step"] == v1["step"] == 1
    assert (v1["trigger"], v1["rank"]) == ("reserve", None)
    assert (v0["trigger"], v0["rank"]) == ("reserve", 1)
    assert "rank 1's guard decided (reserve" in v0["message"]
    assert v0["message"] in got.logs and v1["message"] in got.logs


@pytest.mark.parametrize("framework", list(CASES))
def test_without_the_guard_the_kernel_kills_it(tree: Tree, env: dict[str, str], out: Path,
                                               framework: str) -> None:
    case = CASES[framework]
    control = run(tree, env, out, framework, "control", GUARD_STEPS, case.leak_mib)
    assert control.rcs[-1] == -9, control.logs  # the leaking rank: SIGKILL
    assert control.oom_kills >= 1, control.logs
    assert control.results[-1] is None  # it never got to write its result
    assert GUARD_EXIT_STATUS not in control.rcs


def test_adapter_modules_import_no_framework() -> None:
    """Importing the adapters loads neither torch nor the framework (only their callbacks,
    on first access, do)."""
    code = textwrap.dedent("""
        import sys
        import cgwatch.integrations.transformers, cgwatch.integrations.lightning
        import cgwatch.integrations.deepspeed_guard
        print(" ".join(sorted(m for m in ("torch", "transformers", "lightning",
                                          "pytorch_lightning", "deepspeed") if m in sys.modules)))
        from cgwatch.integrations.transformers import GuardCallback as H
        from cgwatch.integrations.lightning import GuardCallback as L
        import transformers, lightning.pytorch
        print(issubclass(H, transformers.TrainerCallback),
              issubclass(L, lightning.pytorch.Callback))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd="/").stdout.splitlines()
    assert out == ["", "True True"]
