"""Skip a test module whose optional distribution is not installed, saying which one and
which extra brings it (and a test whose Debian program is missing: debian_program). A
packager who installs only the `test` extra runs the sdist's tests: what needs
`prometheus_client` or `build` must skip with the reason, never fail or error.

Asked of the installed distributions (importlib.metadata), not by importing: `import build`
succeeds on the `build/` directory that `pip install .` leaves in a checkout (a namespace
package), so pytest.importorskip("build") did not skip there and the test errored."""

from __future__ import annotations

import os
import shutil
from importlib.metadata import PackageNotFoundError, version

import pytest

from cgwatch.envswitch import switch_on


def installed(distribution: str) -> bool:
    try:
        version(distribution)
    except PackageNotFoundError:
        return False
    return True


def need(*distributions: str, extra: str) -> None:
    """Skip the calling module unless every distribution is installed."""
    missing = [d for d in distributions if not installed(d)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (pip install 'cgwatch[{extra}]'): not "
                    "installed", allow_module_level=True)


def debian_program(name: str, package: str) -> str:
    """The path of a program that Debian's `package` brings (scripts/test unpacks it and puts
    it on PATH: tests/tools); missing, the calling test skips, or fails under
    CGWATCH_REQUIRE_REAL=1, where a skip would hide a tier that must run."""
    found = shutil.which(name)
    if found:
        return found
    if switch_on("CGWATCH_REQUIRE_REAL", os.environ):
        pytest.fail(f"{name} missing but CGWATCH_REQUIRE_REAL=1 (scripts/test unpacks "
                    f"Debian's {package} package: tests/tools)")
    pytest.skip(f"no {name} on PATH (PATH=$(tests/tools):$PATH, or Debian's {package} package)")
