"""Which phases of a job the HF and Lightning callbacks check, and what a stop does in each
(issue 32 item 3), driven through their hooks on fake framework bases (no torch here; the
real frameworks: tests/integration/test_guard_evaluation.py).

The guards run on a FakeHost job of 4 GiB whose working set is 90 MiB: a reserve of "1G"
leaves it ~3.9 GiB free (go on), a reserve of 8 GiB puts every level under it (stop at the
first check).

- HF `on_step_end` (training): a stop sets should_save, should_training_stop, and clears
  should_evaluate (the Trainer evaluates before it saves);
- HF `on_prediction_step`, inside train() only: a stop calls `_save_checkpoint`, records
  the save, waits for every rank, exits 75;
- Lightning `on_validation_batch_end`, inside fit() only: a stop calls `save_checkpoint`,
  records the save, exits 75;
- Lightning `on_validation_start` after a training stop (Lightning validates before it
  honours should_stop): exits 75, its save done.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cgwatch import GUARD_EXIT_STATUS, Guard, Monitor
from cgwatch.testdoor import build_callback_class
from tests.fake_tree import FakeHost, GiB
from tests.test_checkpoint_size import fake_frameworks  # noqa: F401 - a fixture: the bases

GO = "1G"  # reserve: 90 MiB used of 4 GiB, far above it
STOP = 8 * GiB  # reserve above the limit: every check says stop


@pytest.fixture
def monitor(tmp_path: Path) -> Iterator[Monitor]:
    host = FakeHost(str(tmp_path / "host"), 2, cgroup_path="/job")
    host.make_path({"/job": 4 * GiB})  # working set 90 MiB (test_checkpoint_size's)
    with Monitor(host.root, thread=False) as m:
        yield m


@pytest.fixture
def saves_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`cgwatch run`'s records directory, as run sets it."""
    directory = tmp_path / "saves"
    directory.mkdir()
    monkeypatch.setenv("CGWATCH_SAVES_DIR", str(directory))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return directory


# ---- Hugging Face -----------------------------------------------------------------------------

class Handler:
    """The Trainer's CallbackHandler: calls each callback's event with the Trainer's kwargs."""

    def __init__(self, callbacks: list[Any]) -> None:
        self.callbacks = callbacks

    def call_event(self, event: str, *args: Any) -> Any:
        for callback in self.callbacks:
            control = getattr(callback, event)(*args, model=None, optimizer=None)
        return control


class Trainer:
    """What the HF callback reaches of a Trainer: its handler, `_save_checkpoint`, its
    accelerator's `wait_for_everyone`; `train()` calls on_train_begin as
    `_inner_training_loop` does (through the handler)."""

    def __init__(self, callback: Any, tmp_path: Path) -> None:
        self.callback_handler = Handler([callback])
        self.model = object()
        self.args = types.SimpleNamespace(process_index=0, world_size=1,
                                          output_dir=str(tmp_path / "out"))
        self.state = types.SimpleNamespace(global_step=0)
        self.control = types.SimpleNamespace(should_save=False, should_training_stop=False,
                                             should_evaluate=False)
        self.calls: list[str] = []
        self.accelerator = types.SimpleNamespace(
            wait_for_everyone=lambda: self.calls.append("wait"))

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        assert model is self.model and trial is None
        self.calls.append(f"save checkpoint-{self.state.global_step}")

    def train_begin(self) -> None:
        self.callback_handler.call_event("on_train_begin", self.args, self.state, self.control)

    def step(self, step: int, evaluate: bool = False) -> Any:
        self.state.global_step = step
        self.control.should_evaluate = evaluate  # as the flow callback sets it
        return self.callback_handler.call_event("on_step_end", self.args, self.state,
                                                self.control)

    def prediction_step(self) -> Any:
        return self.callback_handler.call_event("on_prediction_step", self.args, self.state,
                                                self.control)


@pytest.mark.usefixtures("fake_frameworks")
def test_hf_a_stop_at_a_step_end_skips_its_evaluation(monitor: Monitor,
                                                      tmp_path: Path) -> None:
    callback = build_callback_class("transformers")(monitor=monitor, events=False,
                                                    reserve=STOP)
    trainer = Trainer(callback, tmp_path)
    trainer.train_begin()
    control = trainer.step(1, evaluate=True)
    assert (control.should_save, control.should_training_stop, control.should_evaluate) == \
        (True, True, False)
    assert trainer.calls == []  # the Trainer saves, not the callback
    callback.guard.close()


@pytest.mark.usefixtures("fake_frameworks")
def test_hf_a_stop_in_evaluation_saves_records_waits_and_exits_75(
        monitor: Monitor, tmp_path: Path, saves_dir: Path) -> None:
    with Guard(monitor, events=False, reserve=GO) as guard:  # go: nothing happens
        callback = build_callback_class("transformers")(guard)
        trainer = Trainer(callback, tmp_path)
        trainer.train_begin()
        for step in (1, 2, 3):
            assert not trainer.step(step).should_save
        trainer.prediction_step()
        assert trainer.calls == [] and callback.stopped is None
    with Guard(monitor, events=False, reserve=STOP) as guard:  # stop: in the evaluation
        callback = build_callback_class("transformers")(guard)
        trainer = Trainer(callback, tmp_path)
        trainer.train_begin()
        trainer.state.global_step = 3  # the last finished step
        with pytest.raises(SystemExit) as ended:
            trainer.prediction_step()
    assert ended.value.code == GUARD_EXIT_STATUS
    assert trainer.calls == ["save checkpoint-3", "wait"]
    assert callback.stopped is not None and callback.stopped.stop
    record = json.loads((saves_dir / "rank-0.json").read_text())
    assert (record["saved"], record["step"], record["checkpoint"]) == \
        (True, 3, str(tmp_path / "out" / "checkpoint-3"))


@pytest.mark.usefixtures("fake_frameworks")
def test_hf_evaluation_outside_train_is_not_checked(monitor: Monitor, tmp_path: Path) -> None:
    """`evaluate()` before `train()` (no on_train_begin) and after it (on_train_end)."""
    with Guard(monitor, events=False, reserve=STOP) as guard:
        callback = build_callback_class("transformers")(guard)
        trainer = Trainer(callback, tmp_path)
        trainer.prediction_step()
        trainer.train_begin()
        trainer.callback_handler.call_event("on_train_end", trainer.args, trainer.state,
                                            trainer.control)
        trainer.prediction_step()
    assert trainer.calls == [] and callback.stopped is None


# ---- Lightning --------------------------------------------------------------------------------

class LightningTrainer:
    """What the Lightning callback reaches: global_step, state.fn, save_checkpoint, ..."""

    def __init__(self, fn: str, tmp_path: Path) -> None:
        self.global_step = 7
        self.state = types.SimpleNamespace(fn=fn)
        self.optimizers: list[Any] = []
        self.global_rank, self.num_devices = 0, 1
        self.default_root_dir = str(tmp_path)
        self.should_stop = False
        self.saved: list[str] = []

    def save_checkpoint(self, path: str) -> None:
        self.saved.append(path)


@pytest.mark.usefixtures("fake_frameworks")
def test_lightning_a_stop_in_validation_saves_records_and_exits_75(
        monitor: Monitor, tmp_path: Path, saves_dir: Path) -> None:
    with Guard(monitor, events=False, reserve=STOP) as guard:
        callback = build_callback_class("lightning")(guard)
        trainer = LightningTrainer("fit", tmp_path)
        callback.setup(trainer, None, "fit")
        with pytest.raises(SystemExit) as ended:
            callback.on_validation_batch_end(trainer, None, None, None, 0)
    assert ended.value.code == GUARD_EXIT_STATUS
    path = str(tmp_path / "guard-step=7.ckpt")
    assert trainer.saved == [path] and callback.path == path
    record = json.loads((saves_dir / "rank-0.json").read_text())
    assert (record["saved"], record["step"], record["checkpoint"]) == (True, 7, path)


@pytest.mark.usefixtures("fake_frameworks")
@pytest.mark.parametrize("fn", ["validate", "test", "predict"])
def test_lightning_loops_outside_fit_are_not_checked(monitor: Monitor, tmp_path: Path,
                                                     fn: str) -> None:
    with Guard(monitor, events=False, reserve=STOP) as guard:
        callback = build_callback_class("lightning")(guard)
        trainer = LightningTrainer(fn, tmp_path)
        callback.on_validation_batch_end(trainer, None, None, None, 0)
        callback.on_validation_start(trainer, None)
    assert trainer.saved == [] and callback.stopped is None


@pytest.mark.usefixtures("fake_frameworks")
def test_lightning_leaves_at_the_validation_after_a_training_stop(
        monitor: Monitor, tmp_path: Path) -> None:
    """Lightning validates before it honours should_stop: the saved job leaves there."""
    with Guard(monitor, events=False, reserve=STOP) as guard:
        callback = build_callback_class("lightning")(guard)
        trainer = LightningTrainer("fit", tmp_path)
        callback.on_train_batch_end(trainer, None, None, None, 6)
        assert trainer.should_stop and len(trainer.saved) == 1
        with pytest.raises(SystemExit) as ended:
            callback.on_validation_start(trainer, None)
    assert ended.value.code == GUARD_EXIT_STATUS
    assert len(trainer.saved) == 1  # no second save
