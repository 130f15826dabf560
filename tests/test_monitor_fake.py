"""Monitor logic on fake /proc + /sys trees: the walk, the minimum, headroom, the watcher thread,
fallbacks, fork and threads. Kernel behaviour itself is proven in test_real_v1.py and tests/v2."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

import psutil
import pytest

import cgwatch
from cgwatch import HOST, POLLING, WATCHING, Monitor, inotify
from tests.cgroup_helpers import wait_for
from tests.fake_tree import FakeHost, GiB, MiB


def start(made: list[Monitor], host: FakeHost, **kwargs: object) -> Monitor:
    m = Monitor(host.root, **kwargs)  # type: ignore[arg-type]
    made.append(m)
    return m


def test_smallest_limit_on_the_path_wins(host: FakeHost, opened: list[Monitor]) -> None:
    host.make_path({"/a": 8 * GiB, "/a/b": 2 * GiB, "/a/b/c": 4 * GiB})
    m = start(opened, host)
    assert m.total_memory() == 2 * GiB
    assert m.status.mode == WATCHING
    assert m.status.version == host.version
    assert m.status.cgroup_path == "/a/b/c"
    infos = m.levels()
    assert [i.cgroup_path for i in infos] == ["/a/b/c", "/a/b", "/a", "/"]
    assert [i.binds_total for i in infos] == [False, True, False, False]


def test_no_limit_anywhere_is_host_ram(host: FakeHost, opened: list[Monitor]) -> None:
    host.make_path({"/a": None, "/a/b": None, "/a/b/c": None})
    m = start(opened, host)
    assert m.total_memory() == 64 * GiB  # v1 sentinel and v2 "max" both mean none
    assert m.available_memory() == 60 * GiB
    assert not any(i.binds_total for i in m.levels())


def test_limit_above_host_ram_is_capped(host: FakeHost, opened: list[Monitor]) -> None:
    host.make_path({"/a": 100 * GiB, "/a/b": None, "/a/b/c": None})
    assert start(opened, host).total_memory() == 64 * GiB


def test_headroom_is_min_over_limited_levels(host: FakeHost, opened: list[Monitor]) -> None:
    host.make_path({"/a": 1 * GiB, "/a/b": None, "/a/b/c": 600 * MiB})
    # /a's usage counts a sibling of ours: 900 MiB used, 100 MiB of it inactive page cache.
    host.set_usage("/a", 900 * MiB, 100 * MiB)
    host.set_usage("/a/b/c", 300 * MiB, 50 * MiB)
    m = start(opened, host)
    assert m.total_memory() == 600 * MiB
    assert m.available_memory() == 1 * GiB - 800 * MiB  # /a binds: 224 MiB < 350 MiB
    infos = {i.cgroup_path: i for i in m.levels()}
    assert infos["/a"].headroom == 224 * MiB and infos["/a"].binds_available
    assert infos["/a/b/c"].headroom == 350 * MiB
    assert infos["/a/b"].headroom is None


def test_host_binds_available_when_tighter(host: FakeHost, opened: list[Monitor]) -> None:
    host.make_path({"/a": None, "/a/b": None, "/a/b/c": 8 * GiB})
    host.set_meminfo(64 * GiB, 1 * GiB)
    assert start(opened, host).available_memory() == 1 * GiB


def test_available_floors(host: FakeHost, opened: list[Monitor]) -> None:
    host.make_path({"/a": None, "/a/b": None, "/a/b/c": 100 * MiB})
    host.set_usage("/a/b/c", 150 * MiB, 10 * MiB)  # over the limit (v1 soft overshoot)
    m = start(opened, host)
    assert m.available_memory() == 0
    host.set_usage("/a/b/c", 10 * MiB, 20 * MiB)  # inactive > usage: racy read, ws floored at 0
    assert m.available_memory() == 100 * MiB


def test_rewrite_of_a_limit_is_picked_up_by_the_thread(host: FakeHost,
                                                      opened: list[Monitor]) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None})
    m = start(opened, host)
    assert m.total_memory() == 4 * GiB
    host.set_limit("/a/b", 1 * GiB)
    assert wait_for(lambda: m.total_memory() == 1 * GiB)
    host.set_limit("/a/b", None)
    assert wait_for(lambda: m.total_memory() == 4 * GiB)


def test_migration_is_noticed_on_the_timer(host: FakeHost, opened: list[Monitor]) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None, "/x": 1 * GiB})
    m = start(opened, host, migration_interval=0.05)
    assert m.total_memory() == 4 * GiB
    host.move_to("/x")
    assert wait_for(lambda: m.total_memory() == 1 * GiB)
    assert m.status.cgroup_path == "/x"
    # and the new path's limit file is watched
    host.set_limit("/x", 512 * MiB)
    assert wait_for(lambda: m.total_memory() == 512 * MiB)


def test_garbage_limit_is_reported_not_raised(host: FakeHost, opened: list[Monitor],
                                              caplog: pytest.LogCaptureFixture) -> None:
    host.make_path({"/a": 2 * GiB, "/a/b": None, "/a/b/c": None})
    host.write(host.level_dir("/a/b") + ("/memory.max" if host.version == 2 else
                                         "/memory.limit_in_bytes"), "garbage\n")
    with caplog.at_level(logging.WARNING, logger="cgwatch"):
        m = start(opened, host)
        assert m.total_memory() == 2 * GiB
        assert m.available_memory() > 0
    assert "/a/b" in m.status.reason
    assert any("/a/b" in r.getMessage() for r in caplog.records)
    assert next(i for i in m.levels() if i.cgroup_path == "/a/b").problem


def test_limit_mid_rewrite_keeps_last_good_value(host: FakeHost, opened: list[Monitor]) -> None:
    host.make_path({"/a": 2 * GiB, "/a/b": None, "/a/b/c": None})
    m = start(opened, host)
    limit_file = host.level_dir("/a") + ("/memory.max" if host.version == 2 else
                                         "/memory.limit_in_bytes")
    host.write(limit_file, "")  # a writer that truncated and has not written yet
    time.sleep(0.2)
    assert m.total_memory() == 2 * GiB
    assert "/a" in m.status.reason


def test_garbage_usage_never_raises(host: FakeHost, opened: list[Monitor],
                                    caplog: pytest.LogCaptureFixture) -> None:
    host.make_path({"/a": None, "/a/b": None, "/a/b/c": 1 * GiB})
    host.write(host.level_dir("/a/b/c") + "/memory.stat", "nonsense\n")
    m = start(opened, host)
    with caplog.at_level(logging.WARNING, logger="cgwatch"):
        value = m.available_memory()
    # The fallback without inactive_file: limit - usage (can only be below the truth), and
    # the reason is logged.
    assert value == 1 * GiB - 100 * MiB
    assert any("reading usage failed" in r.getMessage() for r in caplog.records)


def test_missing_cgroup_files_fall_back_to_host(tmp_path: object, opened: list[Monitor],
                                                caplog: pytest.LogCaptureFixture) -> None:
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "proc"))
    with open(os.path.join(root, "proc/meminfo"), "w") as f:
        f.write("MemTotal: 1048576 kB\nMemAvailable: 524288 kB\n")
    with caplog.at_level(logging.WARNING, logger="cgwatch"):
        m = Monitor(root)
        opened.append(m)
    assert m.status.mode == HOST
    assert "/proc/self/cgroup" in m.status.reason
    assert m.total_memory() == 1 << 30
    assert m.available_memory() == 512 << 20
    assert m.levels() == []
    assert any("no memory cgroup" in r.getMessage() for r in caplog.records)


def test_no_proc_at_all_uses_psutil(tmp_path: object, opened: list[Monitor]) -> None:
    # What a non-Linux system looks like to the monitor: nothing under /proc.
    m = Monitor(str(tmp_path))
    opened.append(m)
    assert m.status.mode == HOST
    assert m.status.host_source == "psutil"
    assert m.total_memory() == psutil.virtual_memory().total
    assert m.available_memory() > 0


def test_cgroup_directory_missing(host: FakeHost, opened: list[Monitor]) -> None:
    host.move_to("/does/not/exist")
    m = start(opened, host)
    assert m.status.mode == HOST
    assert "does not exist" in m.status.reason
    assert m.total_memory() == 64 * GiB


def test_polling_when_inotify_disabled(host: FakeHost, opened: list[Monitor]) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None})
    m = start(opened, host, use_inotify=False, poll_interval=0.05)
    assert m.status.mode == POLLING
    assert "disabled" in m.status.reason
    host.set_limit("/a/b/c", 1 * GiB)
    assert wait_for(lambda: m.total_memory() == 1 * GiB)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EMFILE])
def test_polling_when_watches_run_out(host: FakeHost, opened: list[Monitor],
                                      monkeypatch: pytest.MonkeyPatch, err: int,
                                      caplog: pytest.LogCaptureFixture) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None})
    real_add = inotify.add_watch

    def add_watch(fd: int, path: str, mask: int) -> int:
        if "/a/b" in path:  # the first few watches succeed, then the limit is reached
            raise OSError(err, os.strerror(err))
        return real_add(fd, path, mask)

    monkeypatch.setattr(inotify, "add_watch", add_watch)
    with caplog.at_level(logging.WARNING, logger="cgwatch"):
        m = start(opened, host, poll_interval=0.05)
    assert m.status.mode == POLLING
    assert ("watch limit" if err == errno.ENOSPC else "instance limit") in m.status.reason
    assert any("polling" in r.getMessage() for r in caplog.records)
    host.set_limit("/a", 3 * GiB)
    assert wait_for(lambda: m.total_memory() == 3 * GiB)


def test_polling_when_inotify_cannot_start(host: FakeHost, opened: list[Monitor],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None})

    def refuse(*_: object) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(inotify, "inotify_init", refuse)
    m = start(opened, host)
    assert m.status.mode == POLLING
    assert m.total_memory() == 4 * GiB


def test_close_keeps_answering(host: FakeHost) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None})
    with Monitor(host.root, poll_interval=0.01) as m:
        assert m.total_memory() == 4 * GiB
        # The process-wide thread serves it (others, e.g. the default monitor, may share it).
        assert m.status.thread
    assert not m.status.thread
    assert m.status.mode == POLLING and "closed" in m.status.reason
    host.set_limit("/a", 1 * GiB)
    assert wait_for(lambda: m.total_memory() == 1 * GiB)


def test_many_threads_never_see_a_value_that_was_never_true(host: FakeHost,
                                                            opened: list[Monitor]) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": 2 * GiB, "/a/b/c": None})
    m = start(opened, host)
    seen: set[int] = set()
    errors: list[BaseException] = []
    stop = threading.Event()

    def query() -> None:
        try:
            while not stop.is_set():
                seen.add(m.total_memory())
                m.available_memory()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    readers = [threading.Thread(target=query) for _ in range(4)]
    for t in readers:
        t.start()
    for i in range(100):
        host.set_limit("/a/b", 1 * GiB if i % 2 else 3 * GiB)
        time.sleep(0.002)
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    assert seen <= {1 * GiB, 2 * GiB, 3 * GiB}
    assert 1 * GiB in seen and 3 * GiB in seen


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_child_gets_fresh_values(host: FakeHost, opened: list[Monitor]) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None})
    m = start(opened, host)
    assert m.total_memory() == 4 * GiB
    assert m.status.mode == WATCHING  # so the child's WATCHING below is its own new instance
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no thread was inherited; the limit changes after the fork
        try:
            os.close(r)
            host.set_limit("/a", 1 * GiB)
            first = m.total_memory()
            threads = sum(t.name == "cgwatch" for t in threading.enumerate())
            host.set_limit("/a", 512 * MiB)  # re-armed: the child's own thread sees this
            ok = wait_for(lambda: m.total_memory() == 512 * MiB)
            os.write(w, f"{first} {threads} {ok} {m.status.mode}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        report = f.read()
    os.waitpid(pid, 0)
    first, threads, ok, mode = report.split()
    assert int(first) == 1 * GiB
    assert threads == "1"
    assert ok == "True"
    assert mode == WATCHING


def test_module_functions_use_one_default_monitor() -> None:
    assert cgwatch.default_monitor() is cgwatch.default_monitor()
    assert cgwatch.total_memory() == cgwatch.default_monitor().total_memory()
    assert 0 < cgwatch.available_memory() <= cgwatch.total_memory()


@pytest.mark.parametrize("missing", ["usage", "stat"])
def test_limited_level_whose_files_cannot_be_opened_never_drops_out(
        host: FakeHost, opened: list[Monitor], missing: str) -> None:
    host.make_path({"/a": 2 * GiB, "/a/b": None, "/a/b/c": None})
    host.set_usage("/a", 500 * MiB, 100 * MiB)
    usage = "memory.current" if host.version == 2 else "memory.usage_in_bytes"
    os.unlink(host.path(host.level_dir("/a") + "/" + (usage if missing == "usage"
                                                        else "memory.stat")))
    m = start(opened, host)
    assert m.total_memory() == 2 * GiB
    # Never above the truth: limit - usage without memory.stat, 0 without usage at all,
    # not the host's 60 GiB.
    expected = 0 if missing == "usage" else 2 * GiB - 500 * MiB
    assert m.available_memory() == expected
    assert "cannot open usage files at /a" in m.status.reason


def test_memory_high_and_swap_are_shown_and_throttle_headroom(host: FakeHost,
                                                              opened: list[Monitor]) -> None:
    host.make_path({"/a": 1 * GiB, "/a/b": None, "/a/b/c": 512 * MiB})
    host.set_usage("/a/b/c", 300 * MiB, 50 * MiB)  # working set 250 MiB
    c = host.level_dir("/a/b/c")
    if host.version == 2:
        host.write(c + "/memory.high", f"{256 * MiB}\n")
        host.write(c + "/memory.swap.max", f"{128 * MiB}\n")
        host.write(c + "/memory.swap.current", f"{4 * MiB}\n")
    else:  # memsw counts memory + swap; swap used is memory.stat's hierarchical total_swap
        host.write(c + "/memory.memsw.limit_in_bytes", f"{640 * MiB}\n")
        host.write(c + "/memory.memsw.usage_in_bytes", f"{310 * MiB}\n")  # not used: 10 MiB
        host.write(c + "/memory.stat", f"cache {50 * MiB}\ninactive_file 1\nswap {1 * MiB}\n"
                   f"total_inactive_file {50 * MiB}\ntotal_swap {4 * MiB}\n")
    m = start(opened, host)
    leaf = m.levels()[0]
    assert (leaf.swap_limit, leaf.swap_usage) == (128 * MiB, 4 * MiB)
    if host.version == 2:
        assert (leaf.high, leaf.high_headroom) == (256 * MiB, 6 * MiB)
        assert m.throttle_headroom() == 6 * MiB
    else:  # v1's soft limit is not a cap: no throttling limit to show
        assert (leaf.high, leaf.high_headroom) == (None, None)
        assert m.throttle_headroom() is None
    # total_memory() and available_memory() keep their meaning
    assert m.total_memory() == 512 * MiB
    assert m.available_memory() == 512 * MiB - 250 * MiB


def test_levels_name_the_slurm_job_and_step(host: FakeHost) -> None:
    """Slurm 22.05's v1 layout (task/cgroup: --mem on job_J and step_S, not on task_T)."""
    job = "/slurm_vm/uid_0/job_4"
    host.make_path({"/slurm_vm": None, "/slurm_vm/uid_0": None, job: 256 * MiB,
                    job + "/step_0": 256 * MiB, job + "/step_0/task_0": None})
    host.move_to(job + "/step_0/task_0")
    with Monitor(host.root, thread=False) as m:
        roles = [(lvl.cgroup_path, lvl.slurm_role, lvl.slurm_id, lvl.kind) for lvl in m.levels()]
    assert roles[:4] == [(job + "/step_0/task_0", None, None, "cgroup"),
                         (job + "/step_0", "step", "4.0", "cgroup"),
                         (job, "job", "4", "cgroup"),
                         ("/slurm_vm/uid_0", None, None, "cgroup")]


def test_a_declared_slurm_limit_no_cgroup_enforces(host: FakeHost,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """OverMemoryKill without ConstrainRAMSpace: no cgroup limit, --mem=300M in the
    environment (sbatch exports SLURM_MEM_PER_NODE). It counts in total_memory(), bounds
    available_memory() and is a level of its own; status says it is declared."""
    host.make_path({"/slurm_vm": None, "/slurm_vm/uid_0": None})
    host.move_to("/slurm_vm/uid_0")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "300")
    with Monitor(host.root, thread=False) as m:
        assert m.total_memory() == 300 * MiB
        assert 0 < m.available_memory() < 300 * MiB  # minus this process's VmRSS
        declared = [lvl for lvl in m.levels() if lvl.kind == "slurm"]
        assert "declared, not enforced by a cgroup" in m.status.reason
    assert [(lvl.limit, lvl.binds_total) for lvl in declared] == [(300 * MiB, True)]
    # a cgroup limit at or below it enforces it: no level of its own
    host.set_limit("/slurm_vm/uid_0", 300 * MiB)
    with Monitor(host.root, thread=False) as m:
        assert [lvl for lvl in m.levels() if lvl.kind == "slurm"] == []
        assert "declared" not in m.status.reason
