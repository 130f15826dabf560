"""The events layer on fake /proc + /sys trees: baselines, rises, attribution, delivery (queue,
callbacks, log), headroom alerts and cleanup. Kernel behaviour itself (eventfds, inotify on
real cgroup files, real OOM kills) is in tests/test_events_real.py."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import pytest

from cgwatch import Monitor
from cgwatch.alerts import HeadroomAlert
from cgwatch.events import Event, Events
from tests.fake_tree import FakeHost, GiB, MiB

FAST: dict[str, Any] = {"poll_interval": 0.02, "check_interval": 0.02}


def v2_events(**counts: int) -> str:
    keys = ("low", "high", "max", "oom", "oom_kill", "oom_group_kill")
    return "".join(f"{k} {counts.get(k, 0)}\n" for k in keys)


def v1_oom_control(oom_kill: int, under_oom: int = 0) -> str:
    return f"oom_kill_disable 0\nunder_oom {under_oom}\noom_kill {oom_kill}\n"


class Tree:
    """A fake host with /a (1 GiB) / b / c (the process), and counter files at every level."""

    def __init__(self, root: str, version: int) -> None:
        self.host = FakeHost(root, version)
        self.host.make_path({"/a": 1 * GiB, "/a/b": None, "/a/b/c": None})
        self.version = version
        for path in ("/a", "/a/b", "/a/b/c"):
            self.set(path)

    def set(self, cgroup_path: str, given: Optional[dict[str, int]] = None, *,
            local: Optional[dict[str, int]] = None, **more: int) -> None:
        """Write the level's counter files: `given` and `more` counters, 0 for the rest."""
        counts = {**(given or {}), **more}
        d = self.host.level_dir(cgroup_path)
        if self.version == 2:
            self.host.write(d + "/memory.events.local", v2_events(**(local or {})))
            self.host.write(d + "/memory.events", v2_events(**counts))
        else:
            self.host.write(d + "/memory.failcnt", f"{counts.get('failcnt', 0)}\n")
            self.host.write(d + "/memory.oom_control", v1_oom_control(
                counts.get("oom_kill", 0), counts.get("under_oom", 0)))


@pytest.fixture
def tree(version: int, tmp_path: Any) -> Tree:
    return Tree(str(tmp_path), version)


def start(opened: list[Any], tree: Tree, **kwargs: Any) -> Events:
    monitor = Monitor(tree.host.root)
    opened.append(monitor)
    events = Events(monitor, **{**FAST, **kwargs})
    opened.append(events)
    return events


def start_quiet(opened: list[Any], tree: Tree) -> Events:
    """Events that read only when asked (scan_now): no inotify, a poll a minute away."""
    monitor = Monitor(tree.host.root, use_inotify=False)
    opened.append(monitor)
    events = Events(monitor, poll_interval=60.0, log=False)
    opened.append(events)
    assert events.scan_now() == []  # answers the thread's own look after the baseline
    return events


def drain(events: Events, wait: float = 0.3) -> list[Any]:
    """Everything delivered within `wait` seconds."""
    got: list[Any] = []
    deadline = time.monotonic() + wait
    while True:
        item = events.get(timeout=max(0.0, deadline - time.monotonic()))
        if item is None:
            return got
        got.append(item)


def wait_for(events: Events, match: Callable[[Any], bool], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        item = events.get(timeout=max(0.0, deadline - time.monotonic()))
        if item is None:
            raise AssertionError("no matching item in time")
        if match(item):
            return item


def is_event(counter: str) -> Callable[[Any], bool]:
    return lambda item: isinstance(item, Event) and item.counter == counter


def test_baseline_not_reported_later_rise_is(tree: Tree, opened: list[Any]) -> None:
    counter = "oom_kill"
    tree.set("/a/b/c", {counter: 4})  # before the watch began
    events = start(opened, tree)
    assert drain(events) == []
    tree.set("/a/b/c", {counter: 5})
    event = wait_for(events, is_event(counter))
    assert (event.cgroup_path, event.level, event.old, event.new) == ("/a/b/c", 0, 4, 5)
    assert event.limit is None and event.usage == 100 * MiB
    assert event.version == tree.version
    assert event.time <= time.monotonic()


def test_v2_rise_echoed_by_ancestors_is_marked_propagated(tmp_path: Any,
                                                           opened: list[Any]) -> None:
    tree = Tree(str(tmp_path), 2)
    events = start_quiet(opened, tree)
    # One kill in c: the kernel raises memory.events at c and every ancestor, the local file
    # only at c.
    tree.set("/a", oom_kill=1)
    tree.set("/a/b", oom_kill=1)
    tree.set("/a/b/c", local={"oom_kill": 1}, oom_kill=1)
    found = [e for e in events.scan_now() if isinstance(e, Event)]
    by_path = {e.cgroup_path: e for e in found}
    assert [e.counter for e in found] == ["oom_kill"] * 3
    assert [by_path[p].propagated for p in ("/a/b/c", "/a/b", "/a")] == [False, True, True]
    leaf = by_path["/a/b/c"]
    assert (leaf.local_old, leaf.local_new) == (0, 1)
    assert (by_path["/a"].local_old, by_path["/a"].local_new) == (0, 0)
    assert by_path["/a"].limit == 1 * GiB
    # A second kill elsewhere under /a (a sibling of b) rises at /a alone: its own share.
    tree.set("/a", oom_kill=2)
    (sibling,) = events.scan_now()
    assert isinstance(sibling, Event)
    assert (sibling.cgroup_path, sibling.old, sibling.new, sibling.propagated) == \
        ("/a", 1, 2, False)


def test_v2_rise_split_over_two_scans_is_still_propagated(tmp_path: Any,
                                                          opened: list[Any]) -> None:
    # The kernel raises c, then b, then a; a scan can fall in between (seen in the v2 VM).
    tree = Tree(str(tmp_path), 2)
    events = start_quiet(opened, tree)
    tree.set("/a/b/c", local={"oom_kill": 1}, oom_kill=1)
    tree.set("/a/b", oom_kill=1)
    first = [(e.cgroup_path, e.propagated) for e in events.scan_now() if isinstance(e, Event)]
    assert first == [("/a/b/c", False), ("/a/b", True)]
    tree.set("/a", oom_kill=1)
    (late,) = events.scan_now()
    assert isinstance(late, Event)
    assert (late.cgroup_path, late.propagated) == ("/a", True)


def test_v1_counters_are_polled(tmp_path: Any, opened: list[Any]) -> None:
    tree = Tree(str(tmp_path), 1)
    events = start(opened, tree)
    # The fake tree has no cgroup.event_control: eventfds fail and polling is said.
    assert "polled every 0.02s" in events.mechanisms()["events"]
    tree.set("/a", failcnt=7)
    event = wait_for(events, is_event("failcnt"))
    assert (event.cgroup_path, event.old, event.new, event.limit) == ("/a", 0, 7, 1 * GiB)
    assert event.source == "memory.failcnt"


def test_raising_callback_does_not_stop_later_events(tree: Tree, opened: list[Any],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    events = start(opened, tree, log=False)
    good: list[Any] = []

    def bad(item: Any) -> None:
        raise RuntimeError("boom")

    events.subscribe(bad)
    events.subscribe(good.append)
    counter = "failcnt" if tree.version == 1 else "max"
    with caplog.at_level(logging.ERROR, logger="cgwatch"):
        for n in (1, 2):
            tree.set("/a", {counter: n})
            wait_for(events, lambda item, n=n: isinstance(item, Event)  # type: ignore[misc]
                     and item.new == n)
    deadline = time.monotonic() + 1
    while len(good) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(e.old, e.new) for e in good] == [(0, 1), (1, 2)]
    failures = [r for r in caplog.records if "callback" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)


def test_default_log_records(tree: Tree, opened: list[Any],
                             caplog: pytest.LogCaptureFixture) -> None:
    start(opened, tree)
    with caplog.at_level(logging.INFO, logger="cgwatch"):
        tree.set("/a/b/c", oom_kill=1)
        limit_counter = "failcnt" if tree.version == 1 else "max"
        tree.set("/a", {limit_counter: 3})
        deadline = time.monotonic() + 2
        while len([r for r in caplog.records if "cgroup /a" in r.getMessage()]) < 2:
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.01)
    records = {r.getMessage().split(":", 2)[1].strip(): r for r in caplog.records
               if "cgroup /a" in r.getMessage()}
    kill = next(r for r in caplog.records if "oom_kill 0 -> 1" in r.getMessage())
    assert kill.levelno == logging.ERROR
    assert "cgroup /a/b/c" in kill.getMessage()
    assert "limit none here; 1.0 GiB at /a" in kill.getMessage()
    hit = next(r for r in caplog.records if f"{limit_counter} 0 -> 3" in r.getMessage())
    assert hit.levelno == logging.WARNING and "limit 1.0 GiB" in hit.getMessage()
    assert records


@pytest.mark.parametrize("log", [True, False])
def test_a_callback_does_not_silence_the_log_only_log_false_does(
        tree: Tree, opened: list[Any], caplog: pytest.LogCaptureFixture, log: bool) -> None:
    """The records are the library's audit trail on logger `cgwatch`: a callback added for
    another purpose (metrics, cleanup) leaves them on; `Events(log=False)` (or the logging
    configuration) turns them off."""
    events = start(opened, tree, log=log)
    delivered: list[Any] = []
    events.subscribe(delivered.append)
    counter = "failcnt" if tree.version == 1 else "max"
    with caplog.at_level(logging.INFO, logger="cgwatch"):
        tree.set("/a", {counter: 2})
        wait_for(events, is_event(counter))
        deadline = time.monotonic() + 2
        while not delivered:
            assert time.monotonic() < deadline, "the callback got nothing"
            time.sleep(0.01)
    records = [r for r in caplog.records if f"{counter} 0 -> 2" in r.getMessage()]
    assert [(e.counter, e.new) for e in delivered] == [(counter, 2)]
    assert len(records) == (1 if log else 0), [r.getMessage() for r in caplog.records]


def test_headroom_alert_fires_past_threshold_not_before(tree: Tree, opened: list[Any]) -> None:
    events = start(opened, tree)
    seen: list[HeadroomAlert] = []
    events.alert_below("200M", callback=seen.append)
    assert drain(events, 0.2) == []  # 1 GiB - 90 MiB working set: far above
    tree.host.set_usage("/a", 950 * MiB, 10 * MiB)  # headroom 1024 - 940 = 84 MiB
    alert = wait_for(events, lambda item: isinstance(item, HeadroomAlert))
    assert alert.below and alert.threshold == 200 * MiB
    assert alert.available == 84 * MiB and alert.cgroup_path == "/a"
    assert (alert.limit, alert.usage) == (1 * GiB, 950 * MiB)
    tree.host.set_usage("/a", 500 * MiB, 10 * MiB)
    back = wait_for(events, lambda item: isinstance(item, HeadroomAlert))
    assert not back.below
    assert seen == [alert, back]


def test_fraction_alert_already_below_is_reported_at_once(tree: Tree,
                                                          opened: list[Any]) -> None:
    tree.host.set_usage("/a", 1000 * MiB, 0)
    events = start(opened, tree)
    events.alert_below("10%")
    alert = wait_for(events, lambda item: isinstance(item, HeadroomAlert))
    assert alert.below and alert.threshold == int(GiB * 0.1) and alert.spec == "10% of total"


def test_queue_keeps_the_newest(tree: Tree, opened: list[Any]) -> None:
    events = start(opened, tree, queue_size=2, log=False)
    counter = "failcnt" if tree.version == 1 else "max"
    done: list[Any] = []
    events.subscribe(done.append)
    for n in (1, 2, 3):
        tree.set("/a", {counter: n})
        deadline = time.monotonic() + 2
        while len(done) < n and time.monotonic() < deadline:
            time.sleep(0.005)
    assert [e.new for e in drain(events, 0.1)] == [2, 3]
    assert events.dropped == 1


def test_iteration_ends_on_close_and_hooks_are_removed(tree: Tree, opened: list[Any]) -> None:
    events = start(opened, tree)
    monitor = events.monitor
    assert monitor.subscriptions == 1
    events.close()
    assert list(events) == []
    assert events.get(timeout=0.01) is None
    assert monitor.subscriptions == 0  # detached from the monitor
    events.close()  # twice is fine


def test_scan_now_reads_synchronously(tree: Tree, opened: list[Any]) -> None:
    events = start_quiet(opened, tree)
    tree.set("/a/b/c", oom_kill=1)
    found = events.scan_now()
    kills = [e for e in found if isinstance(e, Event) and e.counter == "oom_kill"]
    assert [(e.cgroup_path, e.old, e.new) for e in kills] == [("/a/b/c", 0, 1)]


def test_no_cgroup_means_no_events(tmp_path: Any, opened: list[Any]) -> None:
    host = FakeHost(str(tmp_path), 2)
    host.write("/proc/self/cgroup", "")  # nothing to resolve: host values
    monitor = Monitor(host.root)
    opened.append(monitor)
    events = Events(monitor, **FAST)
    opened.append(events)
    assert events.mechanisms()["events"].startswith("none")
    assert drain(events, 0.1) == []


@pytest.mark.parametrize("native", [True, False], ids=["os.eventfd", "ctypes (3.9)"])
def test_eventfd(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    import fcntl
    import os

    from cgwatch import notify

    if not native:
        monkeypatch.delattr(os, "eventfd", raising=False)
    elif not hasattr(os, "eventfd"):
        pytest.skip("this Python has no os.eventfd")
    fd = notify.eventfd()
    try:
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
        assert notify.drain_eventfd(fd) == 0  # nothing yet, and no blocking
        os.write(fd, (3).to_bytes(8, "little"))
        os.write(fd, (2).to_bytes(8, "little"))
        assert notify.drain_eventfd(fd) == 5
        assert notify.drain_eventfd(fd) == 0
    finally:
        os.close(fd)


def test_default_monitor_is_used(tree: Tree, opened: list[Any]) -> None:
    import cgwatch

    # A fake-tree monitor in the default's place: a real default would outlive the test.
    monitor = Monitor(tree.host.root)
    opened.append(monitor)
    previous = cgwatch.set_default_monitor(monitor)
    try:
        with cgwatch.Events(log=False) as events:
            assert events.monitor is monitor
            assert set(events.mechanisms()) == {"events", "alerts"}
    finally:
        cgwatch.set_default_monitor(previous)


def test_fork_child_gets_a_closed_copy(tree: Tree, opened: list[Any]) -> None:
    import os

    events = start(opened, tree)
    monitor = events.monitor
    assert monitor.subscriptions == 1
    pid = os.fork()
    if pid == 0:  # the child: no close() here; the copy must already be closed and detached
        code = 1
        try:
            ok = events.get(timeout=0.01) is None and events.closed
            detached = monitor.subscriptions == 0
            # The child's own changes reach neither the copy nor the parent's thread.
            tree.set("/a/b/c", oom_kill=5)
            monitor.total_memory()
            code = 0 if ok and detached and events.get(timeout=0.05) is None else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    tree.set("/a/b/c", oom_kill=7)  # the parent's copy still works
    assert wait_for(events, is_event("oom_kill")).new in (5, 7)
    assert monitor.subscriptions == 1
