"""The guard's throttling trigger on a real cgroup v2 kernel (the VM tier, Debian's 6.1):
a job level with memory.high far below memory.max, a process in it that keeps allocating
over memory.high (no swap), and a Guard in a sibling leaf (so the job level is its parent,
as a job's cgroup is for a training process). The guard stops with THROTTLE, naming the job
level, with the PSI stall share it read from that level's memory.pressure.

Kernel facts (6.1): a charge over memory.high schedules mem_cgroup_handle_over_high() on
the return to user space, which reclaims and then sleeps the task up to 2 s inside
psi_memstall_enter()/leave(), so the stall shows in the cgroup's memory.pressure `some` and
`full` totals (mm/memcontrol.c); with no swap, anonymous memory cannot be reclaimed, so every
new charge over memory.high is throttled again."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from tests.cgroup_helpers import (
    PROJECT,
    MiB,
    Tree,
    cgroup_tree,
    read,
    real_kernel_marks,
    run_script,
    write,
)

pytestmark = real_kernel_marks()

GUARD = f"""
import json, sys, time
sys.path.insert(0, {PROJECT!r})
import cgwatch
guard = cgwatch.Guard(interval=0.2, near_interval=0.2, checkpoint_seconds=1.0,
                      throttle_seconds=2.0, pressure="some", pressure_threshold=0.05)
print("ready", flush=True)
deadline = time.monotonic() + 240
verdict = guard.check()
while not verdict.stop and time.monotonic() < deadline:
    time.sleep(0.1)
    verdict = guard.check()
print(json.dumps(verdict.as_dict()), flush=True)
print(f"guard: stop after {{time.monotonic() - deadline + 240:.1f}} s", file=sys.stderr)
"""

# Fills 48 MiB (written: ~40 MiB over memory.high, so every charge is throttled hard), then
# keeps allocating and freeing 1 MiB blocks: each one is a new mmap, new page faults, new
# charges over memory.high.
CHURN = """
import time
kept = bytearray(b"\\x01") * (48 << 20)
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    block = bytearray(b"\\x02") * (1 << 20)
    del block
"""


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def test_sustained_throttling_above_memory_high_stops_the_job(tree: Tree) -> None:
    if tree.version != 2:
        pytest.skip("memory.high and memory.pressure are v2 files")
    job = tree.make("job", limit=512 * MiB)
    if not os.path.exists(os.path.join(job, "memory.pressure")):
        pytest.skip("no PSI on this kernel (psi=0?)")
    swap = os.path.join(job, "memory.swap.max")
    if os.path.exists(swap):
        write(swap, "0")
    watch = tree.make("job/watch")
    victim = tree.make("job/victim")
    guard = tree.spawn(watch, GUARD)
    assert guard.stdout is not None and guard.stdout.readline() == "ready\n"
    # memory.high only now: the guard's own start-up (~20 MiB of Python) is not throttled.
    high = int(read(os.path.join(job, "memory.current"))) + 8 * MiB
    write(os.path.join(job, "memory.high"), str(high))
    churn = tree.spawn(victim, CHURN)
    line = guard.stdout.readline()  # the verdict (or "" if the guard died)
    # Lift memory.high before anything exits: a process over it is throttled on every
    # allocation, its interpreter shutdown too (that took minutes under emulation).
    write(os.path.join(job, "memory.high"), "max")
    churn.kill()
    _, err = guard.communicate(timeout=300)
    print(err)  # how long it took (-s)
    assert guard.returncode == 0 and line, err
    verdict = json.loads(line)
    assert verdict["stop"], verdict
    assert verdict["trigger"] == "throttle", verdict
    assert verdict["level"].endswith("/job"), verdict
    assert verdict["throttled_for"] >= 2.0
    assert verdict["pressure"] is not None and verdict["pressure"] >= 0.05


SHAPES = os.path.join(PROJECT, "tests", "shape_child.py")
SHAPE_LIMIT = 256 * MiB


def run_shape(tree: Tree, cgroup: str, checkpoint: str, *args: str) -> tuple[int, str, str]:
    return run_script(tree, cgroup, SHAPES, *args, "--limit", str(SHAPE_LIMIT),
                      "--checkpoint", checkpoint, timeout=600)


def job_without_swap(tree: Tree, name: str) -> str:
    """A job cgroup of SHAPE_LIMIT whose anonymous pages cannot go to swap (memory.swap.max 0,
    where the kernel has swap accounting): the kill is real."""
    job = tree.make(name, limit=SHAPE_LIMIT)
    swap = os.path.join(job, "memory.swap.max")
    if os.path.exists(swap):
        write(swap, "0")
    return job


def test_a_sawtooth_runs_to_its_end_and_stairs_stop_before_the_kill(tree: Tree,
                                                                    tmp_path: object) -> None:
    """On v2 (memory.current - inactive_file as the working set): the issue's sawtooth, 20%
    -> 60% of 256 MiB in 10 pieces every 0.55 s, runs its 15 s with the guard's defaults;
    stairs of 18% (46 MiB) stop on the reserve the stairs taught (46 x 1.25 + 12.8 MiB), with
    the 5% still free and no OOM kill (5 stairs would be the kill). One cgroup after the
    other, no swap (anonymous pages cannot be reclaimed: the kill is real)."""
    if tree.version != 2:
        pytest.skip("the v1 cases are tests/test_guard_real.py's")
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    saw = job_without_swap(tree, "saw")
    status, out, err = run_shape(tree, saw, checkpoint, "--shape", "sawtooth",
                                 "--period", "0.5", "--seconds", "15")
    assert status == 0 and out.endswith("done\n"), err
    assert not os.path.exists(checkpoint)
    stairs = job_without_swap(tree, "stairs")
    status, out, err = run_shape(tree, stairs, checkpoint, "--shape", "stairs",
                                 "--stair", "0.18", "--seconds", "120")
    assert status == 75, err
    with open(checkpoint) as f:
        verdict = json.load(f)["verdict"]
    assert verdict["trigger"] == "reserve", verdict
    assert verdict["rise"] >= int(SHAPE_LIMIT * 0.18 * 1.25) - 2 * MiB, verdict
    assert verdict["headroom"] >= SHAPE_LIMIT * 5 // 100, verdict
    events = read(os.path.join(stairs, "memory.events"))
    assert "oom_kill 0" in events, events
