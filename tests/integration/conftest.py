"""Fixtures of the integration tier: a cgroup tree for the children, their environment, and
the switches' .pth file in this interpreter's site-packages."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cgroup_helpers import Tree, cgroup_tree, writable_reason


@pytest.fixture(scope="module")
def tree() -> Iterator[Tree]:
    why = writable_reason()
    if why:
        pytest.skip(f"integration tier needs a writable memory cgroup: {why}")
    with cgroup_tree() as t:
        yield t


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The children's environment: no cgwatch/DeepSpeed switches inherited, an empty torch
    extensions dir (so a run that tried to JIT-compile an op would show it), and torch's
    compile cache in the test's own directory: `import lightning` imports torch._dynamo, which
    makes that directory at import (torch 2.13), by default $TMPDIR/torchinductor_<user>, so
    a tier run without its own TMPDIR would leave it in /tmp."""
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("CGWATCH", "DS_ACCELERATOR"))}
    e["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "torch_extensions")
    e["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "torchinductor")
    e["PYTHONUNBUFFERED"] = "1"
    return e


@pytest.fixture(scope="module")
def pth_installed() -> Iterator[str]:
    """cgwatch-autoload.pth in this interpreter's site-packages, written by the documented
    command; removed afterwards unless it was there before (it is inert without the switches)."""
    from cgwatch.integrations import switches

    path = switches.pth_path()
    existed = os.path.exists(path)
    out = subprocess.run([sys.executable, "-m", "cgwatch.integrations", "install-pth"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == path
    try:
        yield path
    finally:
        if not existed:
            switches.uninstall_pth()


@pytest.fixture
def quiet_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with one OpenMP thread: two on a loaded 2-core machine spin against each other
    (an HF step of ~40 ms took 0.2-0.5 s at load 6) and a leak per step would follow the
    load."""
    return {**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
