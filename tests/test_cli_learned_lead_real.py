"""`cgwatch run --guard --checkpoint-dir DIR` learns its lead from the job's own periodic
checkpoints (issue 32 item 2), against the real kernel: tests/restart_job.py in a cgroup
limited to 128 MiB (made under this test's own memory cgroup, `cgwatch run` inside it) saves
at step 10 as a training loop does, `payload-000010.bin` 8 MiB written over 3 s (the job
waits for it, as a synchronous save), then leaks 1.6 MiB a step, 5 steps a second (8 MiB/s,
as the guard's other real tests).
- The first life: the save is seen (inotify), 3 s and 8 MiB, and the guard's lead at its
  stop is that save x the margin 1.5, where the estimate of a 128 MiB job gives ~1.5 s (at
  most its working set over 100 MiB/s: 1.3 s, x 1.5); it stops in time: saved, exit 75, no
  OOM kill.
- The requeue: a new `run` on the same DIR (as a scheduler's requeue on 75 starts it) starts
  from DIR/.cgwatch-guard.json, says so, and its stop, before any save of its own, has the
  lead the first life learned.
Checked on 6.18, cgroup v1."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cgroup_helpers import MiB, Tree, cgroup_tree, oom_kills, real_kernel_marks

pytestmark = real_kernel_marks()

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "restart_job.py")
SAVE_SECONDS = 3.0


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def one_life(tree: Tree, cgroup: str, directory: str, report: str, log: str
             ) -> tuple[int, str, dict[str, Any]]:
    argv = [sys.executable, "-m", "cgwatch.cli", "run", "--guard", "--checkpoint-dir",
            directory, "--report", report, "--", sys.executable, JOB, "--dir", directory,
            "--log", log, "--steps", "140", "--step-seconds", "0.2", "--leak-mib", "1.6",
            "--save-at", "10", "--save-mib", "8", "--save-seconds", str(SAVE_SECONDS)]
    proc = tree.spawn(cgroup, f"import sys\nos.execv(sys.executable, {argv!r})\n")
    _, err = proc.communicate(timeout=300)
    print(err)  # the transcript (pytest -s shows it; a failure shows it always)
    with open(report) as f:
        return proc.returncode, err, json.load(f)


def test_the_lead_is_learned_from_the_jobs_saves_and_kept_for_its_requeue(
        tree: Tree, tmp_path: Any) -> None:
    job = tree.make("job", limit=128 * MiB)
    directory = os.path.join(str(tmp_path), "ckpt")
    os.mkdir(directory)
    log = os.path.join(str(tmp_path), "steps.log")

    status, err, first = one_life(tree, job, directory, str(tmp_path / "first.json"), log)
    assert status == 75, err
    assert oom_kills(job, tree.version) == 0
    assert "learned by earlier runs" not in err
    learned = first["learned"]
    assert learned["watching"] == "inotify" and learned["loaded"] is None, learned
    [save] = learned["saves"]
    # step-000010.json (~8 kB) and the payload, first open to last close: 3 s of writes,
    # more on a loaded machine
    assert (save["files"], save["name"]) == (2, "payload-000010.bin"), save
    assert 8 * MiB < save["bytes"] < 8 * MiB + 64 * 1024, save
    assert SAVE_SECONDS <= save["seconds"] < SAVE_SECONDS + 1.5, save
    # the lead: that save x 1.5, plus the longest time between two of run's checks (0.1 s
    # apart; under 0.5 s on the loaded machine: Guard.check_gap)
    stop = first["guard"]
    assert 1.5 * save["seconds"] <= stop["lead"] < 1.5 * save["seconds"] + 0.5, stop
    assert stop["saved"] and stop["checkpoint"].endswith(".json"), stop
    stopped_at = int(os.path.basename(stop["checkpoint"])[5:11])
    assert stopped_at > 10  # after the periodic save, before the limit

    status, err, second = one_life(tree, job, directory, str(tmp_path / "second.json"), log)
    assert status == 75, err
    assert oom_kills(job, tree.version) == 0
    state = os.path.join(directory, ".cgwatch-guard.json")
    lines = [line for line in err.splitlines() if "learned by earlier runs" in line]
    assert len(lines) == 1 and lines[0].startswith(
        f"cgwatch guard: starting from 2 saves learned by earlier runs ({state}): "
        f"the longest {save['seconds']:.1f} s, 8.0 MiB; lead "), err
    loaded = second["learned"]["loaded"]
    assert [(s["how"], s["seconds"], s["bytes"]) for s in loaded] == [
        ("watched", save["seconds"], save["bytes"]),
        ("signal", stop["seconds_to_exit"], None)], loaded
    assert second["learned"]["saves"] == []  # none of its own: the stop's is under 1 MiB
    again = second["guard"]
    assert 1.5 * save["seconds"] <= again["lead"] < 1.5 * save["seconds"] + 0.5, again
    with open(log) as f:
        steps = [int(line.split()[1]) for line in f]
    # every step once, in order: the requeued job went on from the step its stop saved
    assert steps == list(range(len(steps))) and len(steps) > stopped_at, steps
