"""What `import cgwatch` and the first queries cost a fresh process (issue 13): the modules it
loads, the value classes that replaced dataclasses, the lazily imported logger, and the
inotify watches dropped at interpreter exit."""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
from typing import Callable

import pytest

from cgwatch import WATCHING, Monitor, discovery, names, tracker
from cgwatch.frozen import replace
from cgwatch.logs import LazyLogger
from cgwatch.snapshot import LevelInfo, Status
from cgwatch.tree import Level
from tests.fake_tree import FakeHost, GiB

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": PROJECT}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, check=True, env=env, cwd="/").stdout


# ---- what a fresh interpreter loads -------------------------------------------------------


def test_import_and_both_queries_load_no_heavy_module() -> None:
    """psutil (only for the no-/proc fallback), inotify_simple (ctypes.util: subprocess,
    tempfile, shutil), dataclasses (inspect, ast, dis), logging, typing and re cost ~25 ms
    of every start together; none is needed to answer."""
    out = run_child("""
        import sys
        before = set(sys.modules)
        import cgwatch
        cgwatch.total_memory(); cgwatch.available_memory()
        print(" ".join(sorted(set(sys.modules) - before)))
    """)
    loaded = set(out.split())
    assert "cgwatch.monitor" in loaded
    heavy = {"psutil", "inotify_simple", "ctypes.util", "subprocess", "dataclasses", "inspect",
             "logging", "typing", "re", "enum", "tempfile", "shutil"}
    assert loaded & heavy == set()
    # The events layer and the command line load on first use only.
    assert not {m for m in loaded if m.startswith(("cgwatch.cli", "cgwatch.events",
                                                   "cgwatch.scanner", "cgwatch.alerts"))}


def test_the_lazy_names_still_load() -> None:
    out = run_child("""
        import cgwatch
        print(cgwatch.Events.__name__, cgwatch.Threshold.__name__, cgwatch.ShmUsage.__name__)
    """)
    assert out.split() == ["Events", "Threshold", "ShmUsage"]


# ---- the value classes (cgwatch/frozen.py) ------------------------------------------------


def status(**changes: object) -> Status:
    made = Status("watching", "", 2, "/a", "/sys/fs/cgroup/a", "meminfo")
    return replace(made, **changes) if changes else made


def test_status_keeps_its_dict_repr_equality_and_defaults() -> None:
    s = status()
    assert s.__dict__ == {"mode": "watching", "reason": "", "version": 2, "cgroup_path": "/a",
                          "directory": "/sys/fs/cgroup/a", "host_source": "meminfo",
                          "confirmed_at": None, "above": "", "thread": False,
                          "watches": 0}
    json.dumps(s.__dict__)  # what the JSON output does with it
    assert repr(s) == ("Status(mode='watching', reason='', version=2, cgroup_path='/a', "
                       "directory='/sys/fs/cgroup/a', host_source='meminfo', "
                       "confirmed_at=None, above='', thread=False, watches=0)")
    assert s == status() and hash(s) == hash(status())
    assert s != status(reason="x") and s != object()
    assert status(thread=True).thread and not s.thread  # replace() made a copy


@pytest.mark.parametrize("attempt", [
    lambda s: setattr(s, "mode", "polling"),
    lambda s: delattr(s, "mode"),
    lambda s: setattr(s, "new", 1),
])
def test_status_is_frozen(attempt: Callable[[Status], None]) -> None:
    s = status()
    with pytest.raises(AttributeError):
        attempt(s)
    assert s.mode == "watching"


def test_replace_refuses_an_unknown_field() -> None:
    with pytest.raises(TypeError):
        replace(status(), nonsense=1)


def test_level_info_as_dict_is_its_fields_in_order() -> None:
    info = LevelInfo("/a", "/d", 1 * GiB, 2, 1, GiB - 1, True, False, None)
    assert list(info.as_dict()) == list(LevelInfo._fields)
    assert info.as_dict() == info.__dict__
    assert info.as_dict()["high"] is None and info.as_dict()["hidden"] is False


def test_level_leaves_its_descriptors_out_of_equality_and_repr() -> None:
    a = Level("/a", "/d", 5, kept=None)
    b = Level("/a", "/d", 5, kept=object())  # type: ignore[arg-type]
    assert a == b and hash(a) == hash(b)
    assert "kept" not in repr(b)
    assert a != Level("/a", "/d", 6)
    with pytest.raises(AttributeError):
        a.__dict__  # noqa: B018 - slotted: no per-instance dict


@pytest.mark.parametrize("value", [
    status(), discovery.Resolved(1, "/a", "/m", "/", "/m/a"), discovery.Unresolved("why"),
    names.V2, Level("/a", "/d", None),
])
def test_copies_and_pickles_are_equal(value: object) -> None:
    assert copy.copy(value) == value
    assert copy.deepcopy(value) == value
    assert pickle.loads(pickle.dumps(value)) == value


def test_different_classes_with_the_same_values_differ() -> None:
    assert discovery.CgroupLine(0, (), "/") != discovery.Unresolved("/")
    assert discovery.Unresolved("x") != ("x", False)


# ---- the logger ---------------------------------------------------------------------------


def test_lazy_logger_records_name_their_caller(caplog: pytest.LogCaptureFixture) -> None:
    log = LazyLogger()
    with caplog.at_level(logging.DEBUG, logger="cgwatch"):
        log.warning("cgwatch: %s", "careful")
        log.debug("cgwatch: %d", 7)
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("cgwatch: failed")
    me = "test_lazy_logger_records_name_their_caller"
    assert [(r.name, r.levelno, r.getMessage(), r.funcName) for r in caplog.records] == [
        ("cgwatch", logging.WARNING, "cgwatch: careful", me),
        ("cgwatch", logging.DEBUG, "cgwatch: 7", me),
        ("cgwatch", logging.ERROR, "cgwatch: failed", me),
    ]
    assert caplog.records[2].exc_info is not None


def test_lazy_logger_imports_logging_only_for_a_record_that_can_show() -> None:
    out = run_child("""
        import sys
        from cgwatch.logs import log
        log.debug("cgwatch: dropped, as the unconfigured default drops it")
        print("logging" in sys.modules)
        log.warning("cgwatch: %s", "shown")
        print("logging" in sys.modules)
    """)
    assert out.split() == ["False", "True"]


def test_a_warning_before_logging_is_configured_reaches_stderr() -> None:
    result = subprocess.run([sys.executable, "-c",
                             "from cgwatch.logs import log; log.warning('cgwatch: %s', 'hi')"],
                            capture_output=True, text=True, timeout=60, check=True,
                            env={**os.environ, "PYTHONPATH": PROJECT}, cwd="/")
    assert result.stderr == "cgwatch: hi\n"  # logging's last-resort handler, as before


# ---- the watches at interpreter exit ------------------------------------------------------


def inotify_watches() -> dict[int, int]:
    """This process's inotify descriptors and the watches on each, from the kernel
    (/proc/self/fd links to anon_inode:inotify; one `inotify wd:` line per watch in fdinfo)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify":
                with open(f"/proc/self/fdinfo/{name}") as f:
                    found[int(name)] = sum(1 for line in f if line.startswith("inotify wd:"))
        except OSError:
            pass  # closed meanwhile (the listing's own descriptor, say)
    return found


def test_monitors_share_one_instance_and_give_it_back(host: FakeHost) -> None:
    """One inotify instance per process whatever the number of monitors (the kernel counts
    instances per uid), and none once no monitor watches."""
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None})
    before = inotify_watches()
    monitors = [Monitor(host.root) for _ in range(20)]
    try:
        assert {m.status.mode for m in monitors} == {WATCHING}
        # One watch per level's limit file (v1's fake root has one, v2's has none), none on a
        # directory.
        limit_name = "memory.max" if monitors[0].status.version == 2 else "memory.limit_in_bytes"
        files = [os.path.join(info.directory, limit_name) for info in monitors[0].levels()]
        assert {m.status.watches for m in monitors} == {sum(map(os.path.exists, files))}
        new = {fd: n for fd, n in inotify_watches().items() if fd not in before}
        assert len(new) <= 1 and len(inotify_watches()) <= len(before) + 1
        host.set_limit("/a", 3 * GiB)
        assert [m.total_memory() for m in monitors] == [3 * GiB] * 20  # each sees it
    finally:
        for m in monitors:
            m.close()
    assert all(m.status.watches == 0 for m in monitors)
    assert set(inotify_watches()) <= set(before)


def test_at_exit_the_watches_are_gone_before_the_shutdown_ends() -> None:
    """In a real interpreter: an atexit handler registered before cgwatch was imported runs
    after cgwatch's, and sees the instance still open (closed by the kernel at exit, after
    the shutdown) with no watch left, and polling monitors that still answer, also past a
    retry interval (no watching again)."""
    out = run_child(f"""
        import atexit, os, time

        def inotify_watches():
            found = []
            for name in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{{name}}") == "anon_inode:inotify":
                        with open(f"/proc/self/fdinfo/{{name}}") as f:
                            found.append(sum(1 for line in f if line.startswith("inotify wd:")))
                except OSError:
                    pass
            return found

        def after_cgwatch():
            time.sleep({tracker.RETRY_INTERVAL + 0.2})
            print(inotify_watches(), m.status.mode, m.status.watches, m.total_memory() == total,
                  m2.status.mode)

        atexit.register(after_cgwatch)
        import cgwatch
        m = cgwatch.Monitor()
        m2 = cgwatch.Monitor(thread=False)
        total = m.total_memory()
        print(m.status.mode, m.status.watches > 0, len(inotify_watches()))
    """)
    lines = out.splitlines()
    assert lines[0].split() == ["watching", "True", "1"]  # two monitors, one instance
    assert lines[1].split() == ["[0]", "polling", "0", "True", "polling"]


def test_an_idle_monitor_gives_the_instance_back_and_watches_again_when_asked() -> None:
    """A monitor with the thread and no query for IDLE_RELEASE seconds drops its watches, and
    the process's instance goes with the last of them (back to the uid); the next query
    answers right and watches again. (IDLE_RELEASE shortened; the real one is 60 s.)"""
    out = run_child("""
        import os, time
        from cgwatch import watchlease
        watchlease.IDLE_RELEASE = 0.3

        def instances():
            return sum(1 for name in os.listdir("/proc/self/fd")
                       if os.path.exists(f"/proc/self/fd/{name}")
                       and os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify")

        import cgwatch
        m = cgwatch.Monitor(migration_interval=0.1)
        total = m.total_memory()
        print(m.status.mode, instances())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and instances():
            time.sleep(0.05)  # no query meanwhile
        print(instances(), m.total_memory() == total, m.status.mode)
    """)
    assert out.split() == ["watching", "1", "0", "True", "watching"]


def test_many_monitors_share_one_timer_tick() -> None:
    """200 monitors made one after another wake the loop thread once per tick together
    (ticker.py): a member joins the next tick instead of starting a phase of its own.
    Counted in the kernel's voluntary context switches of the thread (each is one sleep then
    wake-up) over 1 s with a 0.2 s interval: ~5 expected (3-5 seen); with a phase per member
    it was ~30 per second for 1000 monitors. (The work per tick, one /proc/self/cgroup read
    for all, is the bench's `idle_scale`: a CPU figure, not a test.)"""
    out = run_child("""
        import threading, time
        import cgwatch
        monitors = []
        for _ in range(200):
            monitors.append(cgwatch.Monitor(migration_interval=0.2))
            time.sleep(0.001)  # joined at different moments
        tid = next(t.native_id for t in threading.enumerate() if t.name == "cgwatch")

        def switches():
            with open(f"/proc/self/task/{tid}/status") as f:
                return int(next(line.split()[1] for line in f
                                if line.startswith("voluntary_ctxt_switches")))

        time.sleep(0.5)
        before = switches()
        time.sleep(1.0)
        print(switches() - before)
    """)
    assert int(out) < 15
