"""The fault matrix (issue 11): one file of a fake root at a time made missing, a FIFO, a
directory, a symlink loop, oversized, or given an odd value, and what the public queries answer.

Every case runs `Monitor(root)` in its own subprocess with a timeout, so a hang (a FIFO opened
for reading blocks until a writer appears) fails that case fast instead of the suite; two
children per CPU run at once. `python -m tests.test_faults` prints the matrix as a
Markdown table (case, answer, status reason).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

import pytest

from tests.fake_tree import FakeHost, GiB, MiB

TIMEOUT = 20.0  # seconds per case; a healthy case takes ~0.2 s
HOST_TOTAL = 64 * GiB
HOST_AVAILABLE = 60 * GiB
LEAF_LIMIT = 2 * GiB  # /a/b/c
PARENT_LIMIT = 4 * GiB  # /a/b
WORKING_SET = 90 * MiB  # FakeHost's default usage (100 MiB) minus inactive_file (10 MiB)
LEAF_ROOM = LEAF_LIMIT - WORKING_SET
PARENT_ROOM = PARENT_LIMIT - WORKING_SET
OVERSIZE = 5 * 1024 * 1024  # past both read bounds (64 KiB kept, 4 MiB read_file)

# The child: build a monitor on the fake root, ask every public query, print one JSON line.
# Warnings the monitor logs are collected too: the hot path's error path says why there.
CHILD = r"""
import json, logging, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("cgwatch").addHandler(Keep())
logging.getLogger("cgwatch").setLevel(logging.WARNING)
from cgwatch import Monitor
m = Monitor(sys.argv[1])
out = {"total": m.total_memory(), "available": m.available_memory(),
       "again": m.available_memory(), "mode": m.status.mode, "reason": m.status.reason,
       "host": list(m.host_memory()), "levels": len(m.levels())}
m.close()
out["log"] = records
print(json.dumps(out))
"""


def _leaf(host: FakeHost, name: str) -> str:
    return host.level_dir("/a/b/c") + "/" + name


def target_path(host: FakeHost, target: str) -> str:
    """The absolute (fake) path of a fault target."""
    v2 = host.version == 2
    return {
        "limit": _leaf(host, "memory.max" if v2 else "memory.limit_in_bytes"),
        "usage": _leaf(host, "memory.current" if v2 else "memory.usage_in_bytes"),
        "memory.stat": _leaf(host, "memory.stat"),
        "meminfo": "/proc/meminfo",
        "proc cgroup": "/proc/self/cgroup",
        "mountinfo": "/proc/self/mountinfo",
        "leaf dir": host.level_dir("/a/b/c"),
        "/proc/self": "/proc/self",
    }[target]


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _oversize(host: FakeHost, target: str, path: str) -> None:
    """The file's real content, then padding past the bounds; memory.stat and meminfo keep
    their key after the padding, so only a whole read could find it."""
    with open(path, "rb") as f:
        content = f.read()
    pad = b"".join(b"pad_%07d 0\n" % i for i in range(OVERSIZE // 14))
    if target in ("memory.stat", "meminfo"):
        data = pad + content
    elif target in ("limit", "usage"):
        data = content.rstrip(b"\n") + b" " * OVERSIZE + b"\n"
    else:
        data = content + pad
    with open(path, "wb") as f:
        f.write(data)


def apply_fault(host: FakeHost, target: str, fault: str) -> None:
    path = host.path(target_path(host, target))
    if fault == "missing":
        _remove(path)
    elif fault == "FIFO":
        _remove(path)
        os.mkfifo(path)
    elif fault == "directory":
        _remove(path)
        os.mkdir(path)
    elif fault == "symlink loop":
        _remove(path)
        os.symlink(os.path.basename(path), path)
    elif fault == "oversized":
        _oversize(host, target, path)
    elif fault == "file for directory":
        _remove(path)
        with open(path, "w") as f:
            f.write("not a directory\n")
    elif fault.startswith("value "):
        with open(path, "w") as f:
            f.write(json.loads(fault[len("value "):]))
    else:
        raise AssertionError(fault)


@dataclass(frozen=True)
class Case:
    version: int
    target: str
    fault: str
    total: Optional[int]  # None: the host's own figure (psutil's when meminfo is unusable)
    available: Optional[int]  # None: not above total (the host's, unknown here)
    why: tuple[str, ...]  # words the reason (status, else the log) must contain; () none
    xfail: str = ""

    @property
    def id(self) -> str:
        return f"v{self.version}-{self.target}-{self.fault}"


FILE_FAULTS = ("missing", "FIFO", "directory", "symlink loop", "oversized")
ODD_VALUES = ("max", "-1", "0", "18446744073709551615", " 123 ", "123\x00", "")


def _expect(version: int, target: str, fault: str) -> Case:
    """What each case must answer, and the words its reason must contain."""
    v2 = version == 2
    what = {"missing": "No such file", "FIFO": "FIFO", "directory": "directory",
            "symlink loop": "symbolic links", "oversized": "larger than",
            "file for directory": "not"}.get(fault, "")
    if target == "limit":
        if fault.startswith("value "):
            value = json.loads(fault[len("value "):])
            if value == " 123 ":
                return Case(version, target, fault, 123, 0, ())  # 123 B limit, 90 MiB used
            if value == "0":
                return Case(version, target, fault, 0, 0, ())
            if value == "max" and v2 or value == "18446744073709551615" and not v2:
                return Case(version, target, fault, PARENT_LIMIT, PARENT_ROOM, ())
            if value == "18446744073709551615":  # v2: a real (huge) limit, capped at MemTotal
                return Case(version, target, fault, PARENT_LIMIT, PARENT_ROOM, ())
            # Unreadable text: that level counts as unlimited, and the reason says so.
            return Case(version, target, fault, PARENT_LIMIT, PARENT_ROOM,
                        ("memory.", "/a/b/c"))
        if fault == "missing" and v2:
            # v2: no memory.max means the controller is not enabled there: no limit (docs).
            return Case(version, target, fault, PARENT_LIMIT, PARENT_ROOM, ())
        if fault == "missing":
            # Every v1 memory cgroup has memory.limit_in_bytes: missing is a reason.
            return Case(version, target, fault, PARENT_LIMIT, PARENT_ROOM, (what,))
        return Case(version, target, fault, PARENT_LIMIT, PARENT_ROOM, (what,))
    if target in ("usage", "memory.stat"):
        if fault.startswith("value "):
            value = json.loads(fault[len("value "):])
            if value in ("0", " 123 "):
                # usage below inactive_file (10 MiB): a working set of 0, the whole limit
                return Case(version, target, fault, LEAF_LIMIT, LEAF_LIMIT, ())
            if value == "-1":
                # int() takes "-1"; no kernel writes it: the level counts 0, and says why.
                return Case(version, target, fault, LEAF_LIMIT, 0, ("usage",))
            if value == "18446744073709551615":
                return Case(version, target, fault, LEAF_LIMIT, 0, ())
            return Case(version, target, fault, LEAF_LIMIT, 0, ("usage",))
        if target == "usage" and fault == "oversized":
            # The number, then padding: the hot path's 64-byte read holds the true value.
            return Case(version, target, fault, LEAF_LIMIT, LEAF_ROOM, ())
        if target == "memory.stat" and fault == "oversized":
            # inactive_file past the hot path's 16 KiB read: the level counts limit - usage
            # (never above the truth); only the log says why.
            return Case(version, target, fault, LEAF_LIMIT, LEAF_LIMIT - 100 * MiB,
                        ("missing from memory.stat",))
        # The leaf's usage cannot be read: never above its limit - usage bound; unknown usage
        # answers 0 at that level (issue 11 item 3).
        return Case(version, target, fault, LEAF_LIMIT,
                    0 if target == "usage" else LEAF_LIMIT - 100 * MiB, (what,))
    if target == "meminfo":
        # Host figures from psutil (the real host): the cgroup levels still bind.
        return Case(version, target, fault, LEAF_LIMIT, LEAF_ROOM, ("meminfo", what))
    if target in ("proc cgroup", "mountinfo", "/proc/self"):
        return Case(version, target, fault, HOST_TOTAL, HOST_AVAILABLE, (what,))
    if target == "leaf dir":
        return Case(version, target, fault, HOST_TOTAL, HOST_AVAILABLE, ("does not exist",))
    raise AssertionError(target)


def cases() -> list[Case]:
    made = []
    for version in (1, 2):
        for target in ("limit", "usage", "memory.stat", "meminfo", "proc cgroup", "mountinfo"):
            for fault in FILE_FAULTS:
                made.append(_expect(version, target, fault))
        for target in ("leaf dir", "/proc/self"):
            made.append(_expect(version, target, "file for directory"))
        for target in ("limit", "usage"):
            for value in ODD_VALUES:
                made.append(_expect(version, target, "value " + json.dumps(value)))
    return made


CASES = cases()


def build_host(root: str, case: Case) -> FakeHost:
    host = FakeHost(root, case.version)
    host.make_path({"/a": None, "/a/b": PARENT_LIMIT, "/a/b/c": LEAF_LIMIT})
    apply_fault(host, case.target, case.fault)
    return host


def _run_case(root: str, env: dict[str, str]) -> dict[str, Any]:
    try:
        # subprocess.run kills the child when the timeout expires.
        proc = subprocess.run([sys.executable, "-c", CHILD, root], capture_output=True,
                              text=True, env=env, timeout=TIMEOUT, start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"error": f"hung for more than {TIMEOUT} s"}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def run_all(base: str) -> dict[str, Any]:
    """Every case's child, a few at a time (two per CPU: each is mostly Python start-up)."""
    env = dict(os.environ, CGWATCH_THREAD="1")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    roots = {}
    for index, case in enumerate(CASES):
        roots[case.id] = os.path.join(base, str(index))
        build_host(roots[case.id], case)
    with ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 1)) as pool:
        futures = {case_id: pool.submit(_run_case, root, env) for case_id, root in roots.items()}
        return {case_id: future.result() for case_id, future in futures.items()}


@pytest.fixture(scope="module")
def matrix() -> Iterator[dict[str, Any]]:
    base = tempfile.mkdtemp(prefix="cgwatch-faults-")
    try:
        yield run_all(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _params() -> list[Any]:
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)]
                         if c.xfail else []) for c in CASES]


@pytest.mark.parametrize("case", _params())
def test_fault(case: Case, matrix: dict[str, Any]) -> None:
    got = matrix[case.id]
    assert "error" not in got, got.get("error")
    host_total, host_available = got["host"]
    # Whatever the fault: nothing escapes, and 0 <= available <= total <= host MemTotal.
    assert 0 <= got["available"] <= got["total"] <= host_total
    assert 0 <= got["again"] <= got["total"]
    expected_total = host_total if case.total is None else case.total
    assert got["total"] == min(expected_total, host_total)
    if case.available is not None:
        assert got["available"] == min(case.available, host_available, got["total"])
    said = got["reason"] + " | " + " ".join(got["log"])
    for word in case.why:
        assert word in said, f"{word!r} not in {said!r}"


def markdown(results: dict[str, Any]) -> str:
    rows = ["| case | total | available | status.reason (or log) |", "|---|---|---|---|"]
    for case in CASES:
        got = results[case.id]
        if "error" in got:
            rows.append(f"| {case.id} | - | - | {got['error']} |")
            continue
        said = got["reason"] or (" / ".join(got["log"]) and "log: " + " / ".join(got["log"]))
        rows.append(f"| {case.id!r} | {_size(got['total'])} | {_size(got['available'])} | "
                    f"{said.replace('|', '/')[:160]} |")
    return "\n".join(rows)


def _size(n: int) -> str:
    return f"{n / GiB:.3f} GiB" if n >= MiB else f"{n} B"


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="cgwatch-faults-") as tmp:
        print(markdown(run_all(tmp)))


# ---- the I/O edges themselves: writes never follow links, reads are bounded ---------------------


def _victim(tmp: str) -> str:
    victim = os.path.join(tmp, "victim")
    with open(victim, "w") as f:
        f.write("precious\n")
    return victim


def test_event_control_write_does_not_follow_a_link(tmp_path: Any) -> None:
    from cgwatch import notify

    cgroup = str(tmp_path)
    victim = _victim(cgroup)
    with open(os.path.join(cgroup, "memory.oom_control"), "w") as f:
        f.write("oom_kill_disable 0\n")
    os.symlink(victim, os.path.join(cgroup, "cgroup.event_control"))
    with pytest.raises(OSError) as raised:
        notify.register_v1(cgroup, "memory.oom_control")
    assert raised.value.errno == errno.ELOOP
    with open(victim) as f:
        assert f.read() == "precious\n"


def test_pressure_trigger_does_not_follow_a_link(tmp_path: Any) -> None:
    from cgwatch import notify

    victim = _victim(str(tmp_path))
    os.symlink(victim, os.path.join(str(tmp_path), "memory.pressure"))
    with pytest.raises(OSError) as raised:
        notify.psi_trigger(str(tmp_path), "some 100000 1000000")
    assert raised.value.errno == errno.ELOOP
    with open(victim) as f:
        assert f.read() == "precious\n"


def test_control_files_are_never_created(tmp_path: Any) -> None:
    from cgwatch import notify

    with open(os.path.join(str(tmp_path), "memory.oom_control"), "w") as f:
        f.write("oom_kill_disable 0\n")
    with pytest.raises(FileNotFoundError):
        notify.register_v1(str(tmp_path), "memory.oom_control")
    with pytest.raises(FileNotFoundError):
        notify.psi_trigger(str(tmp_path), "some 100000 1000000")
    assert sorted(os.listdir(str(tmp_path))) == ["memory.oom_control"]


def test_reads_are_bounded_and_say_so(tmp_path: Any) -> None:
    from cgwatch import files, kept

    big = os.path.join(str(tmp_path), "memory.stat")
    with open(big, "wb") as f:
        f.write(b"x" * (files.KEPT_READ_LIMIT + files.READ_SIZE + 1))
    with pytest.raises(OSError) as raised:
        kept.KeptDir(str(tmp_path), None).read("memory.stat")
    assert raised.value.errno == errno.EFBIG and raised.value.filename == big
    with open(big, "wb") as f:
        f.write(b"y" * (files.FILE_READ_LIMIT + 1))
    with pytest.raises(OSError) as raised:
        files.read_file(big)
    assert raised.value.errno == errno.EFBIG and "larger than 4096 KiB" in str(raised.value)
    with open(big, "wb") as f:
        f.write(b"z" * files.FILE_READ_LIMIT)  # exactly the bound is still read
    assert len(files.read_file(big)) == files.FILE_READ_LIMIT


@pytest.mark.parametrize("kind", ["FIFO", "directory"])
def test_open_regular_refuses_what_is_not_a_file(tmp_path: Any, kind: str) -> None:
    from cgwatch import files

    path = os.path.join(str(tmp_path), "memory.max")
    if kind == "FIFO":
        os.mkfifo(path)
    else:
        os.mkdir(path)
    with pytest.raises(OSError, match=kind):  # O_NONBLOCK: a FIFO does not block the open
        files.open_regular(path)


@pytest.mark.parametrize("refusal, widened", [
    (errno.EINVAL, True),  # 6.4+ and Debian's 6.1.0-57 without CAP_SYS_RESOURCE
    (errno.EPERM, True),
    (errno.EBUSY, False),  # anything else is not about the window
])
def test_pressure_trigger_widens_a_window_the_unprivileged_may_not_use(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, refusal: int, widened: bool) -> None:
    """The kernel's refusal of a 1 s window is replayed on a plain file: the first trigger
    written is refused, the widened one (2 s, the same stall share) is what lands."""
    from cgwatch import notify

    pressure = os.path.join(str(tmp_path), "memory.pressure")
    with open(pressure, "w"):
        pass
    written: list[bytes] = []
    real_write = os.write

    def kernel_write(fd: int, data: bytes) -> int:
        written.append(data)
        if data == b"some 100000 1000000\0":
            raise OSError(refusal, os.strerror(refusal))
        return real_write(fd, data)

    monkeypatch.setattr(notify.os, "write", kernel_write)
    if widened:
        fd = notify.psi_trigger(str(tmp_path), "some 100000 1000000")
        os.close(fd)
        assert written == [b"some 100000 1000000\0", b"some 200000 2000000\0"]
    else:
        with pytest.raises(OSError) as raised:
            notify.psi_trigger(str(tmp_path), "some 100000 1000000")
        assert raised.value.errno == refusal
        assert written == [b"some 100000 1000000\0"]
