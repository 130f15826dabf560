"""Shared fixtures for the fake-tree tests, and the test-session guard: where real cgroups must
be tested, a skip of them is a failure."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from cgwatch import Monitor
from cgwatch.envswitch import switch_on
from cgwatch.testdoor import forget_inotify_refusals
from tests.cgroup_helpers import writable_reason
from tests.fake_tree import FakeHost, GiB


def pytest_sessionstart(session: pytest.Session) -> None:
    # scripts/test sets this when running as root on Linux: there the real-kernel tests must
    # run, so "cgroups not writable" means something is broken, not that they may be skipped.
    if switch_on("CGWATCH_REQUIRE_REAL", os.environ):
        reason = writable_reason()
        if reason:
            raise pytest.UsageError(f"CGWATCH_REQUIRE_REAL=1 but real cgroups unusable: {reason}")


@pytest.fixture(autouse=True)
def no_inherited_inotify_back_off() -> Iterator[None]:
    """Each test starts with no back-off from a refusal an earlier test injected: the hub is
    one per process, so a patched inotify_init's EMFILE otherwise kept the next tests' monitors
    polling for up to 1.5 s (test_fork_child_gets_fresh_values failed so in CI)."""
    forget_inotify_refusals()
    yield
    forget_inotify_refusals()


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def version(request: pytest.FixtureRequest) -> int:
    """The cgroup version of a fake tree: every test that asks runs once for each."""
    return int(request.param)


@pytest.fixture
def host(version: int, tmp_path: Any) -> FakeHost:
    """A FakeHost (process in /a/b/c, only the root level made yet) for v1 and for v2."""
    return FakeHost(str(tmp_path), version)


@pytest.fixture
def opened() -> Iterator[list[Any]]:
    """Append what the test makes (monitors, Events): closed after it, newest first."""
    made: list[Any] = []
    yield made
    for thing in reversed(made):
        thing.close()


@pytest.fixture
def job_host(tmp_path: Any) -> FakeHost:
    """A v2 FakeHost whose process is in /job, limited to 4 GiB (the guard's tests)."""
    host = FakeHost(str(tmp_path), 2, cgroup_path="/job")
    host.make_path({"/job": 4 * GiB})
    return host


@pytest.fixture
def job_monitor(job_host: FakeHost) -> Iterator[Monitor]:
    """A thread-free Monitor of `job_host`."""
    with Monitor(job_host.root, thread=False) as m:
        yield m
