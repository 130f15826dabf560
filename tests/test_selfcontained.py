"""The repository cites only itself: no absolute path of a development machine, no
`../shared/...` beside the checkout, no notes file that is not in the repository.

Code, tests and docs ship (docstrings in the wheel, the docs on the site, the tests in the
sdist) to people who have none of a development machine's directories. A fact learned from
notes kept elsewhere is restated in docs/ and cited there (Lightning's SIGUSR1 requeue in
docs/guard.md, the Slurm recipe's workarounds in docs/testing.md). This test reads every file
git tracks (every file of the tree in an sdist, which has no .git) and names each offending line.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import NamedTuple

import pytest

from tests.cgroup_helpers import PROJECT

HERE = os.path.relpath(os.path.abspath(__file__), PROJECT)

# A home or work directory at the start of an absolute path. Not one inside another path:
# `/proc/PID/root/...` (a process's root, read by the sidecar tests) and `$tmp/root/...` are
# preceded by a name character, a `}` or a `$`-variable's name.
MACHINE_PATH = re.compile(r"(?<![\w.}$/-])/(?:work|home|root|Users)/")
SHARED = re.compile(r"\.\./shared\b")
MARKDOWN = re.compile(r"[\w.-]+\.md\b")
SKIPPED_DIRS = {"__pycache__", "build", "dist", "site", "node_modules"}  # and .* (venvs)
# Markdown files the project writes, not notes it cites: bench.campaign's OUT/table.md.
WRITTEN = {"table.md"}


def tracked_files() -> list[str]:
    """git's list of tracked files; in an sdist (no .git), every file of the tree."""
    try:
        out = subprocess.run(["git", "-C", PROJECT, "ls-files", "-z"], capture_output=True,
                             check=True, timeout=60).stdout
        if out:
            return [name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        pass
    found = []
    for top, dirs, files in os.walk(PROJECT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")
                   and not d.endswith(".egg-info")]
        found += [os.path.relpath(os.path.join(top, f), PROJECT) for f in files]
    return found


def texts() -> list[tuple[str, str]]:
    """(path, text) of every tracked text file but this one (it names the patterns)."""
    out = []
    for name in tracked_files():
        path = os.path.join(PROJECT, name)
        if name == HERE or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:
            continue  # an image
        out.append((name, data.decode("utf-8", "replace")))
    return out


def offending(pattern: re.Pattern[str], files: list[tuple[str, str]]) -> list[str]:
    return [f"{name}:{number}: {line.strip()}" for name, text in files
            for number, line in enumerate(text.splitlines(), start=1) if pattern.search(line)]


@pytest.fixture(scope="module")
def files() -> list[tuple[str, str]]:
    got = texts()
    assert len(got) > 100, "the repository's files were not found"
    return got


class Row(NamedTuple):
    line: str
    bad: bool
    id: str


# The patterns, on lines seen in this repository before issue 26 and on ones that must pass.
ROWS = [
    Row("handler (a handler of ours would turn it off: /work/shared/training/NOTES.md §5).",
        True, "notes-by-absolute-path"),
    Row('    "WorkDir=/work/wt-slurm2 Power= \\n")', True, "slurm-fixture-workdir"),
    Row("#   tests/vm/run /work/main/.venv/bin/python -m pytest tests/v2", True, "usage-example"),
    Row('    if real.startswith("/root/") and os.path.exists(...)', True, "root-home"),
    Row("cd /home/alice/cgwatch", True, "home"),
    Row('    shm = f"/proc/{proc.pid}/root/dev/shm/batch"', False, "proc-pid-root"),
    Row("Row(CONTAINER_MOUNTINFO, True, \"/proc/77/root/sys/fs/cgroup/memory\")", False,
        "proc-77-root"),
    Row('repoint / "$tmp/root/" "$tmp/root"', False, "variable-root"),
    Row('os.path.expanduser("~/.pyenv")', False, "home-by-tilde"),
    Row("/sys/fs/cgroup/memory/process_api/d52ac", False, "cgroup-path"),
]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_machine_path_pattern(row: Row) -> None:
    assert bool(MACHINE_PATH.search(row.line)) is row.bad


def test_no_absolute_path_of_a_development_machine(files: list[tuple[str, str]]) -> None:
    found = offending(MACHINE_PATH, files)
    assert not found, "say it relative to the checkout, or as a neutral path:\n" + \
        "\n".join(found)


def test_nothing_points_beside_the_checkout(files: list[tuple[str, str]]) -> None:
    found = offending(SHARED, files)
    assert not found, "restate the fact in docs/ and cite that page:\n" + "\n".join(found)


def test_every_markdown_file_cited_is_in_the_repository(files: list[tuple[str, str]]) -> None:
    ours = {os.path.basename(name) for name, _ in files} | {os.path.basename(HERE)} | WRITTEN
    found = [f"{name}: {cited}" for name, text in files
             for cited in sorted(set(MARKDOWN.findall(text))) if cited not in ours]
    assert not found, "a notes file outside the repository (restate it in docs/):\n" + \
        "\n".join(found)
