"""No thread where no callback needs one: after the module functions, the psutil view, the
CGWATCH_PSUTIL switch, patch_psutil() and the Prometheus collector, a fork() raises no
warning on Python 3.12+ ("This process is multi-threaded, use of fork() may lead to
deadlocks in the child"); after `Events()` it does (the thread is needed there), which shows
that the check sees a thread.

Each case runs in a fresh interpreter of Python 3.12 or newer: this one when it is, else
the newest 3.12+ found under pyenv (the venv's packages are put on its path: psutil's
extension is abi3, prometheus_client is pure Python). CPython 3.12 and 3.13 clear the warning
when `-W error` turns it into an exception (the child is already running), so the child
records warnings with `simplefilter("always")` and the test fails on any.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import sysconfig
from typing import Optional

import pytest

from tests.cgroup_helpers import PROJECT


def _interpreter() -> Optional[str]:
    if sys.version_info >= (3, 12):
        return sys.executable
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")]
    found = []
    for root in filter(None, roots):
        for path in glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")):
            version = os.path.basename(os.path.dirname(os.path.dirname(path)))
            try:
                major, minor = (int(x) for x in version.split(".")[:2])
            except ValueError:
                continue
            if (major, minor) >= (3, 12) and os.access(path, os.X_OK):
                found.append(((major, minor), path))
    return max(found)[1] if found else None


PYTHON = _interpreter()
pytestmark = pytest.mark.skipif(
    PYTHON is None, reason="no Python 3.12+ here (this one nor pyenv's): the fork warning "
                           "exists from 3.12 on")

# The step each case runs before forking (psutil and the collector come from the venv).
CASES = {
    "module functions": "import cgwatch; cgwatch.total_memory(); cgwatch.available_memory()",
    "psutil view": "from cgwatch.psutil_view import virtual_memory; virtual_memory()",
    "patch_psutil": "import psutil, cgwatch.psutil_view as v; v.patch_psutil(); "
                    "psutil.virtual_memory()",
    # The .pth line exactly as site.py runs it, then what a program does.
    "CGWATCH_PSUTIL=1": "from cgwatch.integrations.switches import pth_line; "
                        "exec(pth_line()); import psutil; psutil.virtual_memory(); "
                        "import cgwatch.psutil_view as v; assert v.is_patched()",
    "collector": "from cgwatch.prometheus import MonitorCollector; "
                 "list(MonitorCollector().collect())",
    "Events (needs the thread)": "import cgwatch; events = cgwatch.Events()",
}
CHILD = """
import json, os, sys, warnings
exec(sys.argv[1])
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
os.waitpid(pid, 0)
print(json.dumps([str(w.message) for w in seen]))
"""


@pytest.mark.parametrize("case", list(CASES))
def test_fork_after_a_query_is_single_threaded(case: str) -> None:
    assert PYTHON is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGWATCH_")}
    env["PYTHONPATH"] = os.pathsep.join([PROJECT, sysconfig.get_paths()["purelib"]])
    if case == "CGWATCH_PSUTIL=1":
        env["CGWATCH_PSUTIL"] = "1"
    done = subprocess.run([PYTHON, "-c", CHILD, CASES[case]], capture_output=True, text=True,
                          env=env, timeout=120)
    if done.returncode != 0 and "ModuleNotFoundError" in done.stderr:
        pytest.skip(f"{PYTHON} cannot import this venv's packages: {done.stderr[-200:]}")
    assert done.returncode == 0, done.stderr
    warned = json.loads(done.stdout.splitlines()[-1])
    if case.startswith("Events"):
        assert any("multi-threaded" in w for w in warned), (PYTHON, warned)
    else:
        assert warned == [], (PYTHON, warned)
