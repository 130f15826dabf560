"""The runtime tier's guard: where real containers must run (CGWATCH_REQUIRE_REAL=1, set by
scripts/test as root, and passed into the VM), a skipped runtime test is a failure: a missing
runtime, an unusable cgroup or a runtime that refuses to start must never pass as "skipped"."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and os.environ.get("CGWATCH_REQUIRE_REAL") == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"CGWATCH_REQUIRE_REAL=1, but this runtime test was skipped: {reason}"
