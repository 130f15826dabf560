"""`cgwatch run --guard` against the real kernel: CMD (tests/leak_child.py in `signal` mode:
no cgwatch inside, it saves and exits 0 on SIGUSR1, as Lightning's Slurm support does)
leaks 8 MiB/s in a cgroup limited to 128 MiB, made under this test's own memory cgroup;
`cgwatch run` wraps it in that cgroup, so the guard reads CMD's cgroup. With --guard it
sends SIGUSR1 before the limit is reached: the checkpoint is written, `oom_kill` stays 0,
and `run` exits 75. Checked on 6.18, cgroup v1 (the kernel facts are the ones
tests/test_guard_real.py names)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator

import pytest

from tests.cgroup_helpers import MiB, Tree, cgroup_tree, oom_kills, real_kernel_marks

pytestmark = real_kernel_marks()

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "leak_child.py")


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def run_guarded(tree: Tree, cgroup: str, *options: str, checkpoint: str) -> tuple[int, str]:
    argv = [sys.executable, "-m", "cgwatch.cli", "run", *options, "--",
            sys.executable, CHILD, "--mode", "signal", "--checkpoint", checkpoint]
    proc = tree.spawn(cgroup, f"import sys\nos.execv(sys.executable, {argv!r})\n")
    out, err = proc.communicate(timeout=120)
    assert out == "started\n"
    return proc.returncode, err


def test_run_guard_sends_sigusr1_and_the_job_saves(tree: Tree, tmp_path: object) -> None:
    job = tree.make("job", limit=128 * MiB)
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    report = os.path.join(str(tmp_path), "report.json")
    status, err = run_guarded(tree, job, "--guard", "--signal", "SIGUSR1",
                              "--checkpoint-seconds", "2", "--report", report,
                              checkpoint=checkpoint)
    assert status == 75, err
    with open(checkpoint) as f:
        assert json.load(f)["signal"] == signal.SIGUSR1
    assert oom_kills(job, tree.version) == 0
    lines = err.splitlines()
    assert len(lines) == 1, err  # the guard's one line; nothing else is added
    assert lines[0].startswith("cgwatch guard: save and stop: cgroup ")
    assert "; sending SIGUSR1 to python" in lines[0]
    with open(report) as f:
        data = json.load(f)
    assert data["exit_status"] == 75 and data["oom_kills"] == 0
    assert data["guard"]["signal"] == "SIGUSR1"
    assert data["guard"]["trigger"] in ("forecast", "reserve"), data["guard"]
    assert data["guard"]["headroom"] > 0


def test_run_guard_leaves_a_job_that_fits_alone(tree: Tree, tmp_path: object) -> None:
    """A job far from its limit: nothing added to its output, its own status."""
    job = tree.make("job", limit=512 * MiB)
    argv = [sys.executable, "-m", "cgwatch.cli", "run", "--guard", "--", "sh", "-c", "exit 3"]
    proc = tree.spawn(job, f"import sys\nos.execv(sys.executable, {argv!r})\n")
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (3, "", "")
