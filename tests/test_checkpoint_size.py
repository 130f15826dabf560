"""What a checkpoint holds, as the framework adapters count it (integrations/_guarded.py:
`state_bytes`, `has_state`, `CheckpointSize`), and when they give it to the guard
(`Guard.estimate_checkpoint`): only when the user said nothing of a save's time or size.

Tensors, models and optimizers are fakes with the duck-typed surface torch's have
(`numel()`, `element_size()`, `data_ptr()`; `parameters()`, `buffers()`; `state`,
`param_groups`): no torch here. The HF and Lightning callbacks are built on fake framework
bases (their modules' `_build()`, not the cached class), so their own hooks are driven.
tests/integration/test_guard_healthy.py compares the estimate with the files the real
frameworks write.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any, NamedTuple, Optional

import pytest

from cgwatch import Guard, Monitor
from cgwatch.testdoor import CHECKPOINT_EXTRAS_BYTES as EXTRAS_BYTES
from cgwatch.testdoor import CheckpointSize, build_callback_class, has_state, state_bytes
from tests.fake_tree import FakeHost, GiB, MiB

_next_ptr = [0x10000]


class T:
    """A tensor's surface: `numel()`, `element_size()`, `data_ptr()` (0: none, as torch
    answers for an empty or a meta tensor)."""

    def __init__(self, numel: int, element_size: int = 4, ptr: Optional[int] = None) -> None:
        self._numel, self._size = numel, element_size
        if ptr is None:
            _next_ptr[0] += 1 << 20
            ptr = _next_ptr[0]
        self._ptr = ptr

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return self._size

    def data_ptr(self) -> int:
        return self._ptr


class Model:
    def __init__(self, params: list[Any], buffers: Optional[list[Any]] = None) -> None:
        self._params, self._buffers = params, buffers or []

    def parameters(self) -> Iterator[Any]:
        return iter(self._params)

    def buffers(self) -> Iterator[Any]:
        return iter(self._buffers)


class Optimizer:
    def __init__(self, state: dict[Any, Any], params: list[Any]) -> None:
        self.state = state
        self.param_groups = [{"params": params, "lr": 1e-3}]


def adam_state(params: list[T], tensor_step: bool = True) -> dict[Any, Any]:
    """torch.optim.Adam(W) after a step: exp_avg and exp_avg_sq like the parameter, `step`
    a float32 scalar tensor of each parameter's own (torch 2.x) or an int (torch 1.x)."""
    return {p: {"step": T(1) if tensor_step else 1, "exp_avg": T(p.numel(), p.element_size()),
                "exp_avg_sq": T(p.numel(), p.element_size())} for p in params}


W1, B1 = T(256 * 32), T(256)  # Linear(32, 256) in fp32: 32768 + 1024 bytes
W2, B2 = T(256), T(1)  # Linear(256, 1): 1024 + 4 bytes
MLP = [W1, B1, W2, B2]  # 34820 bytes: the integration tier's Lightning model
WTE = T(1000 * 64)  # a tied embedding: GPT-2's wte is its lm_head's weight, 256000 bytes
HALF = [T(1000, 2), T(10, 2)]  # fp16 parameters: 2020 bytes
EMPTY_A, EMPTY_B = T(0, 4, ptr=0), T(0, 4, ptr=0)
META_A, META_B = T(100, 4, ptr=0), T(50, 4, ptr=0)  # no storage: data_ptr() is 0
VIEW = T(16, 4, ptr=W1.data_ptr())  # a view at the start of W1's storage (64 bytes)


class Row(NamedTuple):
    id: str
    model: Any
    optimizers: list[Any]
    expected: int  # worked out by hand in the comment


ROWS = [
    # The MLP's parameters only: 32768 + 1024 + 1024 + 4.
    Row("mlp-before-step", Model(MLP), [Optimizer({}, MLP)], 34820),
    # AdamW after a step: the parameters x 3, and 4 float32 `step` scalars: 34820 * 3 + 16.
    Row("mlp-adamw", Model(MLP), [Optimizer(adam_state(MLP), MLP)], 104476),
    # torch 1.x kept `step` as an int: no tensor, not counted: 34820 * 3.
    Row("mlp-adam-int-step", Model(MLP),
        [Optimizer(adam_state(MLP, tensor_step=False), MLP)], 104460),
    # Tied weights: the same Parameter in parameters() twice, and again as a buffer: once.
    Row("tied", Model([WTE, WTE, B1], [WTE]), [], 256000 + 1024),
    # BatchNorm1d(256)'s buffers: running_mean, running_var (fp32), num_batches_tracked
    # (int64): 1024 + 1024 + 8, beside its weight and bias (1024 + 1024): 4104.
    Row("batchnorm-buffers", Model([T(256), T(256)], [T(256), T(256), T(1, 8)]), [], 4104),
    # fp16 parameters, the optimizer's fp32 master copies in its param_groups (a ZeRO or
    # mixed-precision optimizer) and their Adam state: 2020 + 4040 + 4040 * 2 + 8.
    Row("fp16-with-fp32-masters", Model(HALF),
        [Optimizer(adam_state(MASTERS := [T(1000), T(10)]), MASTERS)], 14148),
    # Two optimizers (a GAN's): each one's state, the shared model counted once.
    Row("two-optimizers", Model(MLP),
        [Optimizer(adam_state(MLP[:2]), MLP[:2]),
         Optimizer(adam_state(MLP[2:]), MLP[2:])], 104476),
    # No storage (data_ptr() 0): empty tensors add 0, meta ones count by identity, each.
    Row("no-storage", Model([EMPTY_A, EMPTY_B, META_A, META_B]), [], 400 + 200),
    # A view starting where W1's storage starts: one storage, its larger figure (W1's).
    Row("view-of-a-parameter", Model([W1], [VIEW]), [], 32768),
    # None for an optimizer (the Trainer's before it made one), a model without the methods.
    Row("nothing", object(), [None], 0),
    # A wrapper whose `state` is no mapping (a user's optimizer): its params still count.
    Row("state-not-a-mapping", Model([]), [types.SimpleNamespace(
        state=None, param_groups=[{"params": [B1]}])], 1024),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_state_bytes(row: Row) -> None:
    assert state_bytes(row.model, row.optimizers) == row.expected


@pytest.mark.parametrize("optimizers, expected", [
    ([], False),
    ([None], False),
    ([Optimizer({}, MLP)], False),  # Adam before its first step; SGD without momentum
    ([Optimizer({}, MLP), Optimizer(adam_state(MLP), MLP)], True),
], ids=["none", "no-optimizer-yet", "empty-state", "one-with-state"])
def test_has_state(optimizers: list[Any], expected: bool) -> None:
    assert has_state(optimizers) is expected


# ---- the guard takes the estimate only when the user gave nothing --------------------------

@pytest.fixture
def monitor(tmp_path: object) -> Iterator[Monitor]:
    host = FakeHost(str(tmp_path), 2, cgroup_path="/job")
    host.make_path({"/job": 4 * GiB})  # usage 100 MiB, inactive 10 MiB: working set 90 MiB
    with Monitor(host.root, thread=False) as m:
        yield m


def test_the_guard_takes_an_estimate_only_without_the_users_figure(monitor: Monitor) -> None:
    with Guard(monitor, events=False) as guard:
        guard.check(1)  # no size known: the 1 s floor
        assert guard.checkpoint_seconds == 1.0
        assert guard.estimate_checkpoint(300 * MiB)
        assert guard.checkpoint_bytes == 300 * MiB
        assert guard.checkpoint_seconds == 3.0  # 300 MiB / 100 MiB/s
        assert guard.lead == 4.5 + guard.check_gap  # x 1.5, and the time between checks
        guard.saved(0.2)  # a timed save wins over the estimate
        assert guard.checkpoint_seconds == 0.2
        with pytest.raises(ValueError):
            guard.estimate_checkpoint(-1)
    with Guard(monitor, events=False, checkpoint_seconds=7) as guard:
        assert not guard.estimate_checkpoint(300 * MiB)
        assert guard.checkpoint_bytes is None and guard.checkpoint_seconds == 7.0
    with Guard(monitor, events=False, checkpoint_bytes="500M") as guard:
        assert not guard.estimate_checkpoint(300 * MiB)
        assert guard.checkpoint_bytes == 500 * MiB and guard.checkpoint_seconds == 5.0


class Counting(Guard):
    """A Guard that counts the estimates offered to it."""

    offered: list[int]

    def estimate_checkpoint(self, nbytes: int) -> bool:
        self.offered = [*getattr(self, "offered", []), nbytes]
        return super().estimate_checkpoint(nbytes)


def test_estimates_until_the_optimizer_has_state_at_most_three(monitor: Monitor) -> None:
    empty, stepped = Optimizer({}, MLP), Optimizer(adam_state(MLP), MLP)
    with Counting(monitor, events=False) as guard:
        size = CheckpointSize()
        size.update(guard, Model(MLP), [empty])  # before the optimizer's first step
        assert not size.done and guard.checkpoint_bytes == 34820 + EXTRAS_BYTES
        size.update(guard, Model(MLP), [stepped])
        assert size.done and guard.checkpoint_bytes == 104476 + EXTRAS_BYTES
        size.update(guard, Model(MLP), [stepped])
        assert guard.offered == [34820 + EXTRAS_BYTES, 104476 + EXTRAS_BYTES]  # no more
    with Counting(monitor, events=False) as guard:  # SGD without momentum: never any state
        size = CheckpointSize()
        for _ in range(10):
            size.update(guard, Model(MLP), [empty])
        assert size.done and size.estimates == 3 and len(guard.offered) == 3
    with Counting(monitor, events=False, checkpoint_seconds=2) as guard:  # the user's
        size = CheckpointSize()
        size.update(guard, Model(MLP), [empty])
        size.update(guard, Model(MLP), [stepped])
        assert size.done and size.nbytes is None and len(guard.offered) == 1
        assert guard.checkpoint_bytes is None


# ---- the adapters, driven through their hooks on fake framework bases ----------------------

@pytest.fixture
def fake_frameworks(monkeypatch: pytest.MonkeyPatch) -> None:
    """`transformers.TrainerCallback` and `lightning.pytorch.Callback` as plain classes."""
    transformers = types.ModuleType("transformers")
    transformers.TrainerCallback = type("TrainerCallback", (), {})  # type: ignore[attr-defined]
    lightning = types.ModuleType("lightning")
    pytorch = types.ModuleType("lightning.pytorch")
    pytorch.Callback = type("Callback", (), {})  # type: ignore[attr-defined]
    lightning.pytorch = pytorch  # type: ignore[attr-defined]
    for name, module in (("transformers", transformers), ("lightning", lightning),
                         ("lightning.pytorch", pytorch)):
        monkeypatch.setitem(sys.modules, name, module)


def _hf_steps(callback: Any, model: Any, optimizer: Any, steps: int) -> None:
    args = types.SimpleNamespace(process_index=0, world_size=1, output_dir="out")
    control = types.SimpleNamespace(should_save=False, should_training_stop=False)
    for step in range(1, steps + 1):
        state = types.SimpleNamespace(global_step=step)
        callback.on_step_end(args, state, control, model=model, optimizer=optimizer)


# What the user gave the callback (or the Guard passed to it) -> the guard's checkpoint_bytes
# after the adapter's steps: the estimate only when nothing was given.
GIVEN = [
    pytest.param({}, 104476 + EXTRAS_BYTES, id="nothing-given"),
    pytest.param({"checkpoint_seconds": 2.0}, None, id="seconds-given"),
    pytest.param({"checkpoint_bytes": "10M"}, 10 * MiB, id="bytes-given"),
]


@pytest.mark.usefixtures("fake_frameworks")
@pytest.mark.parametrize("given, expected", GIVEN)
def test_hf_callback_sizes_the_checkpoint_only_when_nothing_was_given(
        monitor: Monitor, given: dict[str, Any], expected: Optional[int]) -> None:
    cls = build_callback_class("transformers")
    stepped = Optimizer(adam_state(MLP), MLP)
    made = cls(monitor=monitor, events=False, **given)  # the guard made from keywords
    _hf_steps(made, Model(MLP), stepped, 5)
    assert made.guard.checkpoint_bytes == expected
    with Guard(monitor, events=False, **given) as guard:  # a guard the user passed
        passed = cls(guard)
        _hf_steps(passed, Model(MLP), stepped, 5)
        assert guard.checkpoint_bytes == expected
    made.guard.close()


@pytest.mark.usefixtures("fake_frameworks")
@pytest.mark.parametrize("given, expected", GIVEN)
def test_lightning_callback_sizes_the_checkpoint_only_when_nothing_was_given(
        monitor: Monitor, given: dict[str, Any], expected: Optional[int]) -> None:
    cls = build_callback_class("lightning")
    # Lightning's optimizer is empty at the first batch end only with manual optimization;
    # here the first two batches see none, the third AdamW's state.
    optimizers: list[Any] = [Optimizer({}, MLP)]
    trainer = types.SimpleNamespace(global_step=0, optimizers=optimizers, global_rank=0,
                                    num_devices=1, default_root_dir="out", should_stop=False)
    with Guard(monitor, events=False, **given) as guard:
        callback = cls(guard)
        for step in range(1, 6):
            trainer.global_step = step
            if step == 3:
                optimizers[0] = Optimizer(adam_state(MLP), MLP)
            callback.on_train_batch_end(trainer, Model(MLP), None, None, step - 1)
        assert guard.checkpoint_bytes == expected
        assert callback.checkpoint_size.done
        assert callback.checkpoint_size.estimates == (3 if not given else 1)


class Engine:
    """What guard_step reads of a DeepSpeed engine: module, optimizer, ranks."""

    def __init__(self, optimizer: Any) -> None:
        self.module, self.optimizer = Model(MLP), optimizer
        self.global_rank, self.world_size = 0, 1


@pytest.mark.parametrize("given, expected", [
    ({}, 104476 + EXTRAS_BYTES),
    ({"checkpoint_seconds": 2.0}, None),
], ids=["nothing-given", "seconds-given"])
def test_deepspeed_guard_step_sizes_the_checkpoint_only_when_nothing_was_given(
        monitor: Monitor, monkeypatch: pytest.MonkeyPatch, given: dict[str, Any],
        expected: Optional[int]) -> None:
    from cgwatch.integrations.deepspeed_guard import guard_step

    monkeypatch.delenv("CGWATCH_SAVES_DIR", raising=False)
    with Guard(monitor, events=False, **given) as guard:
        engine = Engine(Optimizer(adam_state(MLP), MLP))
        for step in range(1, 4):
            assert not guard_step(guard, engine, step, "ckpt").stop
        assert guard.checkpoint_bytes == expected
