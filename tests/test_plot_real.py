"""`cgwatch run --plot` against the real kernel: CMD (tests/leak_child.py) leaks in a cgroup
limited to 128 MiB made under this test's own memory cgroup, and `cgwatch run` wraps it
there. Killed by the kernel (mode `none`) or signalled by `--guard` (mode `signal`), the file
is a real PNG or SVG (its magic bytes), and the `--report` JSON's `timeline` holds the series
drawn: the level's usage climbing toward its limit, the kill's events or the guard's signal,
and the end. Checked on 6.18, cgroup v1."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cgroup_helpers import MiB, Tree, cgroup_tree, real_kernel_marks

pytest.importorskip("matplotlib")  # the plot extra (the dev extra has it)

pytestmark = real_kernel_marks()

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "leak_child.py")
MAGIC = {"png": (b"\x89PNG\r\n\x1a\n", None), "svg": (b"<?xml", b"<svg")}


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def run_plotted(tree: Tree, tmp: str, suffix: str, mode: str,
                *options: str) -> tuple[int, str, dict[str, Any], str]:
    job = tree.make("job", limit=128 * MiB)
    picture = os.path.join(tmp, f"run.{suffix}")
    report = os.path.join(tmp, "report.json")
    argv = [sys.executable, "-m", "cgwatch.cli", "run", "--plot", picture, "--report", report,
            *options, "--", sys.executable, CHILD, "--mode", mode, "--rate", "16",
            "--checkpoint", os.path.join(tmp, "checkpoint.json")]
    proc = tree.spawn(job, f"import sys\nos.execv(sys.executable, {argv!r})\n")
    _, err = proc.communicate(timeout=120)
    with open(report) as f:
        data = json.load(f)
    return proc.returncode, err, data, picture


def check_picture(picture: str, suffix: str) -> None:
    with open(picture, "rb") as f:
        content = f.read()
    head, inside = MAGIC[suffix]
    assert content.startswith(head), content[:16]
    assert inside is None or inside in content
    assert len(content) > 10_000  # axes, lines and labels, not an empty canvas


def usage_column(timeline: dict[str, Any]) -> list[int]:
    names = [n for n in timeline["columns"] if n.startswith("usage:") and n.endswith("/job")]
    assert len(names) == 1, list(timeline["columns"])
    return [v for v in timeline["columns"][names[0]] if v is not None]


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_run_plot_of_a_kernel_kill(tree: Tree, tmp_path: Any, suffix: str) -> None:
    status, err, data, picture = run_plotted(tree, str(tmp_path), suffix, "none")
    assert status == 137, err
    check_picture(picture, suffix)
    timeline = data["timeline"]
    assert len(timeline["times"]) >= 10  # 4 a second for the ~7 s the leak takes
    assert timeline["times"] == sorted(timeline["times"])
    usage = usage_column(timeline)
    assert max(usage) > 96 * MiB  # it climbed toward the 128 MiB limit
    limits = [n for n in timeline["columns"] if n.startswith("limit:")]
    assert any(128 * MiB in timeline["columns"][n] for n in limits)
    labels = [m["label"] for m in timeline["marks"]]
    assert any(label.startswith("oom_kill +") for label in labels), labels
    assert timeline["marks"][-1]["label"] == "killed by SIGKILL"
    assert timeline["marks"][-1]["exit_status"] == 137


def test_run_plot_of_a_guarded_run(tree: Tree, tmp_path: Any) -> None:
    status, err, data, picture = run_plotted(tree, str(tmp_path), "png", "signal", "--guard",
                                             "--signal", "SIGUSR1",
                                             "--checkpoint-seconds", "2")
    assert status == 75, err
    check_picture(picture, "png")
    kinds = [m["kind"] for m in data["timeline"]["marks"]]
    assert kinds[-2:] == ["guard", "exit"], data["timeline"]["marks"]
    guard = data["timeline"]["marks"][-2]
    assert guard["label"].startswith("guard: ") and guard["label"].endswith(", SIGUSR1")
    assert guard["cgroup_path"].endswith("/job")
    assert max(usage_column(data["timeline"])) < 128 * MiB
