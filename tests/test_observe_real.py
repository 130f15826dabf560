"""`cgwatch run --guard --observe` (and `--record`, replayed) against the real kernel, in
cgroups made under this test's own memory cgroup, as tests/test_cli_guard_real.py does. The
kernel facts: a v1 memory cgroup's limit is enforced by the OOM killer (SIGKILL, `oom_kill`
counted in memory.oom_control), and nothing else stops a job an observing guard does not
stop. Checked on 6.18, cgroup v1.

- A leak (tests/leak_child.py `none`, 8 MiB/s into 128 MiB, no handler) under --observe is
  not signalled: the kernel kills it (137), and its would-be stop is judged needed, with the
  seconds it would have had for its save.
- A healthy job (a fast start-up, then evaluation spikes; test_cli_guard_real's) runs to its
  end (0); a would-be stop, if the guard made one, is judged false.
- Either run's `--record`, and an acting guard's (which signals the leak, which saves and
  exits 0: 75), given to `cgwatch replay` with no option reproduce every live decision: the
  same samples, the same verdicts at the same checks, the same would-be stops judged alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cgroup_helpers import MiB, Tree, cgroup_tree, oom_kills, real_kernel_marks
from tests.test_cli_guard_real import CHILD, FAST_START_THEN_SPIKES

pytestmark = real_kernel_marks()


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def run_observed(tree: Tree, cgroup: str, options: list[str],
                 command: list[str]) -> tuple[int, str, str, dict[str, Any]]:
    """`cgwatch run --guard --observe --json OPTIONS -- COMMAND` in `cgroup`: the status,
    stdout, stderr's lines but the JSON report, and that report."""
    argv = [sys.executable, "-m", "cgwatch.cli", "run", "--guard", "--observe", "--json",
            *options, "--", *command]
    proc = tree.spawn(cgroup, f"import sys\nos.execv(sys.executable, {argv!r})\n")
    out, err = proc.communicate(timeout=120)
    lines = err.splitlines()
    report = json.loads(lines[-1])
    return proc.returncode, out, "\n".join(lines[:-1]), report


def replayed(path: str) -> dict[str, Any]:
    """`cgwatch replay --json PATH`, which must exit 0 (every live decision reproduced)."""
    proc = subprocess.run([sys.executable, "-m", "cgwatch.cli", "replay", "--json", path],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    data: dict[str, Any] = json.loads(proc.stdout)
    assert data["exact"] and data["reproduced"] and data["mismatches"] == [], data
    return data


def test_a_leak_under_observe_is_killed_and_its_stop_judged_needed(
        tree: Tree, tmp_path: object) -> None:
    job = tree.make("job", limit=128 * MiB)
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    record = os.path.join(str(tmp_path), "leak.rec")
    status, out, err, report = run_observed(
        tree, job, ["--checkpoint-seconds", "2", "--record", record],
        [sys.executable, CHILD, "--mode", "none", "--checkpoint", checkpoint])
    assert status == 137, err  # nothing was sent: the kernel killed it
    assert oom_kills(job, tree.version) >= 1
    assert not os.path.exists(checkpoint)
    assert "would send SIGTERM now, to save (nothing sent); why: cgroup " in err, err
    observed = report["observe"]
    stops = observed["stops"]
    assert stops and all(s["judged"] == "needed" for s in stops), observed
    assert observed["counts"] == {"false": 0, "needed": len(stops), "open": 0}
    # the first would-be stop came with time to spare: at least most of a 2 s x 1.5 lead
    first = stops[0]
    assert first["trigger"] in ("forecast", "reserve"), first
    assert first["lead_had"] is not None and first["lead_had"] > 1.0, first
    assert report["exit_status"] == 137 and report["guard"] is None
    # --plot draws these, each judged
    labels = [m["label"] for m in report["timeline"]["marks"] if m["kind"] == "guard"]
    assert len(labels) == len(stops), labels
    for label, stop in zip(labels, stops):
        assert label.startswith(f"would stop: {stop['trigger']} (needed, "), label
        assert label.endswith(" s before the kill)"), label
    again = replayed(record)
    assert again["oom_killed"] is True
    assert [(s["trigger"], s["judged"]) for s in again["would_stops"]["stops"]] == [
        (s["trigger"], s["judged"]) for s in stops]


def test_an_acting_guard_s_record_replays_to_its_stop(tree: Tree, tmp_path: object) -> None:
    """`run --guard --record` without --observe: the leak is signalled and saves (75); the
    replay's first stop is the one that was acted on."""
    job = tree.make("job", limit=128 * MiB)
    checkpoint = os.path.join(str(tmp_path), "checkpoint.json")
    record = os.path.join(str(tmp_path), "acted.rec")
    argv = [sys.executable, "-m", "cgwatch.cli", "run", "--guard", "--json",
            "--checkpoint-seconds", "2", "--record", record, "--", sys.executable, CHILD,
            "--mode", "signal", "--signal", "SIGTERM", "--checkpoint", checkpoint]
    proc = tree.spawn(job, f"import sys\nos.execv(sys.executable, {argv!r})\n")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    live = json.loads(err.splitlines()[-1])["guard"]
    again = replayed(record)
    first = again["first_stop"]
    assert (first["trigger"], first["level"], first["headroom"]) == (
        live["trigger"], live["level"], live["headroom"])


def test_a_healthy_job_under_observe_ends_and_any_stop_is_judged_false(
        tree: Tree, tmp_path: object) -> None:
    job = tree.make("job", limit=256 * MiB)
    record = os.path.join(str(tmp_path), "healthy.rec")
    status, out, err, report = run_observed(
        tree, job, ["--record", record], [sys.executable, "-c", FAST_START_THEN_SPIKES])
    assert (status, out) == (0, "started\ndone\n"), err
    assert oom_kills(job, tree.version) == 0
    observed = report["observe"]
    assert all(s["judged"] == "false" for s in observed["stops"]), observed
    assert observed["counts"]["needed"] == observed["counts"]["open"] == 0
    again = replayed(record)
    assert again["would_stops"]["counts"] == observed["counts"]
