"""bench/campaign_replay.py: a campaign run's guard record, replayed, says whether every live
decision came back, and the table's lines count the runs that agree and name each that does
not. A Guard on a fake tree writes the records here; the real-kernel records are the
campaign's own (docs/bench.md) and tests/test_observe_real.py's."""

from __future__ import annotations

import json
import os

from bench.campaign_replay import replayed, summary
from cgwatch import Guard, Monitor
from tests.fake_tree import FakeHost, GiB, MiB


def guarded_run(host: FakeHost, monitor: Monitor, path: str) -> None:
    """A climb of 50 MiB a check from 1 GiB in /job's 4 GiB until the guard says stop."""
    with Guard(monitor, reserve="5%", interval=0.05, events=False, record=path) as guard:
        for step in range(80):
            host.set_usage("/job", 1 * GiB + step * 50 * MiB, 0)
            if guard.check(step).stop:
                return
    raise AssertionError("the guard never stopped the climb")


def test_a_live_record_agrees_and_names_its_stop(job_host: FakeHost, job_monitor: Monitor,
                                                 tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "guard.record")
    guarded_run(job_host, job_monitor, path)
    got = replayed(path)
    assert got["agree"] is True and got["mismatches"] == []
    assert got["stop"] in ("reserve", "forecast") and got["stop"] == got["live_stop"]
    assert got["checks"] >= got["samples"] >= 1


def test_a_record_whose_live_verdict_was_changed_differs_and_says_where(
        job_host: FakeHost, job_monitor: Monitor, tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "guard.record")
    guarded_run(job_host, job_monitor, path)
    with open(path) as f:
        lines = f.read().splitlines()
    stop = next(i for i, line in enumerate(lines) if '"stop":true' in line.replace(" ", ""))
    check = json.loads(lines[stop])
    check[2]["v"]["trigger"] = "throttle"  # what the live guard did not say
    lines[stop] = json.dumps(check)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    got = replayed(path)
    assert got["agree"] is False
    assert got["live_stop"] == "throttle" and got["stop"] != "throttle"
    assert any("live was" in m for m in got["mismatches"])


def test_no_record_and_not_a_record_are_said(tmp_path: object) -> None:
    assert "absent" in replayed(os.path.join(str(tmp_path), "none"))
    path = os.path.join(str(tmp_path), "text")
    with open(path, "w") as f:
        f.write("hello\n")
    assert replayed(path)["absent"].startswith("not a record")


def test_the_table_lines_count_the_agreeing_runs_and_name_the_others() -> None:
    def run(shape: str, way: str, replay: object) -> dict[str, object]:
        return {"shape": shape, "way": way, "load": "quiet", "framework": "plain",
                "replay": replay}

    agree = {"agree": True, "checks": 100, "mismatches": []}
    differ = {"agree": False, "checks": 50, "mismatches": ["1.000000 s: verdict stayed x"]}
    lines = summary([run("a", "guard", agree), run("b", "run", differ),
                     run("c", "learned", {"absent": "No such file or directory"}),
                     run("d", "none", None)])
    assert "1 of 2 guarded runs' records agree" in lines[0] and "(150 checks)" in lines[0]
    assert "1 runs left no record" in lines[0]
    assert lines[1] == "- differs: plain 'b' (run, quiet): 1.000000 s: verdict stayed x"
    assert lines[2] == "- no record: plain 'c' (learned, quiet): No such file or directory"
    assert len(lines) == 3
    assert summary([run("d", "none", None)]) == []
