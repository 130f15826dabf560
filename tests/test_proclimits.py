"""Limits on the process that no cgroup enforces: RLIMIT_AS, RLIMIT_DATA, a Slurm job's
declared --mem (cgwatch/proclimits.py). Tables of the pure parts, then a real `ulimit -v`."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Mapping
from typing import NamedTuple, Optional

import pytest

from cgwatch.proclimits import (
    RLIMIT_AS,
    RLIMIT_DATA,
    SLURM,
    ProcessLimit,
    parse_statm,
    rlimit_limits,
    rooms,
    slurm_limit,
)
from cgwatch.slurm import Declared

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
INF = resource.RLIM_INFINITY
PAGE = 4096
# /proc/self/statm of a python3.11 on 6.18 here: size resident shared text lib data dt (pages)
STATM = b"7779 2880 1632 726 0 2083 0\n"


@pytest.mark.parametrize("data, page, want", [
    pytest.param(STATM, 4096, [7779 * 4096, 2880 * 4096, 1632 * 4096, 726 * 4096, 0,
                               2083 * 4096, 0], id="python-4k-pages"),
    pytest.param(b"10 2 1 1 0 3 0", 65536, [10 * 65536, 2 * 65536, 65536, 65536, 0,
                                            3 * 65536, 0], id="64k-pages-no-newline"),
])
def test_parse_statm(data: bytes, page: int, want: list[int]) -> None:
    assert parse_statm(data, page) == want


@pytest.mark.parametrize("data", [
    pytest.param(b"", id="empty-kernel-thread-exited"),
    pytest.param(b"7779 2880 1632 726 0 2083\n", id="six-fields"),
    pytest.param(b"7779 2880 1632 726 0 2083 -1\n", id="negative"),
    pytest.param("7779 2880 1632 726 0 2083 \u0660\n".encode(), id="arabic-indic-digit"),
])
def test_parse_statm_refuses(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_statm(data, PAGE)


class Rl(NamedTuple):
    as_soft: int
    data_soft: int
    want: tuple[str, ...]


RLIMITS = [
    pytest.param(Rl(INF, INF, ()), id="none-set-the-default"),
    pytest.param(Rl(3000000 * KiB, INF, (RLIMIT_AS,)), id="ulimit-v-3000000-passed-by-srun"),
    pytest.param(Rl(INF, 2 * GiB, (RLIMIT_DATA,)), id="ulimit-d"),
    pytest.param(Rl(4 * GiB, 2 * GiB, (RLIMIT_AS, RLIMIT_DATA)), id="both"),
]


@pytest.mark.parametrize("row", RLIMITS)
def test_rlimit_limits(row: Rl) -> None:
    got = rlimit_limits(row.as_soft, row.data_soft, INF)
    assert tuple(p.kind for p in got) == row.want
    pairs = ((row.as_soft, RLIMIT_AS), (row.data_soft, RLIMIT_DATA))
    assert [p.limit for p in got] == [v for v, k in pairs if k in row.want]


class Decl(NamedTuple):
    environ: dict[str, str]
    levels: tuple[tuple[str, Optional[int]], ...]  # (cgroup path, limit), the process's first
    want: Optional[int]  # the declared level's limit, None: no level
    asked: bool = False  # the controller was asked
    problem: str = ""


# What the controller answers in these rows (a Declared as slurmctl.ask returns it)
CONTROLLER = {21: Declared(21, "0", 300 * MiB, "--mem=300M"),
              22: Declared(22, "0", None, None, "the controller could not say (scontrol is "
                           "not on PATH)")}
JOB_V1 = "/slurm_vm/uid_0/job_21"
TASK_V1 = JOB_V1 + "/step_0/task_0"
OURS = "/process_api/37628d99afbd406d55e30171b133ca71"  # a sampled job's v1 path (seen)

DECLARED = [
    pytest.param(Decl({"SLURM_JOB_ID": "5", "SLURM_MEM_PER_NODE": "300"}, (), 300 * MiB),
                 id="sampled-enforcement-no-cgroup-limit"),
    pytest.param(Decl({"SLURM_JOB_ID": "5", "SLURM_MEM_PER_NODE": "300"},
                      (("/a", 300 * MiB),), None), id="enforced-by-job-cgroup"),
    pytest.param(Decl({"SLURM_JOB_ID": "5", "SLURM_MEM_PER_NODE": "2048"},
                      (("/a", 1 * GiB),), None), id="tighter-cgroup-above-slurm"),
    pytest.param(Decl({"SLURM_JOB_ID": "5", "SLURM_MEM_PER_NODE": "300"},
                      (("/a", None), ("/", 4 * GiB)), 300 * MiB), id="a-looser-cgroup-only"),
    pytest.param(Decl({"SLURM_JOB_ID": "5", "SLURM_MEM_PER_CPU": "100",
                       "SLURM_CPUS_ON_NODE": "2"}, (), 200 * MiB), id="mem-per-cpu"),
    pytest.param(Decl({"SLURM_JOB_ID": "21", "SLURM_STEP_ID": "0"}, ((OURS, None),), 300 * MiB,
                      asked=True), id="plain-srun-sampled-asks-the-controller"),
    pytest.param(Decl({"SLURM_JOB_ID": "21", "SLURM_STEP_ID": "0"},
                      ((TASK_V1, None), (JOB_V1 + "/step_0", None), (JOB_V1, None)), 300 * MiB,
                      asked=True), id="plain-srun-slurm-cgroups-without-limit-ask"),
    pytest.param(Decl({"SLURM_JOB_ID": "21", "SLURM_STEP_ID": "0"},
                      ((TASK_V1, None), (JOB_V1 + "/step_0", 300 * MiB),
                       (JOB_V1, 300 * MiB)), None), id="plain-srun-task-cgroup-not-asked"),
    pytest.param(Decl({"SLURM_JOB_ID": "22", "SLURM_STEP_ID": "0"}, ((OURS, None),), None,
                      asked=True, problem="the controller could not say (scontrol is not on "
                      "PATH)"), id="plain-srun-controller-unknown-said"),
    pytest.param(Decl({}, (), None), id="not-in-a-job"),
]


@pytest.mark.parametrize("row", DECLARED)
def test_slurm_limit(row: Decl) -> None:
    calls = []

    def ask(declared: Declared, environ: Mapping[str, str]) -> Declared:
        calls.append(declared.job)
        return CONTROLLER[declared.job or 0]

    got, problem = slurm_limit(row.environ, row.levels, ask)
    assert (got.limit if got is not None else None) == row.want
    assert calls == ([int(row.environ["SLURM_JOB_ID"])] if row.asked else [])
    assert problem == row.problem
    if got is not None and row.asked:  # the same level as sbatch --mem=300M's
        assert got.label == "slurm job 21 --mem=300M (declared)"


def test_rooms_never_negative() -> None:
    limits = [ProcessLimit(RLIMIT_AS, "as", 40 * MiB), ProcessLimit(SLURM, "s", 10 * MiB),
              ProcessLimit(RLIMIT_DATA, "d", 20 * MiB)]
    # size 7779 pages = 31116 KiB: 40 MiB - 31116 KiB; resident 2880 pages = 11520 KiB > 10
    # MiB: 0; data 2083 pages = 8332 KiB: 20 MiB - 8332 KiB
    assert rooms(limits, STATM, PAGE) == [(31116 * KiB, 40 * MiB - 31116 * KiB),
                                          (11520 * KiB, 0), (8332 * KiB, 20 * MiB - 8332 * KiB)]


CHILD = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), resource.RLIM_INFINITY))
import cgwatch
with cgwatch.Monitor() as monitor:
    levels = [l.as_dict() for l in monitor.levels() if l.kind == "RLIMIT_AS"]
available = cgwatch.available_memory()
size = int([l for l in open("/proc/self/status") if l.startswith("VmSize:")][0].split()[1]) * 1024
result = {"levels": levels, "available": available, "size": size}
try:
    block = bytearray(available + (64 << 20))
    result["over"] = "allocated"
except MemoryError:
    result["over"] = "MemoryError"
try:
    block = bytearray(available // 2)
    result["half"] = "allocated"
except MemoryError:
    result["half"] = "MemoryError"
print(json.dumps(result))
"""


@pytest.mark.realkernel
def test_ulimit_v_is_a_level_and_bounds_available() -> None:
    """Kernel fact (6.18, mm/mmap.c may_expand_vm): under RLIMIT_AS a mapping that would take
    VmSize past the limit fails (Python: MemoryError) whatever the cgroup allows; cgwatch
    shows the limit as a level and answers at most limit - VmSize, which can be allocated."""
    limit = 1 * GiB
    out = subprocess.run([sys.executable, "-c", CHILD, str(limit)], capture_output=True,
                         text=True, timeout=120, check=True)
    got = json.loads(out.stdout)
    assert [lvl["limit"] for lvl in got["levels"]] == [limit]
    assert got["levels"][0]["kind"] == "RLIMIT_AS"
    # VmSize grows between the answer and the read after it (never shrinks here): the answer
    # is at most the limit minus the size read after it, plus slack for freed mappings
    assert 0 < got["available"] <= limit - got["size"] + 16 * MiB
    assert got["over"] == "MemoryError"
    assert got["half"] == "allocated"
