"""Skip a test module whose optional distribution is not installed, saying which one and
which extra brings it. A packager who installs only the `test` extra runs the sdist's tests:
what needs `prometheus_client` or `build` must skip with the reason, never fail or error.

Asked of the installed distributions (importlib.metadata), not by importing: `import build`
succeeds on the `build/` directory that `pip install .` leaves in a checkout (a namespace
package), so pytest.importorskip("build") did not skip there and the test errored."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pytest


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
