"""The same decision on every rank, for real: two CPU ranks of each trainer, started the way
its users start them, and only ONE rank's cgroup running out.

For Hugging Face's Trainer (torchrun, two processes), Lightning (`devices=2,
strategy="ddp"`: it starts rank 1 itself) and DeepSpeed ZeRO-2 (torchrun,
`deepspeed.initialize`), tests/integration/guarded_train.py in `onecgroup` mode: the whole
job runs in a cgroup whose limit it never nears, and rank 1 alone moves itself into a child
of it with a real v1 limit, which it approaches by writing LEAK_MIB MiB after every step
(after a head start of BALLAST_MIB MiB, to spend fewer steps getting there).
Only rank 1's guard can see that limit, so only rank 1 can decide; the adapters' default
`sync_every` (10) lets the ranks agree at checks 1, 11, 21, ... Asserted:
- every rank stops at the same step, an agreement step, before the kernel's OOM kill;
- the checkpoint is written once, at that step, by the rank(s) that write in that trainer
  (HF: one `checkpoint-<step>/` with both ranks' RNG states; Lightning: one
  `guard-step=<step>.ckpt` from rank 0; DeepSpeed: one tag with each rank's ZeRO partition);
- every rank leaves with the guard's status (75); what the launcher itself exits with is
  asserted as measured (torchrun: 1, its ChildFailedError naming the first rank's 75;
  Lightning: rank 0 is the launcher, 75);
- rank 1's message names its own cgroup, the trigger and the figures; rank 0's names rank 1;
- no rank hangs: after a generous timeout every process in the job's cgroups is killed (and
  the test fails), as they are when the test ends (tests/cgroup_helpers.py).
"""

from __future__ import annotations

import json
import os
import re
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
STEPS = 5000  # never reached: the guard (or the kernel) ends the run first
JOB_LIMIT = 4096 * MiB  # the whole job: a safety net, far from its reserve (12 %: 492 MiB)
RANK_LIMIT = 1024 * MiB  # rank 1 alone: torch + a framework take ~260-300 MiB of it
# Rank 1 writes BALLAST_MIB before its first step, then LEAK_MIB after each: its reserve (12 %,
# 123 MiB) comes after ~35 steps, and the up to SYNC_EVERY - 1 steps it trains on until the
# ranks agree (72 MiB) leave ~50 MiB before the limit.
BALLAST_MIB = 320
LEAK_MIB = 8
LIMITED_RANK = 1
SYNC_EVERY = 10  # cgwatch.Guard's default, which the adapters use

# In the job's cgroup: start the trainer's launcher, wait for it, and, as a child subreaper
# (prctl(2) PR_SET_CHILD_SUBREAPER), reap the ranks it leaves behind: each exit status seen.
# After `timeout` (a hang), or when ranks outlive the launcher by 60 s, every other process
# in the job's cgroups is SIGKILLed: torchrun starts each worker in a session of its own
# (torch/distributed/elastic/multiprocessing/subprocess_handler), so a process group would
# miss them.
LAUNCH = textwrap.dedent("""
    import ctypes, json, os, signal, subprocess, sys, time
    argv, env_extra, timeout, cgroups = ARGS
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER

    def kill_the_rest():
        for cgroup in cgroups:
            for pid in map(int, open(os.path.join(cgroup, "cgroup.procs")).read().split()):
                if pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass

    env = dict(os.environ, **env_extra)
    start = time.monotonic()
    log = open(env["GUARDTEST_LAUNCHER_LOG"], "w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_the_rest()
        proc.wait()
        rc = "timeout"
    seconds = time.monotonic() - start
    orphans = {}
    deadline = time.monotonic() + 60
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            orphans[pid] = os.waitstatus_to_exitcode(status)
        elif time.monotonic() < deadline:
            time.sleep(0.05)
        else:
            orphans["timeout"] = True
            kill_the_rest()
            deadline = float("inf")
    print("RESULT " + json.dumps({"rc": rc, "seconds": seconds, "orphans": orphans}))
""")


class Run(NamedTuple):
    launcher_rc: Any
    seconds: float
    orphans: dict[str, Any]
    results: list[Any]  # per rank, what it wrote before exiting (None: nothing, killed)
    statuses: list[int]  # per rank, the status it exited with (written just before _exit)
    oom_kills: int  # in rank 1's cgroup
    rank_cgroup: str
    launcher_log: str
    logs: str


def launch(tree: Tree, env: dict[str, str], out: Path, framework: str,
           timeout: float = 420, *, mode: str = "onecgroup", steps: int = STEPS,
           wrap: tuple[str, ...] = (), every_rank: bool = True,
           faults: Optional[dict[str, str]] = None) -> Run:
    """One two-rank run; `timeout` as generous as test_guard_training.run's (imports alone
    took up to 100 s at load 10-20 on the 2-core machine). `mode`, `steps`: guarded_train's;
    `wrap`: a command the launcher runs under (`cgwatch run --`), its status then the
    `launcher_rc`; `every_rank`: assert each rank wrote its result and status (else a
    missing one is None, -1); `faults`: guarded_train's GUARDTEST_* fault switches."""
    name = f"{framework}-ranks-{uuid.uuid4().hex[:6]}"
    job = tree.make(name, JOB_LIMIT)
    rank_cgroup = tree.make(f"{name}/rank{LIMITED_RANK}", RANK_LIMIT)
    port = free_port()
    script = [str(TRAIN), framework, mode, str(steps), str(out), str(LEAK_MIB)]
    if framework == "lightning":
        argv = [*wrap, sys.executable, *script]  # Lightning's own launcher starts rank 1
    else:
        argv = [*wrap, sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                str(port), *script]
    extra = {**(faults or {}), "GUARDTEST_WORLD": "2", "GUARDTEST_CGROUP": rank_cgroup,
             "GUARDTEST_CGROUP_RANK": str(LIMITED_RANK), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
             "GUARDTEST_BALLAST_MIB": str(BALLAST_MIB),
             "GUARDTEST_LAUNCHER_LOG": str(out / "launcher.log")}
    args = (argv, extra, timeout, [job, rank_cgroup])
    got = run_in(tree, job, f"ARGS = {args!r}\n" + LAUNCH, env, timeout=timeout + 90)
    results: list[Any] = []
    statuses, logs = [], []
    for r in range(2):
        log = out / f"{mode}-rank{r}.log"
        logs.append(f"--- rank {r}:\n" + (log.read_text()[-4000:] if log.exists() else ""))
    launcher_log = (out / "launcher.log").read_text()
    text = "\n".join(logs) + "\n--- launcher:\n" + launcher_log[-4000:] + f"\n{got}"
    if got["rc"] == "timeout" or "timeout" in got["orphans"]:
        pytest.fail(f"a rank hung: its processes were killed after {timeout} s\n{text}")
    for r in range(2):
        path, status = out / f"{mode}-rank{r}.json", out / f"{mode}-rank{r}.status"
        if every_rank or (path.exists() and status.exists()):
            assert path.exists() and status.exists(), f"rank {r} wrote no result\n{text}"
            results.append(json.loads(path.read_text()))
            statuses.append(int(status.read_text()))
        else:
            results.append(None)
            statuses.append(-1)
    print(f"{framework} two ranks: launcher rc {got['rc']}, ranks exited {statuses} in "
          f"{got['seconds']:.1f} s; rank 1: "
          f"{(results[-1] or {}).get('verdict', {}).get('message')}")
    return Run(got["rc"], got["seconds"], got["orphans"], results, statuses,
               oom_kills(rank_cgroup, tree.version), rank_cgroup, launcher_log, text)


def checkpoints(framework: str, out: Path, stop: int) -> list[str]:
    """What the run saved, relative to its checkpoint directory; asserts it is one save, at
    `stop`, from the rank(s) that write in that trainer."""
    directory = out / f"{framework}-checkpoint"
    found = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
    if framework == "hf":
        # Rank 0 writes the model, optimizer and trainer state; each rank its RNG state.
        assert sorted(p.name for p in directory.iterdir()) == [f"checkpoint-{stop}"], found
        assert {f"checkpoint-{stop}/rng_state_0.pth", f"checkpoint-{stop}/rng_state_1.pth",
                f"checkpoint-{stop}/model.safetensors", f"checkpoint-{stop}/optimizer.pt",
                f"checkpoint-{stop}/trainer_state.json"} <= set(found), found
        state = json.loads((directory / f"checkpoint-{stop}" / "trainer_state.json").read_text())
        assert state["global_step"] == stop
    elif framework == "lightning":
        # trainer.save_checkpoint on every rank (a collective); only global rank 0 writes.
        assert found == [f"guard-step={stop}.ckpt"], found
    else:
        # ZeRO-2: every rank writes its optimizer partition into the one tag; rank 0 the
        # model states and `latest`.
        assert (directory / "latest").read_text().strip() == f"step{stop}", found
        tags = sorted(p.name for p in directory.iterdir() if p.is_dir())
        assert tags == [f"step{stop}"], found
        names = sorted(p.name for p in (directory / f"step{stop}").iterdir())
        assert names == ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                         "zero_pp_rank_1_mp_rank_00_optim_states.pt"], found
    return found


@pytest.mark.parametrize("framework", ["hf", "lightning", "deepspeed"])
def test_one_ranks_cgroup_stops_every_rank_at_the_same_step(
        tree: Tree, env: dict[str, str], tmp_path: Path, framework: str) -> None:
    got = launch(tree, env, tmp_path, framework)  # fails if a rank hangs
    # Saved and stopped by the guard on every rank: no kill, the guard's status.
    assert got.oom_kills == 0, got.logs
    assert got.statuses == [GUARD_EXIT_STATUS] * 2, got.logs
    v0, v1 = (r.get("verdict") for r in got.results)
    assert v0 is not None and v1 is not None, got.logs
    # The same step on both ranks, and one where the ranks agree (checks 1, 11, 21, ...:
    # every trainer here checks once per step, from global step 1).
    stop = v1["step"]
    assert v0["step"] == stop and v0["stop"] and v1["stop"], (v0, v1)
    assert stop > 1 and (stop - 1) % SYNC_EVERY == 0, (v0, v1)
    # Rank 1 decided, about its own cgroup, with the figures; rank 0 names rank 1.
    assert v1["rank"] is None and v1["trigger"] in ("reserve", "forecast"), v1
    assert v1["level"].endswith("/" + os.path.relpath(got.rank_cgroup, tree.base)), \
        (v1, got.rank_cgroup)
    assert v1["message"].startswith(f"cgwatch guard: save and stop at step {stop}: "
                                    f"cgroup {v1['level']}: ") and "headroom" in v1["message"]
    assert (v0["rank"], v0["trigger"]) == (LIMITED_RANK, v1["trigger"]), v0
    assert v0["message"] == (f"cgwatch guard: save and stop at step {stop}: rank 1's guard "
                             f"decided ({v1['trigger']}; that rank's message gives the level "
                             "and figures)")
    # Both printed by exit_if_stopped / guard.exit on their rank's stderr.
    assert v1["message"] in got.logs and v0["message"] in got.logs
    # Neither rank trained past the stop.
    for r, result in enumerate(got.results):
        assert max(map(int, result["losses"])) == stop, (r, sorted(map(int, result["losses"])))
    checkpoints(framework, tmp_path, stop)
    # What the launcher itself says, as measured (docs/guard.md).
    if framework == "lightning":
        # Rank 0 is the launcher; Lightning's rank 1 is its child (reaped by it, or by our
        # subreaper if rank 0 left first).
        assert got.launcher_rc == GUARD_EXIT_STATUS, got.logs
        assert set(got.orphans.values()) <= {GUARD_EXIT_STATUS}, got.orphans
    else:
        # torchrun reports a worker's non-zero exit as a failure: ChildFailedError, rc 1, the
        # first rank out with its 75 as the root cause. It SIGTERMs the ranks still running
        # at its next look (--monitor-interval, 0.1 s): one still leaving may end by that
        # (-15; the ranks leave through a barrier, so it has not been seen here).
        assert got.launcher_rc == 1, got.logs
        failures, _, root = got.launcher_log.partition("Root Cause")
        codes = re.findall(r"exitcode\s+:\s*(-?\d+)", failures + root)
        assert re.findall(r"exitcode\s+:\s*(-?\d+)", root)[:1] == [str(GUARD_EXIT_STATUS)], \
            got.launcher_log
        assert len(codes) == 2 and set(codes) <= {str(GUARD_EXIT_STATUS), "-15"}, \
            got.launcher_log
