"""Real kernel (v1 here, v2 in the VM): `cgwatch run`'s memory stays flat around a job that
lives at its limit. The job rewrites a file larger than its cgroup's limit, so the limit is
hit all the time (page cache reclaimed: v1 failcnt, v2 `max` rise many times a second) and
nothing is killed; `cgwatch run` once kept every such event (~300 B each, 1.3 GB a day).
The figures over a long run: bench/cli_run_rss.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bench.cli_run_rss import DRIVER, rss_kib
from tests.cgroup_helpers import (
    PROJECT,
    MiB,
    Tree,
    cgroup_tree,
    read,
    real_kernel_marks,
)

pytestmark = real_kernel_marks()

# The watcher polls its counters every millisecond (the bench's driver), so 16 s stand for a
# long run.
POLL = 0.001
JOB_SECONDS = 600


def end_job(job: str) -> None:
    """SIGALRM to the job's `timeout`: coreutils takes it as its own timer expiring."""
    for pid in read(os.path.join(job, "cgroup.procs")).split():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "timeout":
                    os.kill(int(pid), signal.SIGALRM)
        except (FileNotFoundError, ProcessLookupError):
            pass  # a dd that just finished


def limit_hits(job: str, version: int) -> int:
    if version == 1:
        return int(read(os.path.join(job, "memory.failcnt")))
    return int(read(os.path.join(job, "memory.events")).split("max ", 1)[1].split()[0])


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def test_cgwatch_run_rss_stays_flat_around_a_job_at_its_limit(tree: Tree) -> None:
    # A disk-backed file system: page cache that can be reclaimed (in the VM / is a tmpfs
    # overlay, whose pages could not be, and the job would be killed instead).
    base = os.environ.get("VM_SCRATCH") or "/var/tmp"
    scratch = os.path.join(base, f"cgwatch-rss-{os.getpid()}")
    job = tree.make("job", limit=48 * MiB)  # the driver's job rewrites a 128 MiB file
    # Past start-up (imports, the baseline) before the first sample: the driver says when
    # `cgwatch run` has made its Events (a fixed sleep was outlasted under the VM tier's
    # emulation on a loaded machine), then one more second for its first scans. The job runs
    # until the test has its samples (JOB_SECONDS is only a bound), then its `timeout` gets
    # SIGALRM, which it takes as its time being up: it ends the job and exits 124.
    ready_r, ready_w = os.pipe()
    env = dict(os.environ, READY_FD=str(ready_w))
    proc = tree.spawn(job, DRIVER.format(tree=PROJECT, poll=POLL, seconds=JOB_SECONDS,
                                         scratch=scratch), stdout=subprocess.DEVNULL,
                      env=env, pass_fds=(ready_w,))
    os.close(ready_w)
    try:
        with os.fdopen(ready_r, "rb") as ready:
            assert ready.readline() == b"ready\n", proc.communicate(timeout=60)[1][-3000:]
        time.sleep(1)
        # RssAnon, not VmRSS: the job keeps the cgroup at its limit, so reclaim takes the
        # watcher's mapped file pages (libraries, bytecode) and faults bring them back; a kept
        # event is anonymous memory.
        hits_before = limit_hits(job, tree.version)
        samples = [rss_kib(proc.pid, "RssAnon")]
        for _ in range(16):
            time.sleep(1)
            samples.append(rss_kib(proc.pid, "RssAnon"))
        hits_after = limit_hits(job, tree.version)
        end_job(job)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if os.path.exists(scratch):
            os.unlink(scratch)
    steps = [b - a for a, b in zip(samples, samples[1:])]
    print(f"RssAnon {samples[0]} -> {samples[-1]} KiB, by second {steps}; limit hits "
          f"{hits_before} -> {hits_after}", file=sys.stderr)
    assert hits_after - hits_before > 100  # the job really lived at its limit
    assert proc.returncode == 124  # timeout's status: the job ran its time, nothing killed it
    # Flat: keeping every event grew it ~230 KiB in these 16 s, second after second (~800 KiB
    # a minute, measured with bench/cli_run_rss.py before the fix); the summary it keeps now,
    # a few KiB. One step is left out: in the VM RssAnon rose once by 220-420 KiB within a
    # second and stayed flat after (a new high-water mark of the allocator's pools when the
    # emulated CPU lets a burst of scans pile up; seen with the code before and after the
    # start-up work alike), which is not growth. Growth outside it stays the 128 KiB bound.
    assert sum(steps) - max(steps) < 128, (samples, hits_after - hits_before)
