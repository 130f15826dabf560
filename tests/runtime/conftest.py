"""The runtime tier's guard: where real containers must run (CGWATCH_REQUIRE_REAL=1, set by
scripts/test as root, and passed into the VM), a skipped runtime test is a failure: a missing
runtime, an unusable cgroup or a runtime that refuses to start must never pass as "skipped"."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
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


def leftovers() -> list[str]:
    """What the runtime tier makes and must have removed: containers, their cgroups below
    ours, bundles, lxcfs mount points and processes."""
    from tests.cgroup_helpers import own_memory_cgroup
    from tests.runtime.oci import runtime_call, runtimes

    found: list[str] = []
    res, _ = own_memory_cgroup()
    version = res.version if res is not None else 1
    for runtime in runtimes(version):
        if shutil.which(runtime) is None:
            continue
        listing = runtime_call(runtime, version, "list", "-q", check=False, timeout=60)
        found += [f"{runtime} container {name}" for name in listing.stdout.split()
                  if name.startswith("cgwatch-test-")]
    if res is not None:
        for top in glob.glob(os.path.join(res.directory, "cgwatch-test-*")):
            found += [f"cgroup {d}" for d in glob.glob(os.path.join(top, "**", "ctr"),
                                                          recursive=True)]
    tmp = tempfile.gettempdir()
    for pattern in ("cgwatch-bundle-*", "cgwatch-lxcfs-*"):
        found += glob.glob(os.path.join(tmp, pattern))
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"lxcfs" and \
                any(b"cgwatch-lxcfs-" in a for a in argv):
            found.append(f"lxcfs process {pid}")
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Only after runtime tests ran: then anything they left behind fails the run
    if not any(item.path.parent.name == "runtime" for item in session.items):
        return
    left = leftovers()
    if left:
        print("\ntests/runtime: LEFT BEHIND: " + "; ".join(left), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
