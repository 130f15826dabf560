"""The ranks' save records (cgwatch/saves.py) and `run`'s status from them (cli/child.py
`saved_status`): tables of situations, and the records written and read in a directory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple, Optional

import pytest

from cgwatch import saves
from cgwatch.cli.child import saved_status
from cgwatch.saves import Saves, all_saved, read_records, record_save, record_start


def rec(rank: int, saved: bool, attempt: int = 0, world: int = 2,
        step: Optional[int] = 41) -> dict[str, Any]:
    return {"rank": rank, "local_world_size": world, "attempt": attempt, "saved": saved,
            "step": step if saved else None, "checkpoint": None, "pid": 100 + rank}


class Row(NamedTuple):
    id: str
    records: list[dict[str, Any]]
    want: Saves


ROWS = [
    Row("no-records-no-adapter", [], Saves(0, 0, 0, 0, None)),
    # Two ranks under torchrun, both past their save at step 41 (the HF integration run).
    Row("both-saved", [rec(0, True), rec(1, True)], Saves(2, 2, 2, 0, 41)),
    # Rank 1 SIGKILLed in the save: its start record only.
    Row("one-killed-in-the-save", [rec(0, True), rec(1, False)], Saves(1, 2, 2, 0, 41)),
    # Rank 1 OOM-killed before its trainer started: no record at all.
    Row("one-never-started", [rec(0, True)], Saves(1, 2, 1, 0, 41)),
    # torchrun --max-restarts: attempt 0 saved, attempt 1 started both ranks and failed
    # without a stop: the older saves do not count.
    Row("restarted-group-failed", [rec(0, False, 1), rec(1, False, 1)], Saves(0, 2, 2, 1, None)),
    # Attempt 1 restarted only rank 0 far enough to write; rank 1's record is attempt 0's.
    Row("restarted-half-started", [rec(0, False, 1), rec(1, True, 0)], Saves(0, 2, 1, 1, None)),
    Row("restarted-and-saved-again", [rec(0, True, 1, step=90), rec(1, True, 1, step=90)],
        Saves(2, 2, 2, 1, 90)),
    # One process (a single-rank HF job under run).
    Row("one-rank", [rec(0, True, world=1)], Saves(1, 1, 1, 0, 41)),
    # A rank number the node does not have: not one group's directory.
    Row("more-ranks-than-the-node", [rec(0, True), rec(1, True), rec(7, True)],
        Saves(3, 2, 3, 0, 41)),
    Row("steps-differ-no-step", [rec(0, True, step=41), rec(1, True, step=51)],
        Saves(2, 2, 2, 0, None)),
    # Malformed records are left out: they said nothing.
    Row("malformed-left-out", [rec(0, True), {"rank": "1", "saved": True},
                               {**rec(1, True), "attempt": True}],
        Saves(1, 2, 1, 0, 41)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_all_saved(row: Row) -> None:
    assert all_saved(row.records) == row.want


def test_complete_only_when_every_rank_and_no_other_saved() -> None:
    assert [r.id for r in ROWS if r.want.complete] == [
        "both-saved", "restarted-and-saved-again", "one-rank", "steps-differ-no-step"]


class StatusRow(NamedTuple):
    id: str
    status: int
    saves: Saves
    want: int
    line: str


BOTH = Saves(2, 2, 2, 0, 41)
HALF = Saves(1, 2, 2, 0, 41)
STATUS_ROWS = [
    StatusRow("torchrun-1-both-saved", 1, BOTH, 75,
              "cgwatch run: every rank (2) saved at step 41 after the guard's stop; torchrun "
              "ended with exit 1; exit 75 (saved, may be resumed)"),
    StatusRow("lightning-137-both-saved", 137, BOTH, 75,
              "cgwatch run: every rank (2) saved at step 41 after the guard's stop; torchrun "
              "ended with killed by SIGKILL; exit 75 (saved, may be resumed)"),
    StatusRow("no-step", 1, Saves(2, 2, 2, 0, None), 75,
              "cgwatch run: every rank (2) saved after the guard's stop; torchrun ended with "
              "exit 1; exit 75 (saved, may be resumed)"),
    StatusRow("one-of-two", 1, HALF, 1,
              "cgwatch run: only 1 of 2 ranks recorded a save after the guard's stop; "
              "torchrun ended with exit 1; not saved: exit 1"),
    StatusRow("finished-after-a-restart-in-place", 0, BOTH, 0, ""),
    StatusRow("already-75", 75, HALF, 75, ""),
    StatusRow("no-adapter", 1, Saves(0, 0, 0, 0, None), 1, ""),
    StatusRow("none-saved", 137, Saves(0, 2, 2, 0, None), 137, ""),
]


@pytest.mark.parametrize("row", STATUS_ROWS, ids=[r.id for r in STATUS_ROWS])
def test_saved_status(row: StatusRow) -> None:
    assert saved_status(row.status, row.saves, "torchrun") == (row.want, row.line)


def test_records_written_and_read(tmp_path: Path) -> None:
    env = {saves.SAVES_ENV: str(tmp_path), "TORCHELASTIC_RESTART_COUNT": "1"}
    assert record_start(0, 2, env) == str(tmp_path / "rank-0.json")
    assert record_start(1, 2, env) == str(tmp_path / "rank-1.json")
    assert all_saved(read_records(str(tmp_path))) == Saves(0, 2, 2, 1, None)
    record_save(1, 2, 41, "out/checkpoint-41", env)
    assert all_saved(read_records(str(tmp_path))) == Saves(1, 2, 2, 1, 41)
    record_save(0, 2, 41, "out/checkpoint-41", env)
    got = all_saved(read_records(str(tmp_path)))
    assert got == Saves(2, 2, 2, 1, 41) and got.complete
    assert sorted(os.listdir(tmp_path)) == ["rank-0.json", "rank-1.json"]  # no temporary left
    assert json.loads((tmp_path / "rank-1.json").read_text()) == {
        "rank": 1, "local_world_size": 2, "attempt": 1, "saved": True, "step": 41,
        "checkpoint": "out/checkpoint-41", "pid": os.getpid()}


def test_nothing_written_outside_run(tmp_path: Path) -> None:
    assert record_start(0, 2, {}) is None
    assert record_save(0, 2, 41, None, {}) is None
    # run's directory gone (run was killed): the job goes on.
    assert record_save(0, 2, 41, None, {saves.SAVES_ENV: str(tmp_path / "gone")}) is None


def test_unreadable_and_foreign_files_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "rank-0.json").write_text(json.dumps(rec(0, True)))
    (tmp_path / "rank-1.json").write_text('{"rank": 1, "sav')  # half a record
    (tmp_path / "rank-1.json.77.tmp").write_text(json.dumps(rec(1, True)))
    (tmp_path / "other.json").write_text(json.dumps(rec(1, True)))
    (tmp_path / "rank-2.json").write_text("[1, 2]")
    assert read_records(str(tmp_path)) == [rec(0, True)]
    assert read_records(str(tmp_path / "missing")) == []


class _Verdict(NamedTuple):
    stop: bool


class _Guard:
    """What guard_step uses of a Guard: check(step), saving() and estimate_checkpoint()."""

    def __init__(self, stop_at: int) -> None:
        self.stop_at = stop_at

    def check(self, step: Optional[int]) -> _Verdict:
        return _Verdict(step == self.stop_at)

    def estimate_checkpoint(self, nbytes: int) -> bool:
        return False  # as a guard given checkpoint_seconds

    def saving(self) -> Any:
        import contextlib

        return contextlib.nullcontext()


class _Engine:
    def __init__(self, rank: int) -> None:
        self.global_rank, self.world_size = rank, 2
        self.saved: list[str] = []

    def save_checkpoint(self, save_dir: str, **kwargs: Any) -> bool:
        self.saved.append(save_dir)
        return True


def test_deepspeed_guard_step_records_start_and_save(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from cgwatch.integrations.deepspeed_guard import guard_step

    monkeypatch.setenv(saves.SAVES_ENV, str(tmp_path))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    guards, engines = [_Guard(3), _Guard(3)], [_Engine(0), _Engine(1)]
    for step in (1, 2):
        for guard, engine in zip(guards, engines):
            assert not guard_step(guard, engine, step, "ckpt").stop
    assert all_saved(read_records(str(tmp_path))) == Saves(0, 2, 2, 0, None)
    assert guard_step(guards[0], engines[0], 3, "ckpt").stop
    assert all_saved(read_records(str(tmp_path))) == Saves(1, 2, 2, 0, 3)
    guard_step(guards[1], engines[1], 3, "ckpt")
    assert all_saved(read_records(str(tmp_path))).complete
    assert [e.saved for e in engines] == [["ckpt"], ["ckpt"]]
