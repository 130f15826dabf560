"""The inotify quota rule's pure parts (the shared count's text, what to do with it) and
take_counted over a stand-in for the uid's instances: one count per burst, and no probe that
reaches the limit (docs/design.md, "Sharing the uid's inotify quota")."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

from cgwatch import quota
from cgwatch.quota import COUNT, PROBE, REFUSE, Count


class ParseRow(NamedTuple):
    id: str
    text: str
    expected: Optional[Count]


PARSE = [
    ParseRow("written", "cgwatch-inotify-count 1 12.500000 110 128 4242:9876\n",
             Count(12.5, 110, 128, "4242:9876")),
    ParseRow("none-free", "cgwatch-inotify-count 1 0.000000 0 12 7:1\n", Count(0.0, 0, 12, "7:1")),
    ParseRow("new-empty-file", "", None),
    ParseRow("cut-short-by-a-crash", "cgwatch-inotify-count 1 12.500000 11", None),
    ParseRow("another-version", "cgwatch-inotify-count 2 12.5 110 128 7:1\n", None),
    ParseRow("missing-field", "cgwatch-inotify-count 1 12.5 110 128\n", None),
    ParseRow("extra-field", "cgwatch-inotify-count 1 12.5 110 128 7:1 7\n", None),
    ParseRow("nan-time", "cgwatch-inotify-count 1 nan 110 128 7:1\n", None),
    ParseRow("negative-free", "cgwatch-inotify-count 1 12.5 -1 128 7:1\n", None),
    ParseRow("arabic-indic-digits", "cgwatch-inotify-count 1 12.5 \u0661\u0661 128 7:1\n",
             None),
    ParseRow("two-records", "cgwatch-inotify-count 1 1.0 5 128 7:1\ncgwatch-inotify-count 1 "
             "2.0 5 128 7:1\n", None),
]


@pytest.mark.parametrize("row", PARSE, ids=[r.id for r in PARSE])
def test_parse_count(row: ParseRow) -> None:
    assert quota.parse_count(row.text) == row.expected


def test_format_count_reads_back() -> None:
    count = Count(1234.25, 17, 128, "4242:9876")
    assert quota.format_count(count) == "cgwatch-inotify-count 1 1234.250000 17 128 4242:9876\n"
    assert quota.parse_count(quota.format_count(count)) == count


class PlanRow(NamedTuple):
    id: str
    count: Optional[Count]
    now: float
    limit: int
    expected: str
    counter_alive: bool = True


PLAN = [
    PlanRow("no-count-yet", None, 100.0, 128, COUNT),
    # reserve(128) = 16: a probe makes 17, and stops MARGIN = 2 short of the limit at 19.
    PlanRow("enough-for-a-probe", Count(95.0, 19, 128, "7:1"), 100.0, 128, PROBE),
    PlanRow("one-short", Count(95.0, 18, 128, "7:1"), 100.0, 128, REFUSE),
    PlanRow("none-free", Count(95.0, 0, 128, "7:1"), 100.0, 128, REFUSE),
    PlanRow("just-fresh", Count(90.0, 18, 128, "7:1"), 100.0, 128, REFUSE),  # FRESH = 10 s
    PlanRow("stale", Count(89.9, 18, 128, "7:1"), 100.0, 128, COUNT),
    PlanRow("another-clock-ahead", Count(100.5, 18, 128, "7:1"), 100.0, 128, COUNT),
    PlanRow("limit-changed", Count(95.0, 100, 256, "7:1"), 100.0, 128, COUNT),
    # A namespace limited to 12: reserve 4, a probe of 5 needs 7 free.
    PlanRow("small-namespace-probe", Count(95.0, 7, 12, "7:1"), 100.0, 12, PROBE),
    PlanRow("small-namespace-refuse", Count(95.0, 6, 12, "7:1"), 100.0, 12, REFUSE),
    # The counter is gone: its namespace may be too, and its inode number given to ours.
    PlanRow("counter-gone", Count(95.0, 6, 12, "7:1"), 100.0, 12, COUNT, counter_alive=False),
]


@pytest.mark.parametrize("row", PLAN, ids=[r.id for r in PLAN])
def test_plan(row: PlanRow) -> None:
    assert quota.plan(row.count, row.now, row.limit, row.counter_alive) == row.expected


class Uid:
    """The uid's instances: `used` held by others, each init() one more, EMFILE at `limit`;
    `hidden` of the held ones are not seen by the count (another pid namespace)."""

    def __init__(self, limit: int, used: int = 0, hidden: int = 0) -> None:
        self.limit, self.used, self.hidden = limit, used, hidden
        self.least_free = limit - used
        self.counts = 0
        self.inits = 0
        self._ours: set[int] = set()

    def init(self) -> int:
        self.inits += 1
        if self.used >= self.limit:
            raise OSError(errno.EMFILE, "Too many open files")
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.used += 1
        self.least_free = min(self.least_free, self.limit - self.used)
        self._ours.add(fd)
        return fd

    def closed(self) -> None:
        """take_instance closed the probe's extra descriptors: give them back."""
        for fd in list(self._ours):
            try:
                os.fstat(fd)
            except OSError:
                self._ours.discard(fd)
                self.used -= 1

    def count(self, uid: int) -> int:
        self.counts += 1
        return self.used - self.hidden

    def close_all(self) -> None:
        for fd in self._ours:
            os.close(fd)


def _take(uid: Uid, dirs: list[str], now: float = 100.0) -> int:
    ours, _ = quota.take_counted(uid.init, uid.limit, now, {}, dirs, uid.count)
    uid.closed()
    return ours


def test_a_burst_counts_once_and_no_probe_reaches_the_limit(tmp_path: Path) -> None:
    """300 processes of a uid limited to 128 start together: 110 take one (each lowers the
    shared count), the other 190 take none and touch no instance; the uid never has fewer
    than MARGIN = 2 free, even during a probe (before: every probe of the 188 refused ones
    held the last 16), and /proc is counted once."""
    uid = Uid(128)
    try:
        taken = [_take(uid, [str(tmp_path)]) for _ in range(300)]
        assert sum(1 for fd in taken if fd >= 0) == 110
        assert uid.used == 110 and uid.least_free == 2 and uid.counts == 1
        assert uid.inits == 110 * 17  # no probe after the count said too few
        (path,) = tmp_path.iterdir()
        assert quota.parse_count(path.read_text()) == Count(100.0, 18, 128,
                                                            quota.process_id("self"))
        assert path.stat().st_mode & 0o777 == 0o600
        # FRESH seconds later the count is made again (instances may have been freed).
        assert _take(uid, [str(tmp_path)], now=100.0 + quota.FRESH + 0.1) < 0
        assert uid.counts == 2
    finally:
        uid.close_all()


def test_a_count_that_missed_instances_stops_at_the_probe(tmp_path: Path) -> None:
    """Instances the count cannot see (another pid namespace): the probe finds too few, once,
    and its finding is kept, so the next processes touch no instance."""
    uid = Uid(128, used=120, hidden=120)
    try:
        assert _take(uid, [str(tmp_path)]) < 0
        inits = uid.inits
        assert inits == 9  # 8 made, the 9th refused
        assert _take(uid, [str(tmp_path)]) < 0
        assert uid.inits == inits and uid.counts == 1
    finally:
        uid.close_all()


def test_a_count_by_a_process_gone_is_made_again(tmp_path: Path) -> None:
    """A count of a namespace freed since (its inode number now ours) says nothing: its
    counter is gone, so the uid is counted again."""
    name = quota.shared_name(os.geteuid())
    (tmp_path / name).write_text("cgwatch-inotify-count 1 100.000000 0 128 999999999:1\n")
    os.chmod(tmp_path / name, 0o600)
    uid = Uid(128)
    try:
        assert _take(uid, [str(tmp_path)]) >= 0
        assert uid.counts == 1
    finally:
        uid.close_all()


def test_process_id() -> None:
    me = quota.process_id("self")
    assert me.startswith(f"{os.getpid()}:") and quota.process_id(str(os.getpid())) == me
    assert quota.process_id("") == quota.process_id("../1") == ""


def test_a_held_lock_is_not_waited_for(tmp_path: Path) -> None:
    uid = Uid(128)
    name = quota.shared_name(os.geteuid())
    fd = os.open(tmp_path / name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(quota.ProbeBusy):
            _take(uid, [str(tmp_path)])
        assert uid.inits == 0 and uid.counts == 0
    finally:
        os.close(fd)


@pytest.mark.parametrize("trap", ["open-to-others", "owned-by-another-uid", "symlink"])
def test_a_file_not_ours_alone_is_never_used(tmp_path: Path, trap: str) -> None:
    """Another user can make the name first (to mislead us or stop us): a file open to
    others, owned by another uid, or a symlink is passed over for the next directory."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    name = quota.shared_name(os.geteuid())
    # "none free", by us: would refuse
    lie = f"cgwatch-inotify-count 1 100.000000 0 128 {quota.process_id('self')}\n"
    if trap == "symlink":
        (tmp_path / "elsewhere").write_text(lie)
        (first / name).symlink_to(tmp_path / "elsewhere")
    else:
        (first / name).write_text(lie)
        os.chmod(first / name, 0o644 if trap == "open-to-others" else 0o600)
        if trap == "owned-by-another-uid":
            if os.geteuid() != 0:
                pytest.skip("chown needs root")
            os.chown(first / name, 43118, 43118)
    uid = Uid(128)
    try:
        assert _take(uid, [str(first), str(second)]) >= 0
        assert quota.parse_count((second / name).read_text()) == Count(
            100.0, 127, 128, quota.process_id("self"))
    finally:
        uid.close_all()


def test_without_a_shared_file_the_process_counts_alone() -> None:
    uid = Uid(128, used=110)
    try:
        assert _take(uid, ["/nonexistent-dir-for-cgwatch"]) < 0
        assert uid.inits == 0 and uid.counts == 1
    finally:
        uid.close_all()


def test_count_instances_sees_our_own(tmp_path: Path) -> None:
    """The real /proc, this process alone (a directory holding only a link to our
    /proc/<pid>): an instance we make is counted (anon_inode:inotify), an epoll is not; a
    process of another uid is not looked at."""
    import ctypes
    import select

    libc = ctypes.CDLL(None, use_errno=True)
    (tmp_path / str(os.getpid())).symlink_to(f"/proc/{os.getpid()}")
    (tmp_path / "self").symlink_to(f"/proc/{os.getpid()}")  # not a pid: passed over
    before = quota.count_instances(os.geteuid(), str(tmp_path))
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        pytest.skip("no inotify instance to be had")
    epoll = select.epoll(1)
    try:
        assert quota.count_instances(os.geteuid(), str(tmp_path)) == before + 1
        assert quota.count_instances(os.geteuid() + 1, str(tmp_path)) == 0
    finally:
        os.close(fd)
        epoll.close()


def test_an_instance_given_back_raises_the_count(tmp_path: Path) -> None:
    """A monitor made and closed 200 times in one process (tests/test_lifecycle.py) takes
    and gives back: the shared count stays where it was."""
    uid = Uid(128)
    try:
        for _ in range(200):
            fd = _take(uid, [str(tmp_path)])
            assert fd >= 0
            os.close(fd)
            uid.closed()
            quota.give_back(128, {}, [str(tmp_path)])
        (path,) = tmp_path.iterdir()
        count = quota.parse_count(path.read_text())
        assert count is not None and count.free == 128 and uid.counts == 1
    finally:
        uid.close_all()
