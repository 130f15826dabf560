"""`cgwatch replay` over small hand-made records (cgwatch/guardreplay.py, cli/replay.py): a
table of records -> where the decision stops, how the would-be stops are judged, whether
the live verdicts written in the record were reproduced; and a Guard on a fake tree whose
record replays to its own live decisions. The real-kernel runs are tests/test_observe_real.py.

Every record is one level, /job, limited to 128 MiB; `interval=0` (a sample at every check)
and `rise_margin=0` (no room kept for a largest rise) unless a row says otherwise, so each
check is a sample and the verdict follows from its figures alone. The reserve: 5 % of 128
MiB = 6.4 MiB (6710886 bytes); 10 %: 12.8 MiB. The lead: checkpoint_seconds 2 x margin 1.5
+ the longest gap between checks (1 s here) = 4 s.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple, Optional

import pytest

from cgwatch import Guard, Monitor
from cgwatch.alerts import Threshold
from cgwatch.cli import main
from cgwatch.guardrecord import RecordEncoder, header_line, note_line, parse_record
from cgwatch.guardreplay import replay
from tests.fake_tree import FakeHost, GiB, MiB

LIMIT = 128 * MiB
OPTIONS = {"reserve": "5%", "rise_margin": 0, "checkpoint_seconds": 2.0, "interval": 0.0}


def record(headrooms: list[Optional[int]], end: Optional[tuple[float, bool]] = None,
           verdicts: Optional[dict[int, dict[str, Any]]] = None) -> list[str]:
    """A record whose check i comes at i + 1 seconds with /job's headroom `headrooms[i]`
    (None: no sample at that check, only available_memory()); available = the headroom; the
    end at (seconds, OOM-killed). Made by hand (no "live" in its header: a replay does not
    check it against live decisions), unless `verdicts` (check index -> the live verdict
    written there) says which were live."""
    enc = RecordEncoder(0)
    lines = [header_line(OPTIONS, 0, 0.0, True, **({"live": True} if verdicts else {}))]
    last = headrooms[0]
    for i, headroom in enumerate(headrooms):
        us = (i + 1) * 1_000_000
        if headroom is None:
            lines.append(enc.check(us, last, 0, None))
            continue
        last = headroom
        level = ("/job", LIMIT, headroom, LIMIT - headroom)
        lines.append(enc.check(us, headroom, 0, i, levels=[level],
                               verdict=(verdicts or {}).get(i)))
    if end is not None:
        lines.append(note_line("end", int(end[0] * 1_000_000), oom_killed=end[1]))
    return lines


class Row(NamedTuple):
    lines: list[str]
    overrides: dict[str, Any]
    first_stop: Optional[tuple[float, str]]  # (seconds, trigger) of the first stop
    judged: list[tuple[str, Optional[float]]]  # each would-be stop: judgement, lead it had
    mismatches: int = 0


ROWS = [
    # 100 MiB, 60, 20, then 5 MiB < 6.4 at t=4: a reserve stop; OOM-killed at t=5: the
    # stop stood until the kill, 1 s after it: needed, with 1 s.
    pytest.param(Row(record([100 * MiB, 60 * MiB, 20 * MiB, 5 * MiB], end=(5.0, True)), {},
                     (4.0, "reserve"), [("needed", 1.0)]), id="leak-killed"),
    # A peak to 5 MiB at t=2, freed at t=3 and the job ends at t=10 without a kill: false.
    pytest.param(Row(record([100 * MiB, 5 * MiB, 100 * MiB, 100 * MiB], end=(10.0, False)),
                     {}, (2.0, "reserve"), [("false", None)]), id="peak-then-finished"),
    # 10 MiB is above 6.4 MiB: no stop with the recorded 5 %...
    pytest.param(Row(record([100 * MiB, 10 * MiB, 10 * MiB], end=(4.0, False)), {},
                     None, []), id="fits-the-reserve"),
    # ...but under 12.8 MiB: with --reserve 10 % it stops at t=2, and the job, which
    # finished at t=4 without a kill, was stopped for nothing: false.
    pytest.param(Row(record([100 * MiB, 10 * MiB, 10 * MiB], end=(4.0, False)),
                     {"reserve": Threshold(fraction=0.10)}, (2.0, "reserve"), [("false", None)]),
                 id="a-larger-reserve-would-stop"),
    # Checks without levels between (the decision asks for a sample at each, interval=0:
    # it takes the next levels recorded, at t=4): 4 MiB decides; no end line (the record
    # stopped, as a writer killed with its job does): the stop is open.
    pytest.param(Row(record([100 * MiB, None, None, 4 * MiB]), {}, (4.0, "reserve"),
                     [("open", None)]), id="no-end-line"),
    # A live record saying the verdict changed to a stop at check 1, where 90 MiB of
    # headroom makes none: one mismatch.
    pytest.param(Row(record([100 * MiB, 90 * MiB], verdicts={1: {"stop": True}}), {}, None,
                     [], mismatches=1), id="live-said-otherwise"),
]


@pytest.mark.parametrize("row", ROWS)
def test_replay(row: Row) -> None:
    replayed = replay(parse_record(row.lines), row.overrides)
    first = next(((t, v.trigger) for t, v in replayed.changes if v.stop), None)
    assert first == row.first_stop
    assert [(j.judged, j.lead_had) for j in replayed.judged] == row.judged
    assert len(replayed.mismatches) == row.mismatches, replayed.mismatches
    assert replayed.exact == (row.mismatches > 0)  # only the live record is checked


def test_the_command(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    """The text and the status: 0 when the live decisions were reproduced, 1 when not."""
    path = os.path.join(str(tmp_path), "leak.rec")
    with open(path, "w") as f:
        f.writelines(record([100 * MiB, 60 * MiB, 20 * MiB, 5 * MiB], end=(5.0, True),
                            verdicts={3: {}}))
    assert main(["replay", path, "--reserve", "10%"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"cgwatch replay: {path}: 4 checks, 4 samples over 4.0 s; with --reserve 10%"
    assert out[1].startswith("cgwatch replay: it would stop at 4.0 s: save and stop at step 3: "
                             "cgroup /job: headroom 5.0 MiB of 128.0 MiB")
    assert out[2:] == ["cgwatch replay: 1 would-be stop(s): 0 false, 1 needed, 0 open; the "
                       "needed had 1.0 s before the kill",
                       "cgwatch replay: the job ended at 5.0 s, killed by SIGKILL (the OOM "
                       "killer)"]
    # as recorded: the stop's verdict written as {} is not the one replayed: exit 1
    assert main(["replay", path]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "cgwatch replay: the replay differs from the live decisions:"
    assert main(["replay", path, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (data["reproduced"], data["first_stop"]["trigger"]) == (False, "reserve")


def test_not_a_record(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    path = os.path.join(str(tmp_path), "x")
    with open(path, "w") as f:
        f.write('{"x": 1}\n')
    assert main(["replay", path]) == 1
    assert capsys.readouterr().err.startswith(f"cgwatch replay: {path}: not a cgwatch "
                                              "guard record (version 1): line 1 is ")


# ---- a live Guard's record replays to its own decisions -----------------------------------


def test_a_guard_s_record_replays_to_its_live_decisions(job_host: FakeHost, job_monitor: Monitor,
                                                         tmp_path: object) -> None:
    """A climb to 102 MiB of headroom (a reserve stop), freed, climbed again, with a
    previous life's state loaded, saves and an estimate reported between: every change of
    the live verdict comes back, equal in every field, at the same check."""
    path = os.path.join(str(tmp_path), "guard.rec")
    live = []
    with Guard(job_monitor, reserve="5%", interval=0.05, events=False, record=path) as guard:
        guard.subscribe(lambda v: live.append(v))
        guard.load_state_dict({"version": 1, "saves": [0.75]})  # a previous life's
        guard.estimate_checkpoint(200 * MiB)
        for round_ in range(2):
            for step in range(60):
                job_host.set_usage("/job", 1 * GiB + step * 50 * MiB, 0)
                guard.check(step)
            guard.saved(0.25 * (round_ + 1))
            job_host.set_usage("/job", 1 * GiB, 0)
            for step in range(60, 80):
                guard.check(step)
    with open(path) as f:
        replayed = replay(parse_record(f))
    assert replayed.mismatches == []
    assert [v for _, v in replayed.changes] == live
    assert any(v.stop for v in live)
