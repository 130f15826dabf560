"""Issue 32's healthy jobs near their limit, on the real kernel: a plain Python job in a cgroup
limited to 512 MiB (made under this test's own memory cgroup) whose memory runs at 80-90 % of
the limit, each row of the issue's table in both ways in with the documented defaults: its
own loop's `Guard().check()` every step (tests/shape_child.py), and `cgwatch run --guard`
watching it from outside (`--no-guard`). Each must run to its end: status 0, "done", no
guard line, no OOM kill. The shapes (shape_child.py's `saw90`, `saw80`, `peak90`, `warm85`,
`first90`) add the interpreter's ~25 MiB to shares of the limit; the kernel's peak is
checked to be where the row says (>= 78 % of the limit), so a shape that drifted low could
not pass for one near the limit.

The same shapes in the HF Trainer and Lightning, and at other limits, are the campaign's
(docs/bench.md, "The quick round near the limit"); 8 and 16 GiB, the simulation's."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Optional

import pytest

from tests.cgroup_helpers import MiB, Tree, cgroup_tree, oom_kills, read, real_kernel_marks

pytestmark = real_kernel_marks()

SHAPES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shape_child.py")
LIMIT = 512 * MiB
SECONDS = 8.0
# Every large bytes object in its own mmap, so that a free returns its pages to the kernel at
# once (glibc keeps freed heap memory below its dynamic mmap threshold, up to 32 MiB).
ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def peak_share(tree: Tree, job: str, limit: int) -> float:
    """The cgroup's peak usage over its limit: v1 memory.max_usage_in_bytes, v2 memory.peak."""
    name = "memory.max_usage_in_bytes" if tree.version == 1 else "memory.peak"
    return int(read(os.path.join(job, name)).strip()) / limit


def runs_to_its_end(tree: Tree, job: str, child: list[str], way: str, checkpoint: str) -> None:
    """shape_child.py `child` in `job`, with its own Guard() (`way` "guard") or under
    `cgwatch run --guard` (`way` "run"): it ran to its end, status 0 and "done", no guard
    line, no checkpoint, no OOM kill."""
    if way == "guard":
        argv = [sys.executable, *child]
    else:
        argv = [sys.executable, "-m", "cgwatch.cli", "run", "--guard", "--",
                sys.executable, *child, "--no-guard"]
    code = (f"import os, sys\nos.environ.update({ENV!r})\n"
            f"os.execv(sys.executable, {argv!r})\n")
    proc = tree.spawn(job, code)
    out, err = proc.communicate(timeout=300)
    assert (proc.returncode, out) == (0, "started\ndone\n"), err
    assert "cgwatch guard" not in err, err
    assert not os.path.exists(checkpoint)
    assert oom_kills(job, tree.version) == 0


@pytest.mark.parametrize("way", ["guard", "run"])
@pytest.mark.parametrize(("shape", "seconds"), [
    pytest.param("saw90", SECONDS, id="sawtooth-2s-to-90"),
    pytest.param("saw80", SECONDS, id="sawtooth-0.5s-to-80"),
    pytest.param("peak90", SECONDS, id="in-step-peak-0.25s-to-90"),
    # 80 % over 10 s, ~41 MiB/s, then flat for 2 s: at its top ~77 MiB left, ~1.9 s at that
    # rate, over the guard's lead with no save size known (1 s x 1.5 + 0.1 s). The same over
    # 5 s (82 MiB/s: ~0.95 s left at its top) was stopped by `run --guard`'s forecast, 3 of 4:
    # a leak of that speed there has under a second, and must be stopped (design.md section
    # 15, "Where no rule can be right"), and the simulated campaign counts such warm-ups
    # among its healthy stops (docs/bench.md).
    pytest.param("warm85", 12.0, id="cache-warming-to-85"),
    pytest.param("first90", SECONDS, id="first-step-takes-90"),
])
def test_a_healthy_job_near_its_limit_runs_to_its_end(tree: Tree, tmp_path: object,
                                                      shape: str, seconds: float,
                                                      way: str) -> None:
    job = tree.make("job", limit=LIMIT)
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    child = [SHAPES, "--shape", shape, "--limit", str(LIMIT), "--seconds", str(seconds),
             "--checkpoint", checkpoint]
    runs_to_its_end(tree, job, child, way, checkpoint)
    assert peak_share(tree, job, LIMIT) >= 0.78


GIB = 1024 * MiB


@pytest.mark.parametrize("way", ["guard", "run"])
@pytest.mark.parametrize(("shape", "period", "seconds"), [
    # issue 32's 8 GiB rows, stopped 2 of 2 each way by the rule before (the lead from the
    # working set, ~117 s; "the job's largest rise, 1023.9 MiB" under run --guard): a
    # sawtooth to ~90 % in a 20 s cycle, two cycles; a first step taking ~90 %, then flat
    pytest.param("saw90", 20.0, 42.0, id="sawtooth-20s-to-90"),
    pytest.param("first90", None, 10.0, id="first-step-takes-90"),
])
def test_an_8_gib_job_near_its_limit_runs_to_its_end(tree: Tree, tmp_path: object, shape: str,
                                                    period: Optional[float], seconds: float,
                                                    way: str) -> None:
    limit = 8 * GIB
    job = tree.make("job", limit=limit)
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    child = [SHAPES, "--shape", shape, "--limit", str(limit), "--seconds", str(seconds),
             "--checkpoint", checkpoint] + (["--period", str(period)] if period else [])
    runs_to_its_end(tree, job, child, way, checkpoint)
    assert peak_share(tree, job, limit) >= 0.84
