"""The runtime tier's guard: where real containers must run (CGWATCH_REQUIRE_REAL=1, set by
scripts/test as root, and passed into the VM), a skipped runtime test is a failure: a missing
runtime, an unusable cgroup or a runtime that refuses to start must never pass as "skipped".
And at the session's end, anything the runtime tests made and did not remove (a container, its
cgroup, a bundle, an lxcfs process or mount) fails the run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from cgwatch.envswitch import switch_on


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and switch_on("CGWATCH_REQUIRE_REAL", os.environ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"CGWATCH_REQUIRE_REAL=1, but this runtime test was skipped: {reason}"


def leftovers() -> list[str]:
    """What this session's runtime tests made and did not remove: containers, their cgroups
    below ours, bundles, lxcfs processes and mount points (each registered in oci.MADE)."""
    from tests.runtime.oci import MADE

    return [thing for check in MADE for thing in check()]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Only after runtime tests ran: then anything they left behind fails the run
    if not any(item.path.parent.name == "runtime" for item in session.items):
        return
    left = leftovers()
    if left:
        print("\ntests/runtime: LEFT BEHIND: " + "; ".join(left), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
