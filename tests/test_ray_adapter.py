"""cgwatch.integrations.ray without Ray: which failures of a Ray Train run were the guard's
stops (`stopped_by_guard`), `GuardStopped` across a pickle (Ray sends it from the worker to
the controller and the driver), and that importing the adapter imports neither Ray nor
torch. The adapter with a real Ray Train job: tests/integration/test_ray_train.py."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any, NamedTuple, Optional

import pytest

from cgwatch.integrations.ray import GuardStopped, stopped_by_guard

STOP_0 = GuardStopped("cgwatch guard: save and stop at step 61: ...", 61)
STOP_1 = GuardStopped("cgwatch guard: save and stop at step 61: rank 1's guard decided", 61)


class WorkerGroupError(Exception):
    """The shape of ray.train.WorkerGroupError (2.60): `worker_failures`, rank -> error."""

    def __init__(self, worker_failures: Any) -> None:
        super().__init__("Training failed due to worker errors")
        self.worker_failures = worker_failures


class Row(NamedTuple):
    id: str
    error: BaseException
    expected: Optional[GuardStopped]


ROWS = [
    Row("every worker stopped by its guard", WorkerGroupError({0: STOP_0, 1: STOP_1}), STOP_0),
    Row("one worker, stopped", WorkerGroupError({1: STOP_1}), STOP_1),
    # A worker killed by the OOM killer: its peer's collective fails, nobody saved.
    Row("a stop beside another failure",
        WorkerGroupError({0: STOP_0, 1: RuntimeError("Connection reset by peer")}), None),
    Row("no worker failure named", WorkerGroupError({}), None),
    Row("a controller error (no worker_failures)", RuntimeError("controller"), None),
    Row("worker_failures not a mapping", WorkerGroupError([STOP_0]), None),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_stopped_by_guard(row: Row) -> None:
    assert stopped_by_guard(row.error) is row.expected


def test_guard_stopped_keeps_its_message_and_step_across_a_pickle() -> None:
    back = pickle.loads(pickle.dumps(STOP_0))
    assert type(back) is GuardStopped
    assert (str(back), back.step) == ("cgwatch guard: save and stop at step 61: ...", 61)


def test_importing_the_adapter_imports_neither_ray_nor_torch() -> None:
    code = ("import sys, cgwatch.integrations.ray\n"
            "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
