"""Two nodes (tests/slurm/cluster twonode: `slurmd -N n1` and `-N n2` on this host, each node's
jobs below a cgroup of its own): torchrun across both, the guard stopping every rank at one
step when only ONE node's step cgroup fills, Slurm requeueing the job on the guard's 75, the
job resuming on both nodes from the one checkpoint and finishing; and what the guard's
agreement across the nodes costs.

The job is tests/integration/guarded_train.py's HF Trainer with the cgwatch adapter
(`GuardCallback`: its all-reduce every `sync_every` checks is what makes every rank stop at
the same step; `cgwatch run --guard` per node would stop each node's agent on its own node's
memory alone, and the other node's rank would sit in the next gradient all-reduce). One rank
per node, `torchrun --nnodes 2` from `srun` (c10d rendezvous on the first node's NodeAddr,
gloo on the CPU). The leak is on rank 1 and belongs to the first life (mode `onecgroup`, with
no cgroup of its own: it fills its node's step cgroup, `--mem` per node); a requeued life
(SLURM_RESTART_COUNT=1) resumes with no leak, as a job whose leak restarts with the process.

torchrun exits 1 when its worker exits 75 (docs/guard.md), so srun says 1: the batch script
maps it to 75 only when every rank wrote 75 as it left (guarded_train.py's status files,
written after the save), and says so in its output.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from cgwatch import GUARD_EXIT_STATUS
from tests.slurm.jobs import REPO, STATE, integration_python, sbatch, srun

TRAIN = os.path.join(REPO, "tests", "integration", "guarded_train.py")
STEPS = 100  # the guard stops life 0 at ~50 (below); the requeued life runs the rest
LEAK_MIB = 8  # rank 1, after every step of life 0
BALLAST_MIB = 320  # rank 1's head start: the stop comes at ~step 50, not ~90
MEM = "1280M"  # per node: agent + worker peak at 293-367 MiB here; reserve 12 % = 154 MiB
SYNC_EVERY = 10  # cgwatch.Guard's default, which the adapter uses: agreement at 1, 11, 21...
# A loaded 2-core machine: one two-node torchrun took 8-14 s here, the requeued job 36 s
TIMEOUT = 420

# Both nodes: torchrun with one worker each, the c10d rendezvous on the first node of the job.
# Its NodeAddr, never its name: n1 does not resolve, and the agents wait 60 s+ for it.
ACROSS = """head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
addr=$(scontrol show node "$head" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)
exec {python} -m torch.distributed.run --nnodes 2 --nproc_per_node 1 --rdzv-backend c10d \
  --rdzv-endpoint "$addr:{port}" --rdzv-id "$SLURM_JOB_ID-{port}" --max-restarts 0 {args}"""

# The batch script: one life per run of it (SLURM_RESTART_COUNT, unset in the first).
BATCH = """
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 TMPDIR={tmp} GUARDTEST_WORLD=2
export GUARDTEST_CGROUP_RANK=1 GUARDTEST_BALLAST_MIB={ballast}
life=${{SLURM_RESTART_COUNT:-0}}
mode=onecgroup
[ "$life" = 0 ] || mode=resume
set -- {ports}
shift "$life"
port=$1
export life mode port  # to the tasks (srun passes the environment on)
echo "life $life: mode $mode on $SLURM_JOB_NODELIST," \
     "SLURM_RESTART_COUNT=${{SLURM_RESTART_COUNT:-unset}} at $(date +%s.%N)"
# one log per node and life (srun merges the tasks' streams)
srun sh -c 'exec >"{out}/life$life-$SLURMD_NODENAME.log" 2>&1
{across}'
rc=$?
echo "life $life: srun exited $rc at $(date +%s.%N)"
[ $rc = 0 ] && exit 0
if [ "$(cat "{out}/$mode-rank0.status" "{out}/$mode-rank1.status" | tr -d '\\n')" = 7575 ]; then
    echo "life $life: every rank exited {status} after the save: exit {status}"
    exit {status}
fi
exit $rc
"""


def free_ports(n: int) -> list[int]:
    """`n` ports free on 127.0.0.1 now (held together, so distinct)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def need_torch() -> str:
    return integration_python("torch + transformers")


def across(python: str, args: str) -> str:
    return ACROSS.format(python=shlex.quote(python), port=free_ports(1)[0], args=args)


def results(out: Path, mode: str) -> list[dict[str, Any]]:
    found = []
    for r in range(2):
        data: dict[str, Any] = json.loads((out / f"{mode}-rank{r}.json").read_text())
        data["status"] = int((out / f"{mode}-rank{r}.status").read_text())
        found.append(data)
    return found


def logs(out: Path) -> str:
    return "\n".join(f"--- {p.name}:\n{p.read_text()[-3000:]}"
                     for p in sorted(out.glob("*.log")))


def oom_lines(cgroup: str) -> int:
    """The kernel's oom-kill lines so far that name a memory cgroup below `cgroup` (the
    cluster's; v1 counts `oom_kill` only in the victim's own cgroup, which Slurm removes with
    the step, so the kernel log is what stays)."""
    text = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    return sum(1 for line in text.splitlines()
               if "oom-kill:" in line and f"{cgroup}/" in line)


def scontrol_job(job: int) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", str(job)], capture_output=True,
                          text=True, check=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def test_guard_stops_both_nodes_at_one_step_requeue_resume_finish(tmp_path: Path) -> None:
    python = need_torch()
    cluster_cgroup = Path(STATE, "cgroup").read_text().strip()
    cluster_cgroup = cluster_cgroup.removeprefix("/sys/fs/cgroup/memory")  # as dmesg names it
    # The same steps uninterrupted: no leak, no guard, both nodes.
    ref = tmp_path / "reference"
    ref.mkdir()  # TMPDIR: torchrun's agent leaves a torchelastic_* directory there
    t0 = time.monotonic()
    srun("-N", "2", "--ntasks-per-node=1", "-c", "2", f"--mem={MEM}", "sh", "-c",
         across(python, f"{TRAIN} hf reference {STEPS} {ref}"),
         env={"OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)})
    reference = results(ref, "reference")
    reference_seconds = time.monotonic() - t0

    out = tmp_path / "job"
    out.mkdir()
    # one port per life: a second rendezvous on the first one's port can find it in TIME_WAIT
    inner = ACROSS.format(python=shlex.quote(python), port="$port",
                          args=f"{TRAIN} hf \"$mode\" {STEPS} {out} {LEAK_MIB}")
    assert "'" not in inner  # it goes inside the script's sh -c '...'
    script = BATCH.format(tmp=tmp_path, ballast=BALLAST_MIB, out=out, across=inner,
                          ports=" ".join(map(str, free_ports(2))), status=GUARD_EXIT_STATUS)
    ooms = oom_lines(cluster_cgroup)
    t0 = time.monotonic()
    try:
        job, text = sbatch(script, "--requeue", "-N", "2", "--ntasks-per-node=1", "-c", "2",
                           f"--mem={MEM}", "--open-mode=append", timeout=TIMEOUT)
    finally:
        # our own cluster (SLURM_CONF): its jobs are ours alone; a job left running (a
        # timeout) is cancelled here, its processes killed by `cluster stop` at the latest
        subprocess.run(["scancel", "--user=root"], capture_output=True, timeout=30)
    seconds = time.monotonic() - t0
    batch_output, text = text, f"{text}\n{logs(out)}"
    info = scontrol_job(job)
    at = [float(t) for t in re.findall(r"^life \d: .* at (\d+\.\d+)$", text, re.M)]
    lives = f"lives {at[1] - at[0]:.1f} s and {at[3] - at[2]:.1f} s, held {at[2] - at[1]:.1f} s" \
        if len(at) == 4 else "life times not found"
    print(f"two nodes: reference {reference_seconds:.1f} s; requeued job {job} {seconds:.1f} s "
          f"({lives}), {info.get('JobState')}, Restarts={info.get('Restarts')}")

    # Slurm requeued it once (only an exit in RequeueExit does that) and it then finished.
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), \
        (info, text)
    assert "life 0: mode onecgroup" in text and "SLURM_RESTART_COUNT=unset" in text, text
    assert "life 1: mode resume" in text and "SLURM_RESTART_COUNT=1" in text, text
    assert "life 0: srun exited 1" in text, text  # torchrun's status (module docstring)
    assert "life 0: every rank exited 75 after the save: exit 75" in text, text
    assert "life 2" not in text, text

    # Life 0: every rank on both nodes stopped at the same step, an agreement step, and left
    # with the guard's status; rank 1's own node's cgroup decided.
    first = results(out, "onecgroup")
    assert [r["status"] for r in first] == [GUARD_EXIT_STATUS] * 2, text
    assert sorted(r["node"] for r in first) == ["n1", "n2"], first
    v0, v1 = first[0]["verdict"], first[1]["verdict"]
    stop = v1["step"]
    assert v0["stop"] and v1["stop"] and v0["step"] == stop, (v0, v1)
    assert (stop - 1) % SYNC_EVERY == 0 and stop < STEPS, v1
    assert [r["steps_done"] for r in first] == [stop, stop], first
    node = first[1]["node"]
    print(f"two nodes: every rank stopped at step {stop}; rank 1 on {node}: {v1['message']}")
    assert v1["trigger"] == "reserve" and v1["rank"] is None, v1
    assert f"/{node}/slurm_{node}/uid_0/job_{job}" in v1["level"], v1
    assert v0["rank"] == 1 and "rank 1's guard decided" in v0["message"], v0

    # One checkpoint, at the stop, with both ranks' RNG states.
    directory = out / "hf-checkpoint"
    assert sorted(p.name for p in directory.iterdir()) == [f"checkpoint-{stop}"]
    saved = {p.name for p in (directory / f"checkpoint-{stop}").iterdir()}
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt",
            "trainer_state.json"} <= saved, saved
    state = json.loads((directory / f"checkpoint-{stop}" / "trainer_state.json").read_text())
    assert state["global_step"] == stop

    # Life 1: both nodes resumed from it (0 steps redone: the save was at the stop) and ran
    # to the end; every step's loss on every rank equals the uninterrupted run's.
    second = results(out, "resume")
    assert [r["status"] for r in second] == [0, 0], text
    assert sorted(r["node"] for r in second) == ["n1", "n2"], second
    for r in range(2):
        assert second[r]["resumed_from"] == str(directory / f"checkpoint-{stop}")
        assert sorted(map(int, second[r]["losses"])) == list(range(stop + 1, STEPS + 1))
        assert sorted(map(int, first[r]["losses"])) == list(range(1, stop + 1))
        assert {**first[r]["losses"], **second[r]["losses"]} == reference[r]["losses"], r

    # Nothing was killed: Slurm saw no OOM event in either step, the kernel killed nothing
    # below the cluster's cgroup.
    assert "oom-kill" not in batch_output and "Out Of Memory" not in batch_output, text
    assert oom_lines(cluster_cgroup) == ooms


def test_agreement_cost_across_the_nodes(tmp_path: Path) -> None:
    """bench/guard_ranks.py with one rank on each node: the guard's all-reduce (gloo over
    loopback between the nodes' ranks) against a check without it; figures printed, no bound
    asserted (a benchmark never fails on a ratio)."""
    python = need_torch()
    got = srun("-N", "2", "--ntasks-per-node=1", "-c", "2", "--mem=1G", "-l", "sh", "-c",
               across(python, "-m bench.guard_ranks 200 3"),
               env={"OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}).stdout
    ranks = {}
    for line in got.splitlines():
        task, _, rest = line.partition(": ")
        if rest.startswith("{"):
            ranks[task.strip()] = json.loads(rest)
    assert sorted(ranks) == ["0", "1"], got
    reduce = "ranks.max (the guard's all-reduce)"
    for task, data in sorted(ranks.items()):
        assert data["world"] == 2 and data["backend"] == "gloo"
        print(f"two nodes, rank {data['rank']} (task {task}): all-reduce {data[reduce]}, "
              f"check with sync_every=1 {data['check, sync_every=1']}, "
              f"sync_every=0 {data['check, sync_every=0']}")
