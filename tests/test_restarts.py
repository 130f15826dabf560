"""`cgwatch run --guard --restarts N`'s decision as tables (cgwatch/cli/restarts.py): the step
read from a checkpoint's name, and what follows an attempt given the history of attempts."""

from __future__ import annotations

import os
from typing import Optional

import pytest

from cgwatch.cli.restarts import MAX_DELAY, Attempt, next_attempt, parse_step


@pytest.mark.parametrize("path, step", [
    ("/ckpt/step-000120.json", 120),           # tests/restart_job.py's names
    ("/out/checkpoint-500", 500),              # HF Trainer's output_dir entries
    ("/out/checkpoint-500/", 500),
    ("/ckpt/epoch=2-step=300.ckpt", 300),      # Lightning's ModelCheckpoint default
    ("/ckpt/global_step40", 40),               # DeepSpeed's save_checkpoint tag
    ("/ckpt/ckpt.pt", None),                   # a name without a step: progress unknown
    ("/ckpt/model.v2.pt", None),               # a number after the first dot is no step
    ("/ckpt/.tmp123", 123),
    (None, None), ("", None),
])
def test_parse_step(path: Optional[str], step: Optional[int]) -> None:
    assert parse_step(path) == step


SAVED = 75


@pytest.mark.parametrize("history, restarts, delay, expected_delay, words", [
    # Ends: the status is the run's.
    ([Attempt(0)], 3, 1.0, None, ""),                                # finished at once
    ([Attempt(143)], 3, 1.0, None, ""),                              # died of the signal
    ([Attempt(137)], 3, 1.0, None, ""),                              # OOM-killed anyway
    ([Attempt(1)], 3, 1.0, None, ""),
    ([Attempt(SAVED, 40), Attempt(0)], 3, 1.0, None, "ended with exit 0 after 1 restart"),
    ([Attempt(SAVED, 40), Attempt(SAVED, 80), Attempt(143)], 3, 1.0, None,
     "ended with exit 143 after 2 restarts"),
    # Restarts, the delay doubling from --restart-delay.
    ([Attempt(SAVED, 40)], 3, 1.0, 1.0, "restart 1 of 3 from step 40 in 1 s (CGWATCH_RESTART=1)"),
    ([Attempt(SAVED, 40), Attempt(SAVED, 81)], 3, 1.0, 2.0, "restart 2 of 3 from step 81 in 2 s"),
    ([Attempt(SAVED, 1), Attempt(SAVED, 2), Attempt(SAVED, 3)], 3, 0.5, 2.0, "restart 3 of 3"),
    ([Attempt(SAVED)], 3, 1.0, 1.0, "restart 1 of 3 in 1 s"),         # no step: restarted
    ([Attempt(SAVED, 1)] + [Attempt(SAVED, k) for k in range(2, 10)], 20, 1.0, MAX_DELAY,
     "restart 9 of 20"),                                             # capped
    ([Attempt(SAVED, 5)], 3, 0.0, 0.0, "in 0 s"),
    # The same stop: no step between two stops.
    ([Attempt(SAVED, 20), Attempt(SAVED, 20)], 3, 1.0, None,
     "the same stop twice: the guard stopped job at step 20 again"),
    ([Attempt(SAVED, 20), Attempt(SAVED, 19)], 3, 1.0, None, "the same stop twice"),
    ([Attempt(SAVED, 10), Attempt(SAVED, 20), Attempt(SAVED, 20)], 5, 1.0, None,
     "needs more memory than its limit at that point; exit 75 after 2 restarts"),
    ([Attempt(SAVED), Attempt(SAVED)], 3, 1.0, 2.0, "restart 2 of 3"),  # unknown: no judgement
    ([Attempt(SAVED, 20), Attempt(SAVED)], 3, 1.0, 2.0, "restart 2 of 3 in 2 s"),
    # Restarts used up.
    ([Attempt(SAVED, 10)], 0, 1.0, None, "stopped by the guard 1 time, --restarts 0 used up"),
    ([Attempt(SAVED, 10), Attempt(SAVED, 20)], 1, 1.0, None,
     "2 times, --restarts 1 used up; exit 75 (saved, may be resumed)"),
    ([Attempt(SAVED), Attempt(SAVED)], 1, 1.0, None,
     "used up (no step number in the checkpoint's name: progress could not be told)"),
])
def test_next_attempt(history: list[Attempt], restarts: int, delay: float,
                      expected_delay: Optional[float], words: str) -> None:
    after = next_attempt(history, restarts, delay, "job")
    assert after.delay == expected_delay
    assert words in after.line if words else after.line == ""


# ---- the loop in cli/run.py, its attempts faked ---------------------------------------------

@pytest.mark.parametrize("attempts, restarts, status, restarts_seen, sleeps, last_words", [
    # (run's status, the checkpoint the stop saved) per attempt
    ([(75, "/c/step-000054.json"), (75, "/c/step-000107.json"), (0, None)], 3, 0, [0, 1, 2],
     [0.5, 1.0], "ended with exit 0 after 2 restarts"),
    ([(75, "/c/step-000020.json"), (75, "/c/step-000020.json")], 3, 75, [0, 1], [0.5],
     "the same stop twice"),
    ([(143, None)], 3, 143, [0], [], None),
    ([(75, None), (75, None)], 1, 75, [0, 1], [0.5], "progress could not be told"),
])
def test_run_restarting(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                        attempts: list[tuple[int, Optional[str]]], restarts: int, status: int,
                        restarts_seen: list[int], sleeps: list[float],
                        last_words: Optional[str]) -> None:
    import argparse

    from cgwatch.cli.restarts import Attempt, parse_step
    from cgwatch.cli.run import run_restarting

    seen: list[int] = []
    slept: list[float] = []
    queue = list(attempts)

    def fake_attempt(restart: int) -> Attempt:
        seen.append(restart)
        status, checkpoint = queue.pop(0)
        return Attempt(status, parse_step(checkpoint) if checkpoint else None)

    args = argparse.Namespace(restart_delay=0.5, json=False)
    assert run_restarting(args, ["python", "job.py"], restarts, attempt=fake_attempt,
                          sleep=slept.append) == status
    assert (seen, slept) == (restarts_seen, sleeps)
    err = capsys.readouterr().err.strip().splitlines()
    if last_words is None:
        assert err == []
    else:
        assert last_words in err[-1] and err[-1].startswith("cgwatch run: ")


@pytest.mark.parametrize("restart, added", [(0, None), (1, "1"), (3, "3")])
def test_restart_environment(monkeypatch: pytest.MonkeyPatch, restart: int,
                             added: Optional[str]) -> None:
    from cgwatch.cli.run import child_environment

    monkeypatch.delenv("CGWATCH_RESTART", raising=False)
    env = child_environment(None, restart)
    if added is None:
        assert env is None  # the first run's environment is run's own, unchanged
    else:
        assert env is not None and env["CGWATCH_RESTART"] == added
        assert {k: v for k, v in env.items() if k != "CGWATCH_RESTART"} == dict(os.environ)
