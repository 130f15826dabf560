"""The guard's record format (cgwatch/guardrecord.py): the lines a short run makes, written
out by hand, and what they parse back to; what the writer (cgwatch/recordfile.py) does at
its size cap; refusals."""

from __future__ import annotations

import json
import os

import pytest

from cgwatch.alerts import Threshold
from cgwatch.guardrecord import (
    Check,
    Note,
    RecordEncoder,
    clock_us,
    decode_options,
    encode_options,
    header_line,
    note_line,
    parse_record,
)
from cgwatch.recordfile import RecordFile, record_path

MiB = 1 << 20
JOB = ("/job", 128 * MiB, 100 * MiB, 28 * MiB, None, None, 0)  # no high, no PSI, 0 rises
JOB_LATER = ("/job", 128 * MiB, 96 * MiB, 32 * MiB, None, None, 0)
V2 = ("/v2", 256 * MiB, 200 * MiB, 56 * MiB, 240 * MiB, 1500, 2)


def test_a_short_run_line_by_line() -> None:
    """Start at 5 s (5_000_000 us); checks every ~0.1 s; a sample at the first (step 7) and
    the last (no step); a kill counted at the third; the read failed at the fourth. The
    step is given at samples only: the decision takes it in sample() alone."""
    enc = RecordEncoder(5_000_000)
    lines = [
        header_line({"reserve": Threshold(fraction=0.05), "margin": 1.5}, 5_000_000, 1e9,
                    True, command=["python", "train.py"]),
        enc.check(5_100_000, 100 * MiB, 0, 7, levels=[JOB, V2],
                  verdict={"stop": False, "trigger": ""}),
        enc.check(5_200_013, 100 * MiB - 4096, 0, None),
        note_line("saved", 2.5),
        enc.check(5_300_000, 96 * MiB, 1, None),          # a kill counted
        enc.check(5_400_000, None, 1, None, failed=True),  # the read failed; no step
        enc.check(5_500_000, 96 * MiB, 1, None, levels=[JOB_LATER]),
        note_line("end", 5_600_000, status=0, oom_killed=False),
    ]
    assert lines[0] == ('{"cgwatch_guard_record":1,"options":{"reserve":{"fraction":0.05},'
                        '"margin":1.5},"start_us":5000000,"start_wall":1000000000.0,'
                        '"observe":true,"command":["python","train.py"]}\n')
    assert lines[1:] == [
        # 100 MiB = 104857600; the path first in full, then as index 0; the v2 level keeps
        # its high, PSI total and rises; /job drops its trailing None, None, 0.
        '[100000,104857600,{"s":7,"l":[["/job",134217728,104857600,29360128],'
        '["/v2",268435456,209715200,58720256,251658240,1500,2]],'
        '"v":{"stop":false,"trigger":""}}]\n',
        '[100013,-4096]\n',
        '{"saved":2.5}\n',
        '[99987,-4190208,{"k":1}]\n',        # 96 MiB - (100 MiB - 4096)
        '[100000,null,{"f":1}]\n',
        # 96 MiB again, against the last figure read (96 MiB: the failed read had none)
        '[100000,0,{"l":[[0,134217728,100663296,33554432]]}]\n',
        '{"end":5600000,"status":0,"oom_killed":false}\n',
    ]
    record = parse_record(lines)
    assert record.options == {"reserve": Threshold(fraction=0.05), "margin": 1.5}
    assert record.header["command"] == ["python", "train.py"]
    assert record.entries == [
        Check(5_100_000, 100 * MiB, 0, 7, [JOB, V2], verdict={"stop": False, "trigger": ""}),
        Check(5_200_013, 100 * MiB - 4096, 0),
        Note("saved", 2.5),
        Check(5_300_000, 96 * MiB, 1),
        Check(5_400_000, None, 1, None, failed=True),
        Check(5_500_000, 96 * MiB, 1, None, [JOB_LATER]),
        Note("end", 5_600_000, {"status": 0, "oom_killed": False}),
    ]
    assert record.note("end") == Note("end", 5_600_000, {"status": 0, "oom_killed": False})
    assert record.checks()[1].now == 5.200013


def test_the_clock_is_the_same_float_live_and_replayed() -> None:
    """us / 1e6 is what live and replay both compute; a float through JSON is itself."""
    for us in (1, 999_999, 123_456_789_012, 4_000_000_000_001):
        assert json.loads(json.dumps(clock_us(us))) == clock_us(us) == us / 1e6


def test_options_round_trip() -> None:
    options = {"reserve": Threshold(bytes=512 * MiB), "checkpoint_seconds": None,
               "margin": 1.5}
    assert decode_options(json.loads(json.dumps(encode_options(options)))) == options


@pytest.mark.parametrize("lines, error", [
    pytest.param([], "an empty record", id="empty"),
    pytest.param(['{"something":"else"}\n'], "not a cgwatch guard record", id="not-a-record"),
    pytest.param(['{"cgwatch_guard_record":2,"start_us":0}\n'], "not a cgwatch guard record",
                 id="a-later-version"),
    pytest.param(['{"cgwatch_guard_record":1,"start_us":0}\n', '[1,2\n', '[1,2]\n'],
                 "record line 2: not JSON", id="cut-line-in-the-middle"),
    pytest.param(['{"cgwatch_guard_record":1,"start_us":0}\n', '{"x":1}\n'],
                 "record line 2: not a check or a note", id="unknown-object"),
])
def test_refusals(lines: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_record(lines)


def test_a_last_line_cut_short_is_left_out() -> None:
    """The writer killed mid-line (the OOM killer): the lines before it are the record."""
    record = parse_record(['{"cgwatch_guard_record":1,"start_us":0}\n', '[10,5]\n', '[10,'])
    assert record.entries == [Check(10, 5)]


def test_the_writer_stops_at_its_cap(tmp_path: object) -> None:
    """A cap of 400 bytes: the header (~150) and ~10 checks of ~25 bytes, then one "cut"
    line, then nothing; the record parses, and says where it was cut."""
    path = os.path.join(str(tmp_path), "rec.jsonl")
    writer = RecordFile(path, {"margin": 1.5}, 0, False, max_bytes=400)
    for i in range(1, 50):
        writer.check(i * 100_000, 64 * MiB - i * 4096, 0, i)
    writer.close()
    with open(path) as f:
        lines = f.readlines()
    record = parse_record(lines)
    assert writer.cut and record.note("cut") is not None
    assert sum(len(line) for line in lines[:-1]) <= 400
    assert 5 <= len(record.checks()) < 49


@pytest.mark.parametrize("path, environ, expected", [
    pytest.param("guard.rec", {"RANK": "3"}, "guard.rec", id="no-placeholder"),
    pytest.param("guard-{rank}.rec", {"RANK": "3", "LOCAL_RANK": "1"}, "guard-3.rec",
                 id="torchrun-rank"),
    pytest.param("guard-{rank}.rec", {"LOCAL_RANK": "1"}, "guard-1.rec",
                 id="lightning-local-rank"),
    pytest.param("guard-{rank}.rec", {}, "guard-0.rec", id="one-process"),
])
def test_one_record_per_rank(path: str, environ: dict[str, str], expected: str) -> None:
    assert record_path(path, environ) == expected
