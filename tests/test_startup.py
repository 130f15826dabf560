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
import time
from typing import Callable

import pytest

from cgwatch import POLLING, WATCHING, Monitor, discovery, names, tracker, watching
from cgwatch.frozen import replace
from cgwatch.logs import LazyLogger
from cgwatch.snapshot import LevelInfo, Status
from cgwatch.tree import Level
from tests.cgroup_helpers import wait_for
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
                          "confirmed_at": None, "above": "", "thread": False}
    json.dumps(s.__dict__)  # what the JSON output does with it
    assert repr(s) == ("Status(mode='watching', reason='', version=2, cgroup_path='/a', "
                       "directory='/sys/fs/cgroup/a', host_source='meminfo', "
                       "confirmed_at=None, above='', thread=False)")
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


def watch_count(fd: int) -> int:
    """inotify watches on `fd`, from the kernel's fdinfo (one `inotify wd:` line each)."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return sum(1 for line in f if line.startswith("inotify wd:"))


def test_release_at_exit_drops_the_watches_and_keeps_answering(host: FakeHost,
                                                               opened: list[Monitor]) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None})
    m = Monitor(host.root, poll_interval=0.05)
    opened.append(m)
    assert m.status.mode == WATCHING
    fd = m._tracker._watch.fileno()
    assert watch_count(fd) > 0
    m._tracker.release_at_exit()
    assert watch_count(fd) == 0  # removed, the descriptor still open
    assert m.status.mode == POLLING and "shutting down" in m.status.reason
    host.set_limit("/a", 3 * GiB)
    assert wait_for(lambda: m.total_memory() == 3 * GiB)  # polling sees it
    time.sleep(tracker.RETRY_INTERVAL + 0.1)
    m.total_memory()
    assert m.status.mode == POLLING  # no watching again after the retry interval
    assert not m._tracker._watch.active
    m._tracker.release_at_exit()  # twice is harmless
    m.close()
    assert m.total_memory() == 3 * GiB


def test_at_exit_the_watches_are_gone_before_the_shutdown_ends() -> None:
    """In a real interpreter: an atexit handler registered before cgwatch was imported runs
    after cgwatch's, and sees no watch left and a polling monitor that still answers."""
    out = run_child("""
        import atexit

        def after_cgwatch():
            fd = m._tracker._watch_fd_seen
            with open(f"/proc/self/fdinfo/{fd}") as f:
                left = sum(1 for line in f if line.startswith("inotify wd:"))
            print(left, m.status.mode, m.total_memory() == total)

        atexit.register(after_cgwatch)
        import cgwatch
        m = cgwatch.Monitor()
        total = m.total_memory()
        m._tracker._watch_fd_seen = m._tracker._watch.fileno()
        print(m.status.mode)
    """)
    assert out.split() == ["watching", "0", "polling", "True"]


def test_released_watchers_are_kept_open_until_the_module_goes(host: FakeHost,
                                                               opened: list[Monitor]) -> None:
    host.make_path({"/a": 4 * GiB, "/a/b": None, "/a/b/c": None})
    m = Monitor(host.root)
    opened.append(m)
    watcher = m._tracker._watch.watcher
    m._tracker.release_at_exit()
    assert watcher in watching._released and watcher is not None and watcher.fileno() >= 0
    watching._released.remove(watcher)
    watcher.close()
