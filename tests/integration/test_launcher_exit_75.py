"""75 through the launchers with the adapters, for real (issue 25 item 1): `cgwatch run --
LAUNCHER ...` exits 75 exactly when every rank recorded its save after the guard's stop
(cgwatch/saves.py), whatever the launcher itself ended with.

The two-rank runs of test_guard_ranks_trainers.py (`launch`: rank 1 alone in a limited v1
cgroup, which it fills; the adapters with their default `sync_every`), under `cgwatch run`:
- HF Trainer under torchrun: torchrun exits 1 for workers that exit 75 (torch 2.13); `run`
  exits 75 and says every rank saved. The run that follows (`resume`, two ranks under
  torchrun) finishes, and both ranks' losses equal an uninterrupted two-rank run's
  (`reference`) step for step, `==` on the floats.
- DeepSpeed ZeRO-2 under torchrun (`guard_step`): torchrun 1, `run` 75.
- Lightning under its own launcher, rank 0 lingering 8 s after rank 1 exited 75: Lightning's
  child-process observer (every 5 s) SIGKILLs rank 0, the launcher, so CMD ends with 137;
  `run` exits 75.
- Negative: HF under torchrun, rank 1 SIGKILLed at the save (once rank 0 recorded its own),
  before it recorded it: `run` does not say 75 (it passes torchrun's 1 on and says only 1 of
  2 ranks saved).
- torchrun's own restarts (`--max-restarts 1`, stand-in workers that only write records):
  after attempt 0 saved, attempt 1 finishing gives 0, failing gives 1 (the older saves do
  not count), stopping and saving again gives 75.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cgroup_helpers import Tree
from tests.integration.children import free_port, require
from tests.integration.test_guard_ranks_trainers import LIMITED_RANK, launch

pytestmark = pytest.mark.integration

require("torch", "transformers", "lightning", "torchdata", "deepspeed")

from cgwatch import GUARD_EXIT_STATUS  # noqa: E402

RUN = (sys.executable, "-m", "cgwatch", "run", "--")
# The guard stops rank 1 at an agreement step near 31-41 (test_guard_ranks_trainers.py's
# figures); the job's own end is beyond, so resume and reference train on after the stop.
STEPS = 80
LINGER = 8.0  # rank 0's seconds after rank 1 left: over Lightning's 5 s observer period


def stop_step(got: object) -> int:
    results = got.results  # type: ignore[attr-defined]
    steps = {r["verdict"]["step"] for r in results if r is not None and r.get("verdict")}
    assert len(steps) == 1, results
    return steps.pop()


def saved_and_75(got: object, ended: str) -> int:
    """Both ranks saved at one step and exited 75, the kernel killed nothing, and `cgwatch
    run`, having read both records, says so and exits 75 whatever the launcher's end
    (`ended`, as run words it); the step."""
    assert got.oom_kills == 0, got.logs  # type: ignore[attr-defined]
    assert got.statuses == [GUARD_EXIT_STATUS] * 2, got.logs  # type: ignore[attr-defined]
    stop = stop_step(got)
    log: str = got.launcher_log  # type: ignore[attr-defined]
    assert (f"cgwatch run: every rank (2) saved at step {stop} after the guard's stop; "
            f"{Path(sys.executable).name} ended with {ended}; exit 75 (saved, may be resumed)"
            ) in log, log[-3000:]
    assert got.launcher_rc == GUARD_EXIT_STATUS, got.logs  # type: ignore[attr-defined]
    return stop


def test_hf_under_torchrun_exits_75_then_resumes_identically(
        tree: Tree, env: dict[str, str], tmp_path: Path) -> None:
    got = launch(tree, env, tmp_path, "hf", steps=STEPS, wrap=RUN)
    # torchrun said 1 (ChildFailedError, as measured); run, having read both records, 75.
    assert "ChildFailedError" in got.launcher_log, got.launcher_log[-3000:]
    stop = saved_and_75(got, "exit 1")
    assert 1 < stop < STEPS, got.logs
    # The next run resumes from checkpoint-<stop> and finishes; an uninterrupted one beside.
    resumed = launch(tree, env, tmp_path, "hf", mode="resume", steps=STEPS, wrap=RUN)
    assert resumed.launcher_rc == 0 and resumed.statuses == [0, 0], resumed.logs
    reference = launch(tree, env, tmp_path, "hf", mode="reference", steps=STEPS)
    assert reference.launcher_rc == 0 and reference.statuses == [0, 0], reference.logs
    for r in range(2):
        guarded, after, whole = (run.results[r]["losses"] for run in (got, resumed, reference))
        assert sorted(map(int, guarded)) == list(range(1, stop + 1)), (r, sorted(guarded))
        assert sorted(map(int, after)) == list(range(stop + 1, STEPS + 1)), \
            (r, "the resumed run starts after the saved step", sorted(after))
        assert sorted(map(int, whole)) == list(range(1, STEPS + 1)), r
        assert [guarded.get(str(s), after.get(str(s))) for s in range(1, STEPS + 1)] == \
            [whole[str(s)] for s in range(1, STEPS + 1)], r


def test_deepspeed_under_torchrun_exits_75(
        tree: Tree, env: dict[str, str], tmp_path: Path) -> None:
    got = launch(tree, env, tmp_path, "deepspeed", wrap=RUN)
    assert "ChildFailedError" in got.launcher_log, got.launcher_log[-3000:]
    saved_and_75(got, "exit 1")


def test_lightning_launcher_killed_by_its_observer_still_exits_75(
        tree: Tree, env: dict[str, str], tmp_path: Path) -> None:
    got = launch(tree, env, tmp_path, "lightning", wrap=RUN,
                 faults={"GUARDTEST_LINGER_RANK0": str(LINGER)})
    # Rank 0 (Lightning's launcher) was SIGKILLed while it lingered: CMD's 137.
    saved_and_75(got, "killed by SIGKILL")


def test_a_rank_killed_at_the_save_is_not_75(
        tree: Tree, env: dict[str, str], tmp_path: Path) -> None:
    got = launch(tree, env, tmp_path, "hf", wrap=RUN, every_rank=False,
                 faults={"GUARDTEST_KILL_AT_SAVE": str(LIMITED_RANK)})
    assert got.results[LIMITED_RANK] is None, got.logs  # killed before it wrote anything
    assert got.oom_kills == 0, got.logs
    assert got.launcher_rc == 1, got.logs  # torchrun's, passed on: never 75
    # Rank 1 waited for rank 0's record of its save before dying: one of two saved.
    assert ("cgwatch run: only 1 of 2 ranks recorded a save after the guard's stop; "
            f"{Path(sys.executable).name} ended with exit 1; not saved: exit 1"
            ) in got.launcher_log, got.launcher_log[-3000:]


# torchrun's restarts in place (--max-restarts 1): attempt 0 saves and exits 75 on both
# ranks, torchrun starts the group again (TORCHELASTIC_RESTART_COUNT=1), and attempt 1 ends
# as argv[1] says. Only the newest attempt's records count.
RESTARTED = textwrap.dedent("""
    import os, sys, time
    from cgwatch import saves
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    saves.record_start(rank, local)

    def saved(step):
        # A collective save: no rank leaves before every rank saved (a real job's save ends
        # in a barrier). Without it, rank 0's 75 made torchrun (--monitor-interval 0.1)
        # SIGTERM rank 1 before it recorded its save, at load 13: "only 1 of 2 ranks".
        saves.record_save(rank, local, step)
        here = os.path.dirname(os.path.abspath(__file__))
        open(os.path.join(here, f"saved-{attempt}-{rank}"), "w").close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                os.path.exists(os.path.join(here, f"saved-{attempt}-{r}")) for r in range(local)):
            time.sleep(0.01)
        sys.exit(75)

    if attempt == 0:
        saved(10)
    if sys.argv[1] == "stop-again":
        saved(20)
    sys.exit(1 if sys.argv[1] == "fail" and rank == 1 else 0)
""")


@pytest.mark.parametrize("then, status, line", [
    ("finish", 0, ""),
    # attempt 0's saves do not vouch for attempt 1's failure
    ("fail", 1, ""),
    ("stop-again", GUARD_EXIT_STATUS, "every rank (2) saved at step 20 after the guard's stop"),
])
def test_torchrun_restarts_only_the_newest_attempt_counts(
        env: dict[str, str], tmp_path: Path, then: str, status: int, line: str) -> None:
    job = tmp_path / "job.py"
    job.write_text(RESTARTED)
    argv = [*RUN, sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc_per_node", "2", "--max-restarts", "1", "--monitor-interval", "0.1",
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(job), then]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert "exitcode: 75" in err or "exitcode : 75" in err, err[-3000:]  # attempt 0's 75
    assert proc.returncode == status, err[-3000:]
    assert (line in err) if line else ("cgwatch run: every rank" not in err), err[-3000:]
