"""Packaging: the sdist and the wheel `python -m build` makes from a copy of this checkout
(offline: --no-isolation, with the dev extra's build and setuptools), built without a warning;
the wheel carries LICENSE, py.typed and the metadata; the unpacked sdist collects its own test
suite without an error."""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.extras import need

REPO = Path(__file__).resolve().parents[1]
need("build", "setuptools", extra="dev")

# Not copied: virtualenvs, caches and earlier build output of the checkout.
_IGNORE = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.pyc", "build", "dist",
                                 "*.egg-info", ".mypy_cache", ".ruff_cache", ".pytest_cache")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, str]]:
    """(sdist, wheel, build output) built from a copy of the checkout, so a build never writes
    into the working tree other tests and engineers use."""
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=_IGNORE)
    out = tmp / "dist"
    # PYTHONDONTWRITEBYTECODE makes setuptools warn that it skips byte-compiling: not a
    # packaging problem, so the build runs without it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                           str(out), str(src)], capture_output=True, text=True, env=env,
                          timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    (sdist,) = out.glob("cgwatch-*.tar.gz")
    (wheel,) = out.glob("cgwatch-*.whl")
    yield sdist, wheel, log


def test_build_is_clean(built: tuple[Path, Path, str]) -> None:
    log = built[2]
    noisy = [line for line in log.splitlines() if re.search(r"warn|deprecat", line, re.I)]
    assert noisy == [], "\n".join(noisy)


def test_wheel_has_license_py_typed_and_metadata(built: tuple[Path, Path, str]) -> None:
    _, wheel, _ = built
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        dist_info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
        metadata = email.parser.Parser().parsestr(z.read(f"{dist_info}/METADATA").decode())
        license_text = z.read(f"{dist_info}/licenses/LICENSE").decode()
    assert "cgwatch/py.typed" in names
    # The .pth switch loads these two by path.
    assert {"cgwatch/envswitch.py", "cgwatch/integrations/_autoload.py"} <= set(names)
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]
    assert license_text.startswith("MIT License")
    assert "Copyright (c) 2026 the cgwatch authors" in license_text
    assert metadata["License-Expression"] == "MIT"
    assert metadata["License-File"] == "LICENSE"
    assert metadata["Author"] == "the cgwatch authors"
    classifiers = metadata.get_all("Classifier") or []
    for wanted in ("Operating System :: POSIX :: Linux", "Typing :: Typed",
                   *(f"Programming Language :: Python :: 3.{minor}" for minor in range(9, 14))):
        assert wanted in classifiers
    assert metadata.get_all("Project-URL")


def test_sdist_ships_its_tests_and_they_collect(built: tuple[Path, Path, str],
                                                tmp_path: Path) -> None:
    sdist, _, _ = built
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        if hasattr(tarfile, "data_filter"):  # 3.12+ and the security backports
            tar.extractall(tmp_path, filter="data")
        else:
            tar.extractall(tmp_path)
    for wanted in ("LICENSE", "README.md", "pyproject.toml", "MANIFEST.in", "tests/conftest.py",
                   "tests/fake_tree.py", "tests/cgroup_helpers.py", "tests/probe_child.py",
                   "tests/v2/run", "tests/vm/run", "tests/integration/setup", "scripts/test",
                   "tests/debcache", "tests/tools",
                   "docs/integrations.md"):
        assert wanted in names, wanted
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    root = tmp_path / top
    # The sdist's own cgwatch (its directory first on sys.path), not this checkout's.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "CGWATCH"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "tests"], cwd=root, capture_output=True,
                          text=True, env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert not re.search(r"\berrors?\b", out.splitlines()[-1]), out[-3000:]
    assert re.search(r"^\d+ tests? collected", out.splitlines()[-1]), out[-3000:]
    where = subprocess.run([sys.executable, "-c", "import cgwatch; print(cgwatch.__file__)"],
                           cwd=root, capture_output=True, text=True, env=env, check=True)
    assert Path(where.stdout.strip()).resolve() == (root / "cgwatch" / "__init__.py").resolve()


def test_sdist_tests_skip_what_the_test_extra_lacks(built: tuple[Path, Path, str],
                                                   tmp_path: Path) -> None:
    """A packager's run: the sdist unpacked, cgwatch with the `test` extra alone in a fresh
    venv (no prometheus_client, no build), the build/ directory `pip install .` leaves in the
    tree (which `import build` takes for the package), then its tests: they all collect, and
    every module that needs an optional distribution skips saying which one, none fails or
    errors. (The wheel built from the same tree is installed: building it again from the sdist
    in an isolated environment costs a minute here and proves nothing more.)"""
    sdist, wheel, _ = built
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp_path, filter="data")
        else:
            tar.extractall(tmp_path)
    root = tmp_path / top
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHONPATH", "CGWATCH", "VIRTUAL_ENV"))}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          f"{wheel}[test]"], cwd=root, capture_output=True, text=True, env=env,
                         timeout=600)
    assert pip.returncode == 0, (pip.stdout + pip.stderr)[-5000:]
    (root / "build" / "lib").mkdir(parents=True)  # what `pip install .` leaves behind
    listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], check=True,
                            capture_output=True, text=True, env=env, timeout=120).stdout
    assert not re.search(r"^(prometheus[-_]client|build)==", listed, re.I | re.M), listed

    def pytest_in_venv(*args: str) -> str:
        proc = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", *args],
                              cwd=root, capture_output=True, text=True, env=env, timeout=600)
        out = proc.stdout + proc.stderr
        # 0: passed; 5: nothing ran (every module skipped)
        assert proc.returncode in (0, 5), out[-5000:]
        return out

    collected = pytest_in_venv("--collect-only", "-q", "tests")
    assert not re.search(r"\berrors?\b", collected.splitlines()[-1]), collected[-3000:]
    optional = sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                      if re.search(r"^need\(", p.read_text(), re.M))
    assert {"tests/test_packaging.py", "tests/test_prometheus.py",
            "tests/test_prometheus_real.py", "tests/test_kubernetes_manifest.py"} \
        <= set(optional), optional
    out = pytest_in_venv("-rs", *optional)
    last = out.splitlines()[-1]
    assert re.search(rf"\b{len(optional)} skipped\b", last), out[-3000:]
    assert not re.search(r"\b(failed|errors?|passed)\b", last), out[-3000:]
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert sum(int(re.findall(r"\[(\d+)\]", line)[0]) for line in skips) == len(optional), out
    for line in skips:  # (venv's own setuptools may be there: then only build is missing)
        assert re.search(r"needs (prometheus-client|build|build, setuptools|kubernetes-validate) "
                         r"\(pip install 'cgwatch\[(prometheus|dev)\]'\): not installed",
                         line), line
