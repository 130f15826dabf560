"""cgwatch's own inotify binding (inotify.py): the event parser on the kernel's byte layout,
the system calls on the real kernel, and the errors the monitor turns into polling."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest

from cgwatch import inotify, testdoor
from cgwatch.inotify import (
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MODIFY,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Target,
    Watcher,
    WatchUnavailable,
    parse_events,
)


def event(wd: int, mask: int, cookie: int = 0, name: bytes = b"", size: int = -1) -> bytes:
    """One struct inotify_event as the kernel lays it out: the name NUL-padded to `size`
    bytes (the kernel rounds up to a multiple of 16: fs/notify/inotify/inotify_user.c
    round_event_name_len())."""
    if size < 0:
        size = 0 if not name else (len(name) + 1 + 15) // 16 * 16
    return struct.pack("=iIII", wd, mask, cookie, size) + name.ljust(size, b"\0")


# ---- the parser ---------------------------------------------------------------------------


def test_the_kernels_header_is_16_bytes() -> None:
    # int wd; uint32_t mask, cookie, len: no padding on any architecture Linux has.
    assert inotify.EVENT_HEAD_SIZE == 16
    assert ctypes.sizeof(ctypes.c_int) + 3 * ctypes.sizeof(ctypes.c_uint32) == 16


@pytest.mark.parametrize(("data", "expected"), [
    (b"", []),
    # An event on the watched file itself: no name, len 0.
    (event(1, IN_MODIFY), [(1, IN_MODIFY, 0, "")]),
    # An event in a watched directory: the name padded to 16 bytes.
    (event(3, IN_DELETE, name=b"child"), [(3, IN_DELETE, 0, "child")]),
    # A name of exactly 16 bytes takes 32 (its NUL needs a byte).
    (event(3, IN_CREATE, name=b"a" * 16), [(3, IN_CREATE, 0, "a" * 16)]),
    (event(3, IN_CREATE, name=b"a" * 15), [(3, IN_CREATE, 0, "a" * 15)]),
    # Several events in one read, names and none mixed, a cookie kept.
    (event(1, IN_MODIFY) + event(2, IN_DELETE, 7, b"x y") + event(1, IN_DELETE_SELF)
     + event(1, IN_IGNORED),
     [(1, IN_MODIFY, 0, ""), (2, IN_DELETE, 7, "x y"), (1, IN_DELETE_SELF, 0, ""),
      (1, IN_IGNORED, 0, "")]),
    # The queue overflowed: wd -1.
    (event(-1, IN_Q_OVERFLOW), [(-1, IN_Q_OVERFLOW, 0, "")]),
    # A directory event flag the kernel adds (IN_ISDIR 0x40000000) stays in the mask.
    (event(4, IN_DELETE | 0x40000000, name=b"sub"), [(4, IN_DELETE | 0x40000000, 0, "sub")]),
    # A name that is not UTF-8 decodes as os.fsdecode does (surrogateescape).
    (event(5, IN_CREATE, name=b"caf\xe9"), [(5, IN_CREATE, 0, "caf\udce9")]),
    # A truncated tail is ignored: half a header, or a name cut short.
    (event(1, IN_MODIFY) + b"\x01\x00\x00", [(1, IN_MODIFY, 0, "")]),
    (event(1, IN_MODIFY) + event(2, IN_CREATE, name=b"abc")[:20], [(1, IN_MODIFY, 0, "")]),
])
def test_parse_events(data: bytes, expected: list[tuple[int, int, int, str]]) -> None:
    assert parse_events(data) == expected


def test_parse_events_round_trips_every_name_length() -> None:
    data = b"".join(event(n, IN_CREATE, n, b"n" * n) for n in range(1, 40))
    assert parse_events(data) == [(n, IN_CREATE, n, "n" * n) for n in range(1, 40)]


# ---- the real kernel ----------------------------------------------------------------------


@pytest.fixture()
def ifd() -> Iterator[int]:
    fd = inotify.inotify_init()
    yield fd
    os.close(fd)


def read_all(fd: int) -> list[tuple[int, int, int, str]]:
    try:
        return parse_events(os.read(fd, 65536))
    except BlockingIOError:
        return []


def test_the_descriptor_is_non_blocking_and_close_on_exec(ifd: int) -> None:
    assert not os.get_blocking(ifd)
    assert fcntl.fcntl(ifd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    with pytest.raises(BlockingIOError):
        os.read(ifd, 4096)  # nothing queued: EAGAIN, not a hang


def test_a_write_raises_modify_and_rm_raises_delete_self_then_ignored(ifd: int,
                                                                      tmp_path: Path) -> None:
    path = tmp_path / "memory.max"
    path.write_text("max\n")
    wd = inotify.add_watch(ifd, str(path), IN_MODIFY | IN_DELETE_SELF)
    assert wd >= 1
    with open(path, "w") as f:
        f.write("1073741824\n")
    assert (wd, IN_MODIFY, 0, "") in read_all(ifd)
    path.unlink()
    masks = [mask for w, mask, _, _ in read_all(ifd) if w == wd]
    assert IN_DELETE_SELF in masks
    assert masks[-1] == IN_IGNORED  # the kernel dropped the watch: it is the last event
    with pytest.raises(OSError) as info:
        inotify.rm_watch(ifd, wd)
    assert info.value.errno == errno.EINVAL


def test_a_directory_watch_names_the_child(ifd: int, tmp_path: Path) -> None:
    wd = inotify.add_watch(ifd, str(tmp_path), IN_CREATE | IN_DELETE | IN_ONLYDIR)
    for name in ("c", "a name with spaces", "x" * 16, "caf\udce9"):
        (tmp_path / name).mkdir()
        (tmp_path / name).rmdir()
    events = [(mask & ~0x40000000, name) for w, mask, _, name in read_all(ifd) if w == wd]
    assert events == [(flag, name) for name in ("c", "a name with spaces", "x" * 16,
                                                "caf\udce9")
                      for flag in (IN_CREATE, IN_DELETE)]


def test_the_same_inode_gets_the_same_watch(ifd: int, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.touch()
    first = inotify.add_watch(ifd, str(path), IN_MODIFY)
    assert inotify.add_watch(ifd, str(path), IN_MODIFY | IN_ATTRIB) == first
    inotify.rm_watch(ifd, first)


@pytest.mark.parametrize(("make", "mask", "code"), [
    (lambda p: p / "missing", IN_MODIFY, errno.ENOENT),
    (lambda p: p / "file", IN_DELETE | IN_ONLYDIR, errno.ENOTDIR),
])
def test_add_watch_errors(ifd: int, tmp_path: Path, make: Callable[[Path], Path], mask: int,
                          code: int) -> None:
    (tmp_path / "file").touch()
    with pytest.raises(OSError) as info:
        inotify.add_watch(ifd, str(make(tmp_path)), mask)
    assert info.value.errno == code


def test_watcher_reports_changes_by_target(tmp_path: Path) -> None:
    level = tmp_path / "a"
    level.mkdir()
    limit = level / "memory.max"
    limit.write_text("max\n")
    w = Watcher()
    try:
        w.replace([Target(str(limit), "limit", 0), Target(str(tmp_path), "dir", 1)])
        assert w.read() == ([], False)
        limit.write_text("4096\n")
        changes, rebuild = w.read()
        assert [(c.target.kind, c.mask, c.name) for c in changes] == [("limit", IN_MODIFY, "")]
        assert not rebuild
        limit.unlink()
        level.rmdir()
        changes, rebuild = w.read()
        assert rebuild  # the limit file's watch went (IN_DELETE_SELF, IN_IGNORED)
        assert ("dir", "a") in [(c.target.kind, c.name) for c in changes]
        # A watch replaced away raises nothing more.
        w.replace([Target(str(tmp_path), "dir", 1)])
        (tmp_path / "b").mkdir()
        assert w.read() == ([], False)  # IN_CREATE is not in the dir mask
    finally:
        w.close()
    assert w.fileno() == -1
    w.close()  # twice is harmless


def test_watcher_replace_says_which_path_vanished(tmp_path: Path) -> None:
    w = Watcher()
    try:
        with pytest.raises(inotify.TargetGone, match="missing"):
            w.replace([Target(str(tmp_path / "missing"), "limit", 0)])
    finally:
        w.close()


# ---- errors through the binding's errno path ------------------------------------------------


class FakeFunction:
    """Stands for a libc function: sets ctypes' saved errno and returns -1 for each code in
    `errors`, then calls the real function."""

    def __init__(self, real: Callable[..., int], errors: list[int]) -> None:
        self.real = real
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, *args: object) -> int:
        self.calls += 1
        if self.errors:
            ctypes.set_errno(self.errors.pop(0))
            return -1
        return self.real(*args)


@pytest.fixture()
def libc() -> Iterator[inotify.Libc]:
    bound = inotify.Libc()
    with testdoor.bound_libc(bound):
        yield bound


@pytest.mark.parametrize(("code", "reason"), [
    (errno.ENOSPC, "inotify watch limit reached (watching "),
    (errno.ENOMEM, "inotify failed (watching "),
])
def test_add_watch_errno_becomes_the_reason(libc: inotify.Libc, tmp_path: Path, code: int,
                                            reason: str) -> None:
    libc.add_watch = FakeFunction(libc.add_watch, [code])
    w = Watcher()
    try:
        with pytest.raises(WatchUnavailable) as info:
            w.replace([Target(str(tmp_path), "dir", 1)])
        assert str(info.value).startswith(reason)
        if code == errno.ENOSPC:
            assert "fs.inotify.max_user_watches" in str(info.value)
        assert isinstance(info.value.__cause__, OSError)
        assert info.value.__cause__.errno == code
    finally:
        w.close()


@pytest.mark.parametrize(("code", "reason"), [
    (errno.EMFILE, "inotify instance limit reached (creating an instance; see "
                   "fs.inotify.max_user_instances)"),
    (errno.ENFILE, "inotify failed (creating an instance): "),
])
def test_init_errno_becomes_the_reason(libc: inotify.Libc, code: int, reason: str) -> None:
    libc.init1 = FakeFunction(libc.init1, [code])
    with pytest.raises(WatchUnavailable) as info:
        Watcher()
    assert str(info.value).startswith(reason)


def test_eintr_is_retried(libc: inotify.Libc, tmp_path: Path) -> None:
    libc.init1 = init1 = FakeFunction(libc.init1, [errno.EINTR, errno.EINTR])
    libc.add_watch = add = FakeFunction(libc.add_watch, [errno.EINTR])
    w = Watcher()
    try:
        w.replace([Target(str(tmp_path), "dir", 1)])
        assert (init1.calls, add.calls) == (3, 2)
    finally:
        w.close()


def test_no_inotify_in_the_c_library(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_symbol() -> inotify.Libc:
        raise AttributeError("undefined symbol: inotify_init1")

    monkeypatch.setattr(inotify, "Libc", no_symbol)
    with testdoor.bound_libc(None), \
            pytest.raises(WatchUnavailable, match="not available on this platform"):
        Watcher()


@pytest.mark.parametrize(("bound_first", "reason"), [
    (True, "inotify instance limit reached (creating an instance"),
    (False, "inotify failed (loading ctypes): Too many open files"),
])
def test_real_emfile_from_an_fd_starved_process(bound_first: bool, reason: str) -> None:
    """The kernel's own EMFILE: a child with every descriptor in use, the binding made before
    (inotify_init1 fails) or not yet (importing ctypes fails: it opens files)."""
    code = textwrap.dedent(f"""
        import os, resource
        from cgwatch import inotify
        if {bound_first}:
            inotify.libc()
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        held = []
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        try:
            inotify.Watcher()
        except inotify.WatchUnavailable as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.startswith(reason), out
