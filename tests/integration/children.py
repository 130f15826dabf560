"""Child processes of the integration tier: run Python in a limited cgroup and read back the
JSON it reports."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from typing import Any

import pytest

from tests.cgroup_helpers import Tree


def require(*modules: str) -> None:
    """Skip the calling test module unless every one of `modules` can be imported here."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(
            f"integration tier: {', '.join(missing)} not importable in {sys.executable} "
            "(run tests/integration/setup, then .venv-integration/bin/python -m pytest "
            "tests/integration)",
            allow_module_level=True,
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_in(tree: Tree, cgroup: str, code: str, env: dict[str, str],
           timeout: float = 180) -> Any:
    """Run `code` in a child python inside `cgroup`; return the JSON of its `RESULT` line."""
    proc = tree.spawn(cgroup, code, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"child timed out after {timeout}s\nstdout:\n{out[-3000:]}\n"
                    f"stderr:\n{err[-3000:]}")
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{err[-5000:]}"
    results = [line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")]
    assert results, f"child printed no RESULT line\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    return json.loads(results[-1])
