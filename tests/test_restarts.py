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


# ---- the whole life's report and picture (issue 25 item 5) ----------------------------------

def _attempt_report(restart: int, status: int) -> dict[str, object]:
    """A single run's report as --restarts keeps it (cli/run.py _attempt), cut to what the
    life's report looks at."""
    return {"type": "run", "exit_status": status, "restart": restart}


@pytest.mark.parametrize("statuses, decisions, status, made, end", [
    # one attempt that finished: no line was said, no restart made
    ([0], [""], 0, 0, ""),
    # the leak that restarts with the job (tests/test_cli_restarts_real.py): two stops, a finish
    ([75, 75, 0], ["cgwatch run: restart 1 of 3 from step 53 in 0.5 s (CGWATCH_RESTART=1)",
                   "cgwatch run: restart 2 of 3 from step 106 in 1 s (CGWATCH_RESTART=2)",
                   "cgwatch run: python ended with exit 0 after 2 restarts"], 0, 2,
     "cgwatch run: python ended with exit 0 after 2 restarts"),
    # the same stop twice: 75 with restarts left
    ([75, 75], ["cgwatch run: restart 1 of 3 from step 20 in 0.5 s (CGWATCH_RESTART=1)",
                "cgwatch run: the same stop twice: ..."], 75, 1,
     "cgwatch run: the same stop twice: ..."),
    # restart 1 could not start (the program was removed meanwhile): one decision more
    ([75], ["cgwatch run: restart 1 of 3 from step 5 in 1 s (CGWATCH_RESTART=1)",
            "cgwatch run: job could not start (exit 127)"], 127, 1,
     "cgwatch run: job could not start (exit 127)"),
])
def test_life_report(statuses: list[int], decisions: list[str], status: int, made: int,
                     end: str) -> None:
    from cgwatch.cli.run import life_report

    attempts = [_attempt_report(k, s) for k, s in enumerate(statuses)]
    timeline = {"times": [0.0, 1.0], "columns": {}, "marks": []}
    data = life_report(["job"], attempts, decisions, status, 3, timeline)
    assert data["type"] == "run_restarts" and data["command"] == ["job"]
    assert (data["exit_status"], data["restarts_made"], data["restarts_allowed"]) == (
        status, made, 3)
    assert data["end"] == end
    assert data["timeline"] is timeline  # one timeline for the whole life, not one per attempt
    assert [(a["restart"], a["exit_status"]) for a in data["attempts"]] == list(
        enumerate(statuses))
    assert [a["next"] for a in data["attempts"]] == decisions[:len(statuses)]


@pytest.mark.parametrize("restart, step, label", [
    (1, 53, "restart 1 from step 53"),
    (2, None, "restart 2"),           # no step in the checkpoint's name
    (3, 0, "restart 3 from step 0"),  # saved before its first step
])
def test_restart_label(restart: int, step: Optional[int], label: str) -> None:
    from cgwatch.cli.run import restart_label

    assert restart_label(restart, step) == label


@pytest.mark.parametrize("returncode, status, label", [
    (0, None, "exit 0"),                     # no guard
    (0, 0, "exit 0"),                        # the guard did not fire: it finished
    (0, 75, "exit 0 (saved: 75)"),           # saved after the guard's signal
    (75, 75, "exit 75"),                     # said so itself
    (-9, 137, "killed by SIGKILL"),
    (-15, 143, "killed by SIGTERM"),         # no handler: nothing saved
])
def test_end_label(returncode: int, status: Optional[int], label: str) -> None:
    from cgwatch.cli.run import end_label

    assert end_label(returncode, status) == label


def _mark(t: float, kind: str) -> dict[str, object]:
    return {"time": t, "kind": kind, "label": kind}


@pytest.mark.parametrize("marks, start, end, spans", [
    ([], 0.0, 9.0, [(0.0, 9.0)]),                                   # a single run
    ([_mark(2.0, "event"), _mark(5.0, "guard"), _mark(5.2, "exit")], 0.0, 6.0,
     [(0.0, 6.0)]),                                                 # stopped, not restarted
    ([_mark(10.5, "guard"), _mark(10.7, "exit"), _mark(11.4, "restart"),
      _mark(22.0, "guard"), _mark(22.2, "exit"), _mark(23.3, "restart"), _mark(30.0, "exit")],
     0.0, 30.1, [(0.0, 11.4), (11.4, 23.3), (23.3, 30.1)]),         # two restarts, a finish
])
def test_attempt_spans(marks: list[dict[str, object]], start: float, end: float,
                       spans: list[tuple[float, float]]) -> None:
    from cgwatch.cli.plot import attempt_spans

    assert attempt_spans(marks, start, end) == spans
