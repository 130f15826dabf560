"""The memory guard against the real kernel: a job leaking 8 MiB/s in a cgroup limited to
128 MiB (made under this test's own memory cgroup, tests/cgroup_helpers.py), calling
`Guard.check()` every step (tests/leak_child.py). With the guard it saves its checkpoint and
exits with the guard's status (75) before the kernel kills it: the cgroup's `oom_kill` stays
0. Without it (the control) the kernel's OOM killer kills it (SIGKILL, `oom_kill` rises).

Kernel fact relied on (checked on 6.18, cgroup v1): the working set that the guard forecasts
from (usage_in_bytes - total_inactive_file) grows with the written pages as they are
charged, so its growth is seen before the charge fails at the limit (try_charge() in
mm/memcontrol.c invokes the OOM killer only once reclaim finds nothing to free: anonymous
pages without swap, as on this machine and most training nodes)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cgroup_helpers import (
    MiB,
    Tree,
    cgroup_tree,
    oom_kills,
    real_kernel_marks,
    run_script,
)

pytestmark = real_kernel_marks()

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "leak_child.py")
LIMIT = 128 * MiB


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def spawn_leaker(tree: Tree, cgroup: str, *args: str) -> tuple[int, str, str]:
    return run_script(tree, cgroup, CHILD, *args, timeout=120)


def test_the_guard_saves_and_stops_before_the_kill(tree: Tree, tmp_path: object) -> None:
    job = tree.make("job", limit=LIMIT)
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    status, out, err = spawn_leaker(tree, job, "--mode", "guard", "--checkpoint", checkpoint)
    assert status == 75, err
    with open(checkpoint) as f:
        saved = json.load(f)
    verdict = saved["verdict"]
    # The forecast fired first: 2 s checkpoint x 1.5 = 3 s lead (plus the longest time
    # between two checks, a step of milliseconds; under 1 s even when the loaded machine
    # deschedules the job), ~24 MiB at 8 MiB/s, while the 5% reserve (6.4 MiB) was not
    # reached yet.
    assert verdict["trigger"] == "forecast", verdict
    assert verdict["headroom"] >= verdict["limit"] * 5 // 100, verdict
    assert verdict["seconds_left"] <= verdict["lead"]
    assert 3.0 <= verdict["lead"] < 4.0, verdict
    assert 4 * MiB <= verdict["growth"] <= 12 * MiB, verdict
    assert oom_kills(job, tree.version) == 0
    assert "cgwatch guard: save and stop at step" in err and "predicted to reach" in err


def test_a_guard_in_the_main_process_stops_for_its_worker_s_leak(tree: Tree,
                                                                 tmp_path: object) -> None:
    """The main process is flat and checks; its forked worker (same cgroup, a DataLoader
    worker's stand-in) leaks 8 MiB/s. The guard reads the cgroup, not the process, so the
    main process saves and exits 75 before the kernel picks the worker."""
    job = tree.make("job", limit=LIMIT)
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    status, out, err = spawn_leaker(tree, job, "--mode", "guard", "--worker", "--checkpoint",
                                    checkpoint)
    assert status == 75, err
    with open(checkpoint) as f:
        verdict = json.load(f)["verdict"]
    assert verdict["trigger"] in ("forecast", "reserve"), verdict
    assert verdict["headroom"] > 0, verdict
    assert oom_kills(job, tree.version) == 0
    assert out.startswith("started\nworker "), out


def test_without_the_guard_the_kernel_kills_it(tree: Tree, tmp_path: object) -> None:
    job = tree.make("job", limit=LIMIT)
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    status, out, err = spawn_leaker(tree, job, "--mode", "none", "--checkpoint", checkpoint)
    assert status == -signal.SIGKILL, err
    assert oom_kills(job, tree.version) >= 1
    assert not os.path.exists(checkpoint)


SHAPES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shape_child.py")
SHAPE_LIMIT = 256 * MiB


def spawn_shape(tree: Tree, cgroup: str, *args: str) -> tuple[int, str, str]:
    return run_script(tree, cgroup, SHAPES, *args, timeout=180)


def stopped_shape(tree: Tree, tmp_path: object, *shape: str) -> dict[str, Any]:
    """Run a shape that the guard must stop in a job of SHAPE_LIMIT: it saved and exited 75,
    and the kernel killed nothing; the guard's verdict, as its checkpoint holds it."""
    job = tree.make("job", limit=SHAPE_LIMIT)
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    status, out, err = spawn_shape(tree, job, *shape, "--limit", str(SHAPE_LIMIT),
                                   "--checkpoint", checkpoint)
    assert status == 75, err
    assert oom_kills(job, tree.version) == 0
    with open(checkpoint) as f:
        verdict: dict[str, Any] = json.load(f)["verdict"]
    return verdict


@pytest.mark.parametrize("shape", [
    # The sawtooth (20% -> 60% in 10 pieces, freed), a 0.5 s cycle and a 5 s one.
    pytest.param(["--shape", "sawtooth", "--period", "0.5"], id="sawtooth-0.5s"),
    pytest.param(["--shape", "sawtooth", "--period", "5"], id="sawtooth-5s"),
    # One piece of 25% (64 MiB) at 2 s, then flat: the piece is learned (80 MiB with the
    # margin, + the 12.8 MiB reserve), ~165 MiB stays free.
    pytest.param(["--shape", "step"], id="step-then-flat"),
    # 40% over 3 s, then flat: a start-up ramp (imports, a model load).
    pytest.param(["--shape", "ramp"], id="start-up-ramp"),
])
def test_healthy_shapes_run_to_their_end(tree: Tree, tmp_path: object,
                                         shape: list[str]) -> None:
    """A healthy job under the guard's documented defaults is not stopped (20 s each)."""
    job = tree.make("job", limit=SHAPE_LIMIT)
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    status, out, err = spawn_shape(tree, job, *shape, "--limit", str(SHAPE_LIMIT),
                                   "--seconds", "20", "--checkpoint", checkpoint)
    assert status == 0 and out.endswith("done\n"), err
    assert not os.path.exists(checkpoint)
    assert oom_kills(job, tree.version) == 0


def test_stairs_stop_while_the_next_piece_fits(tree: Tree, tmp_path: object) -> None:
    """46 MiB (18%) a second into 256 MiB, with ~25 MiB of interpreter: 5 stairs are the
    kill. The guard learns a stair (the largest rise between two checks) and keeps 46 x 1.25
    + 12.8 MiB free, so it stops after the 4th stair (~47 MiB left), with the configured 5%
    still free and no kill; the forecast, which needs 6 s of climbing, is not what stops it."""
    verdict = stopped_shape(tree, tmp_path, "--shape", "stairs", "--stair", "0.18",
                            "--seconds", "60")
    assert verdict["trigger"] == "reserve", verdict
    assert verdict["rise"] >= int(SHAPE_LIMIT * 0.18 * 1.25) - 2 * MiB, verdict
    assert verdict["headroom"] >= SHAPE_LIMIT * 5 // 100, verdict


def test_a_leak_with_the_defaults_stops_late(tree: Tree, tmp_path: object) -> None:
    """8 MiB/s into 256 MiB with no save time given: no size known, a save is taken to last
    1 s (x 1.5, plus the time between checks: a lead of ~1.6 s, ~13 MiB at 8 MiB/s), not the
    working set's (~240 MiB / 100 MiB/s x 1.5 ~ 3.6 s before issue 32; 60 s x 1.5 before
    that gave away 53-74% of the limit). The forecast's line is then the 5 % reserve's
    (12.8 MiB), so either may stop it: with under a quarter of the limit free and at least
    4 % (the reserve's line less a sample's fall: 8 MiB/s x up to 0.3 s, at most 2.4 MiB;
    was "the 5 % reserve kept" when the lead was ~29 MiB: measured, 12.4 MiB left), no kill."""
    verdict = stopped_shape(tree, tmp_path, "--shape", "leak", "--rate", "8",
                            "--seconds", "120")
    assert verdict["trigger"] in ("forecast", "reserve"), verdict
    assert SHAPE_LIMIT * 4 // 100 <= verdict["headroom"] <= SHAPE_LIMIT // 4, verdict
    assert verdict["lead"] < 3.0, verdict


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
