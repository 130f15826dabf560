"""Resources over a monitor's life, each in a fresh interpreter (so no default monitor or
other test's object shares the process): descriptors and threads over create/close cycles,
one descriptor per cgroup file, a dropped monitor, a full descriptor table, thread creation
failing, and a fork child that meets either. Fake trees: the accounting is the library's,
not the kernel's (the real-kernel freshness tests are in test_freshness_real.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from tests.fake_tree import FakeHost, GiB, MiB

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRELUDE = f"""
# A hung child prints where it hangs (and exits) rather than waiting out the timeout.
import faulthandler; faulthandler.dump_traceback_later(30, exit=True)
import gc, json, os, sys, threading, time
sys.path.insert(0, {PROJECT!r})
import cgwatch
from cgwatch import Monitor
from cgwatch.events import Events

def fds():
    return len(os.listdir("/proc/self/fd"))

def threads():
    return sum(t.name == "cgwatch" for t in threading.enumerate())

def hog_descriptors():
    # Take every descriptor left (the limit lowered to 64 first): the caller closes them.
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    hog = []
    try:
        while True:
            hog.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        return hog

def settle(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not cond():
        time.sleep(0.005)
    return cond()
"""


def run_py(code: str, timeout: float = 60) -> Any:
    """Run PRELUDE + code in a fresh interpreter; its last stdout line, as JSON."""
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tree(host: FakeHost) -> FakeHost:
    host.make_path({"/a": 1 * GiB, "/a/b": None, "/a/b/c": 512 * MiB})
    host.set_usage("/a/b/c", 200 * MiB, 50 * MiB)
    host.set_usage("/a", 300 * MiB, 0)
    for path in ("/a", "/a/b", "/a/b/c"):
        d = host.level_dir(path)
        if host.version == 2:
            host.write(d + "/memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
            host.write(d + "/memory.events.local", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
        else:
            host.write(d + "/memory.failcnt", "0\n")
            host.write(d + "/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    return host


EXPECTED_AVAILABLE = 512 * MiB - 150 * MiB  # /a/b/c binds: 512 - (200 - 50)


def test_create_close_cycles_leave_no_descriptor_and_no_thread(host: FakeHost) -> None:
    tree(host)
    got = run_py(f"""
        root = {host.root!r}
        fd0, th0 = fds(), threads()
        for _ in range(100):
            with Monitor(root) as m:
                assert m.total_memory() == {512 * MiB}
                assert m.available_memory() == {EXPECTED_AVAILABLE}
        for _ in range(20):
            with Monitor(root) as m, Events(m, log=False) as ev:
                assert m.total_memory() == {512 * MiB}
                ev.scan_now()
        ok = settle(lambda: threads() == th0)
        print(json.dumps([fd0, th0, fds(), threads()]))
    """)
    fd0, th0, fd1, th1 = got
    assert (fd1, th1) == (fd0, th0) == (fd0, 0)


def test_monitors_share_one_thread_and_one_descriptor_per_file(host: FakeHost) -> None:
    tree(host)
    usage = "memory.current" if host.version == 2 else "memory.usage_in_bytes"
    usage_path = os.path.join(host.path(host.level_dir("/a/b/c")), usage)
    got = run_py(f"""
        root = {host.root!r}
        monitors = [Monitor(root) for _ in range(50)]
        answers = {{(m.total_memory(), m.available_memory()) for m in monitors}}
        events = Events(monitors[0], log=False)
        events.scan_now()
        links = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                links.append(os.readlink(f"/proc/self/fd/{{fd}}"))
            except OSError:
                pass  # the listing's own descriptor, gone already
        print(json.dumps([sorted(answers), threads(), links.count({usage_path!r})]))
        events.close()
        for m in monitors:
            m.close()
    """)
    answers, thread_count, usage_fds = got
    assert answers == [[512 * MiB, EXPECTED_AVAILABLE]]
    assert thread_count == 1  # 50 monitors and an Events: one thread
    assert usage_fds == 1  # the monitors and the events layer share the one descriptor


def test_dropped_monitor_stops_its_thread(host: FakeHost) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None})
    got = run_py(f"""
        before = threads()
        m = Monitor({host.root!r})
        during = threads()
        assert m.total_memory() == {4 * GiB}
        del m
        print(json.dumps([before, during, settle(lambda: threads() == before)]))
    """)
    before, during, stopped = got
    assert during == before + 1
    assert stopped


def test_thread_free_monitor_runs_no_thread_and_stays_exact(host: FakeHost) -> None:
    tree(host)
    limit_file = "memory.max" if host.version == 2 else "memory.limit_in_bytes"
    path = os.path.join(host.path(host.level_dir("/a")), limit_file)
    got = run_py(f"""
        os.environ["CGWATCH_THREAD"] = "0"
        m = Monitor({host.root!r})
        first = m.total_memory()
        fd = os.open({path!r}, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"{256 * MiB}\\n")
        os.close(fd)
        second = m.total_memory()  # no thread: the query itself applies the queued change
        print(json.dumps([first, second, threads(), m.status.mode, m.status.thread]))
    """)
    assert got == [512 * MiB, 256 * MiB, 0, "watching", False]


def test_queries_with_no_descriptor_left_answer_and_recover(host: FakeHost) -> None:
    tree(host)
    got = run_py(f"""
        hog = hog_descriptors()
        # No descriptor left when the monitor is made.
        m = Monitor({host.root!r})
        starved = [m.total_memory(), m.available_memory(), m.status.mode]
        for fd in hog:
            os.close(fd)
        recovered = settle(lambda: (m.total_memory(), m.status.mode, m.status.thread)
                           == ({512 * MiB}, "watching", True), timeout=10)
        print(json.dumps([starved, recovered, m.available_memory()]))
    """)
    starved, recovered, available = got
    # With no descriptor at all nothing can be read: host values (said in status), not a raise.
    assert starved[2] in ("host", "polling", "watching")
    assert recovered
    assert available == EXPECTED_AVAILABLE


def test_thread_that_cannot_start_leaves_queries_exact_and_is_retried(host: FakeHost) -> None:
    tree(host)
    limit_file = "memory.max" if host.version == 2 else "memory.limit_in_bytes"
    path = os.path.join(host.path(host.level_dir("/a")), limit_file)
    got = run_py(f"""
        real_start = threading.Thread.start
        def refuse(self):
            raise RuntimeError("can't start new thread")
        threading.Thread.start = refuse
        m = Monitor({host.root!r})
        first = [m.total_memory(), m.available_memory(), m.status.thread,
                 "thread" in m.status.reason]
        fd = os.open({path!r}, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"{256 * MiB}\\n")
        os.close(fd)
        seen = m.total_memory()
        threading.Thread.start = real_start
        recovered = settle(lambda: m.status.thread)
        print(json.dumps([first, seen, recovered]))
    """)
    first, seen, recovered = got
    assert first == [512 * MiB, EXPECTED_AVAILABLE, False, True]
    assert seen == 256 * MiB
    assert recovered


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_child_with_no_descriptor_left_answers_and_recovers(host: FakeHost) -> None:
    tree(host)
    got = run_py(f"""
        import resource
        m = Monitor({host.root!r})
        assert m.total_memory() == {512 * MiB}
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                hog = hog_descriptors()
                starved = [m.total_memory(), m.available_memory()]
                for fd in hog:
                    os.close(fd)
                ok = settle(lambda: m.status.mode == "watching" and m.status.thread
                            and "cannot" not in m.status.reason, timeout=10)
                os.write(w, json.dumps([starved, ok, m.total_memory()]).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            child = f.read()
        os.waitpid(pid, 0)
        print(child)
    """)
    starved, ok, total = got
    assert starved == [512 * MiB, EXPECTED_AVAILABLE]  # the levels known before the fork
    assert ok
    assert total == 512 * MiB


def test_events_without_alerts_leave_the_thread_idle_after_a_limit_change(
        host: FakeHost) -> None:
    # A pending check with no alert to check once made the loop queue a turn forever: the
    # thread spun at a whole core and stopped reading its descriptors.
    tree(host)
    limit_file = "memory.max" if host.version == 2 else "memory.limit_in_bytes"
    path = os.path.join(host.path(host.level_dir("/a")), limit_file)
    got = run_py(f"""
        m = Monitor({host.root!r})
        ev = Events(m, log=False)
        time.sleep(0.2)
        fd = os.open({path!r}, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"{768 * MiB}\\n")
        os.close(fd)
        time.sleep(0.2)
        cpu0 = time.process_time()
        time.sleep(1.0)
        print(json.dumps(time.process_time() - cpu0))
        ev.close(); m.close()
    """)
    assert got < 0.3  # spinning costs ~1 s of CPU in this second; idle costs ~0


def test_a_limit_written_while_polling_is_seen_after_the_thread_starts_watching(
        host: FakeHost) -> None:
    """A polling monitor whose retry, on the thread's timer, gets an instance: a limit
    written before the watch existed raised no event, so the retry reads the limits again
    once watching. Before, it republished the polling snapshot's limits as watching, and
    every query answered the old limit until the next change (seen in bench.nodescale: 4 of
    500 answers after a write, when 43 of 100 processes found the uid's lock held at start
    and watched a second later). A fresh interpreter: no other monitor holds the process's
    instance."""
    tree(host)
    name = "memory.max" if host.version == 2 else "memory.limit_in_bytes"
    limit_file = os.path.join(host.path(host.level_dir("/a/b/c")), name)
    got = run_py(f"""
        import errno
        from cgwatch import inotify, testdoor
        real = inotify.inotify_init
        def refuse(*_):
            raise OSError(errno.EMFILE, "Too many open files")
        inotify.inotify_init = refuse
        m = Monitor({host.root!r}, migration_interval=0.1)
        before = (m.total_memory(), m.status.mode)
        inotify.inotify_init = real
        testdoor.forget_inotify_refusals()
        with open({limit_file!r}, "w") as f:  # in place, as the kernel's file is written
            f.write("{256 * MiB}\\n")
        time.sleep(3.0)  # no query: the retry comes 0.5-1.5 s later, on a 0.1 s timer
        print(json.dumps([*before, m.total_memory(), m.status.mode]))
    """)
    assert got == [512 * MiB, "polling", 256 * MiB, "watching"]
