"""The guard inside Ray Train, for real (issue 34): stop, report, restart, resume.

A local Ray node (`ray.init(num_cpus=2, include_dashboard=False, _temp_dir=<the test's
tmp_path>)`: driver, GCS, raylet and workers) runs inside a child of our own memory cgroup
limited to NODE_LIMIT, started and shut down by the job's driver (bench/ray_train_job.py,
shared with bench/ray_side_by_side.py). A `TorchTrainer` of 2 CPU workers (gloo) trains a
tiny seeded model; rank 1 leaks LEAK_MIB a step in every attempt (a new worker process
starts empty); every step calls `cgwatch.integrations.ray.guard_step`, the driver runs
`cgwatch.integrations.ray.fit(trainer)` with `FailureConfig(max_failures=1)`. Asserted:
- the kernel killed nothing and neither did Ray's memory monitor;
- the guard stopped the first attempt, both workers reported the stop's checkpoint, and Ray
  Train started one new worker group whose workers resumed at the step after the stop;
- the guard stopped the second attempt too: `max_failures` used up, `fit` said so and exited
  75, and the run's newest checkpoint holds both workers' state at that second stop (what a
  new `fit` would resume from);
- every step up to the second stop ran exactly once on each rank (none trained twice, none
  skipped), and each rank's losses equal an uninterrupted run's (the same job without leak
  or guard) step for step, `==` on the floats;
- nothing is left: no process in the node's cgroup, Ray's session directory inside the
  test's own (short) temporary directory, no /tmp/ray and no ~/.ray made.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cgroup_helpers import MiB, Tree, read, wait_for
from tests.integration.children import require

pytestmark = pytest.mark.integration

require("torch", "ray")

from bench import ray_side_by_side as side  # noqa: E402

NODE_LIMIT = 2560 * MiB  # the whole node: ~1.9-2.1 GiB before the leak (bench/ray_side_by_side)
LEAK_MIB = 8  # a step of ~70 ms (0.05 s of it asleep): ~110 MiB/s, seen by the forecast
STEPS = 200  # each attempt is stopped ~60 steps into its life (the bench's figures)


@pytest.fixture
def ray_dir() -> Iterator[Path]:
    """The Ray nodes' session directories: a short path of the test's own (Ray refuses a
    session whose sockets' paths exceed AF_UNIX's 107 bytes, which pytest's tmp_path
    would), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="cgw-ray-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run(tree: Tree, root: Path, ray_dir: Path, name: str, **config: Any) -> dict[str, Any]:
    """One run of the job in its own directory under `root` (Ray's session under
    `ray_dir`), in a fresh limited cgroup."""
    directory = root / name
    directory.mkdir()
    cgroup = tree.make(f"ray-{name}", NODE_LIMIT)
    job = side.job_config("cgwatch" if config.pop("guarded") else "alone", "leak",
                          str(directory), steps=STEPS, every=0, max_failures=1,
                          ray_dir=str(ray_dir / name), **config)
    got = side.run_job(tree, cgroup, job, side.environment("test", str(directory)),
                       timeout=600)
    assert got["rc"] == 0 and got["result"] is not None, got["stdout"][-3000:] + got["stderr"]
    # Ray's processes are gone once the driver returned from ray.shutdown() (a few may
    # still be exiting).
    procs = os.path.join(cgroup, "cgroup.procs")
    assert wait_for(lambda: not read(procs).split(), timeout=30), read(procs)
    got["kernel_kills"] = side.cgroups.oom_kills(cgroup, tree.version)
    got["ray_kills"] = side.ray_kills(str(ray_dir / name))
    got["lines"] = side.step_lines(str(directory))
    got["sessions"] = list((ray_dir / name).glob("session_2*"))
    return got


def test_stop_report_restart_resume_equals_an_uninterrupted_run(
        tree: Tree, tmp_path: Path, ray_dir: Path) -> None:
    had_tmp_ray = os.path.exists("/tmp/ray")
    had_home_ray = os.path.exists(os.path.expanduser("~/.ray"))
    started = time.monotonic()
    guarded = run(tree, tmp_path, ray_dir, "guarded", guarded=True, leak_mib=LEAK_MIB,
                  leak_attempts="all")
    reference = run(tree, tmp_path, ray_dir, "reference", guarded=False, leak_mib=0)
    output = guarded["stdout"] + guarded["stderr"]
    assert guarded["result"]["end"] == "exit 75", output[-5000:]
    assert reference["result"]["end"] == "finished", reference["stdout"][-3000:]
    assert (guarded["kernel_kills"], guarded["ray_kills"]) == (0, 0), output[-5000:]

    # Two attempts: the guard's stop ended the first; Ray Train started the second, which
    # the guard stopped too.
    ends = set()
    for rank in (0, 1):
        lines = guarded["lines"][rank]
        pids = list(dict.fromkeys(line["pid"] for line in lines))
        assert len(pids) == 2, (rank, pids)
        first_life = [line["step"] for line in lines if line["pid"] == pids[0]]
        second_life = [line["step"] for line in lines if line["pid"] == pids[1]]
        stop, last = first_life[-1], second_life[-1]
        assert 1 < stop < last < STEPS, (rank, stop, last)
        ends.add((stop, last))
        # Resumed at the step after the stop: the stop's checkpoint, not an older one.
        assert second_life[0] == stop + 1 and {line["first"] for line in lines
                                               if line["pid"] == pids[1]} == {stop + 1}
        # Every step once (none twice, none skipped), and the uninterrupted run's losses.
        steps = [line["step"] for line in lines]
        assert steps == list(range(1, last + 1)), (rank, steps)
        losses = [line["loss"] for line in lines]
        assert losses == [line["loss"] for line in reference["lines"][rank]][:last], rank
    assert len(ends) == 1, ends  # both workers stopped at the same steps
    # The newest checkpoint is the second stop's, both workers' files in it.
    newest = max((tmp_path / "guarded" / "storage" / "job").glob("checkpoint_2*"))
    import torch

    assert [torch.load(newest / f"rank{rank}.pt")["step"] for rank in (0, 1)] == [last] * 2
    assert "Ray Train's max_failures used up; the checkpoint of step" in output, output[-3000:]
    assert "GuardStopped: cgwatch guard: save and stop" in output, output[-5000:]
    assert "[FailurePolicy] RETRY" in output, output[-5000:]

    # Nothing left behind: Ray's session directories are the test's, nothing in /tmp/ray or
    # ~/.ray (Ray 2.60 writes ~/.ray/auth_token unless RAY_AUTH_MODE=disabled).
    assert len(guarded["sessions"]) == 1 and len(reference["sessions"]) == 1
    assert os.path.exists("/tmp/ray") == had_tmp_ray
    assert os.path.exists(os.path.expanduser("~/.ray")) == had_home_ray
    stops = [line for line in output.splitlines() if "cgwatch guard: save and stop" in line]
    print(f"ray test: {time.monotonic() - started:.0f} s (guarded {guarded['wall']} s, "
          f"reference {reference['wall']} s); stops at steps {stop}, {last}: {stops[:1]}")
