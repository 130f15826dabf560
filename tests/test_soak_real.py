"""A short soak on the real kernel (issue 11): threads querying a Monitor in a child process
while this test rewrites limits, moves the child between two cgroups, and removes and
re-creates the cgroup it just left.

Asserted: no query raises; every total answered is a value that was true at some point (a
limit written, or the ancestors' total where the level had none); available is never above
the largest of those; after the last write the answers are exact and available <= total;
the child's descriptors, threads and RSS stay flat from warm-up to the end.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from collections.abc import Iterator

import pytest

from cgwatch import Monitor
from tests.cgroup_helpers import (
    PROJECT,
    MiB,
    Tree,
    cgroup_tree,
    limit_file,
    real_kernel_marks,
    write,
)

pytestmark = real_kernel_marks()

SOAK_SECONDS = 15.0
LIMITS = [n * MiB for n in range(300, 701, 25)]  # far above the child's ~30 MiB
QUERY_THREADS = 4

# The child: a Monitor, QUERY_THREADS threads asking it as fast as they can, samples of its own
# descriptors, threads and RSS after a warm-up and at the end. The end comes with a line on
# stdin naming the total that is true now (the test has stopped writing): the child checks its
# answers against it and prints one JSON line.
CHILD = f"""
import json, os, sys, threading, time
sys.path.insert(0, {PROJECT!r})
from cgwatch import Monitor

def sample():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {{"fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count(),
             "kernel_threads": int(status["Threads"]), "rss_kib": int(status["VmRSS"].split()[0])}}

monitor = Monitor()
stop = threading.Event()
results = []

def query():
    totals, directories, errors = set(), set(), []
    worst, count = 0, 0
    while not stop.is_set():
        try:
            total = monitor.total_memory()
            available = monitor.available_memory()
            # (available <= total is not checked here: with limits rewritten every ~2 ms a
            # thread can wait out several GIL switch intervals between the two calls.)
            if available < 0:
                errors.append(f"available {{available}}")
            totals.add(total)
            worst = max(worst, available)
            if count % 1000 == 0:
                directories.add(monitor.status.directory)
            count += 1
        except Exception as e:
            errors.append(repr(e))
            if len(errors) > 20:
                break
    results.append({{"totals": sorted(totals), "directories": sorted(d or "" for d in directories),
                     "errors": errors[:20], "max_available": worst, "count": count}})

fd_counts = []

def count_fds():
    # Descriptors come and go as levels are re-created (a KeptDir per directory, dropped
    # when its last user lets go): sampled through the soak, not once.
    while not stop.wait(0.25):
        fd_counts.append(len(os.listdir("/proc/self/fd")))

threads = [threading.Thread(target=query) for _ in range({QUERY_THREADS})]
sampler = threading.Thread(target=count_fds)
for t in threads:
    t.start()
print(json.dumps({{"ready": True}}), flush=True)
time.sleep(1.5)
sampler.start()
warm = sample()
expected = json.loads(sys.stdin.readline())["total"]
end = sample()
stop.set()
for t in threads + [sampler]:
    t.join()
quiet = {{"total": monitor.total_memory(), "available": monitor.available_memory(),
          "total_again": monitor.total_memory()}}
monitor.close()
print(json.dumps({{"warm": warm, "end": end, "threads": results, "quiet": quiet,
                  "expected": expected, "fd_counts": fd_counts}}), flush=True)
"""


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as t:
        yield t


def test_soak_limits_moves_and_recreated_levels(tree: Tree) -> None:
    rng = random.Random(11)
    with Monitor(thread=False) as ours:
        ceiling = ours.total_memory()  # the ancestors' total: true wherever no level limits
    names = ("a", "b")
    paths = {name: tree.make(name, limit=LIMITS[0]) for name in names}
    written = {LIMITS[0]}
    current = {name: LIMITS[0] for name in names}
    child = tree.spawn(paths["a"], CHILD, stdin=subprocess.PIPE)
    assert child.stdout is not None
    assert json.loads(child.stdout.readline()) == {"ready": True}
    where = "a"
    moves = recreations = writes = 0
    deadline = time.monotonic() + SOAK_SECONDS - 0.5
    next_move = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        name = rng.choice(names)
        limit = rng.choice(LIMITS)
        written.add(limit)
        write(os.path.join(paths[name], limit_file(tree.version)), str(limit))
        current[name] = limit
        writes += 1
        if time.monotonic() >= next_move:
            other = "b" if where == "a" else "a"
            write(os.path.join(paths[other], "cgroup.procs"), str(child.pid))
            moves += 1
            left, where = where, other
            if moves % 2 == 0:
                # The level the child just left, removed and made again: a new directory
                # (new inode) under the same path, with no limit until one is written.
                os.rmdir(paths[left])
                os.mkdir(paths[left])
                recreations += 1
                limit = rng.choice(LIMITS)
                written.add(limit)
                write(os.path.join(paths[left], limit_file(tree.version)), str(limit))
                current[left] = limit
            next_move = time.monotonic() + 0.4
        time.sleep(0.002)
    time.sleep(0.3)  # past confirm_interval (0.1 s) since the last move: it is seen by now
    truth = min(current[where], ceiling)
    out, err = child.communicate(json.dumps({"total": truth}) + "\n", timeout=30)
    assert child.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])

    allowed = {min(limit, ceiling) for limit in written} | {ceiling}
    queries = 0
    for result in report["threads"]:
        assert result["errors"] == []
        assert set(result["totals"]) <= allowed, sorted(set(result["totals"]) - allowed)
        assert result["max_available"] <= max(allowed)
        queries += result["count"]
    quiet = report["quiet"]  # asked after the last write: exact
    assert quiet["total"] == quiet["total_again"] == truth
    assert 0 <= quiet["available"] <= truth
    seen_dirs = set().union(*(r["directories"] for r in report["threads"]))
    assert {paths["a"], paths["b"]} <= seen_dirs, "the moves were not followed"
    warm, end = report["warm"], report["end"]
    # A leak would add descriptors with every re-creation (~5 files a level, 17 re-creations):
    # the last third of the soak holds no more than the first third did, give or take a
    # level's files not yet dropped (33-38 seen here).
    counts = report["fd_counts"]
    third = max(1, len(counts) // 3)
    assert max(counts[-third:]) <= max(counts[:third]) + 8, counts
    assert end["threads"] == warm["threads"] and end["kernel_threads"] <= warm["kernel_threads"]
    assert end["rss_kib"] - warm["rss_kib"] < 8 * 1024, (warm, end)
    assert moves >= 10 and recreations >= 5 and writes >= 1000 and queries > 10_000
    print(f"soak: {queries} queries, {writes} limit writes, {moves} moves, {recreations} "
          f"re-created levels; warm {warm}, end {end}; fds {min(counts)}-{max(counts)}")
