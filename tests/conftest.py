"""Test-session guard: where real cgroups must be tested, a skip of them is a failure."""

from __future__ import annotations

import os

import pytest

from tests.cgroup_helpers import writable_reason


def pytest_sessionstart(session: pytest.Session) -> None:
    # scripts/test sets this when running as root on Linux: there the real-kernel tests must
    # run, so "cgroups not writable" means something is broken, not that they may be skipped.
    if os.environ.get("CGWATCH_REQUIRE_REAL") == "1":
        reason = writable_reason()
        if reason:
            raise pytest.UsageError(f"CGWATCH_REQUIRE_REAL=1 but real cgroups unusable: {reason}")
