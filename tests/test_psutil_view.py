"""cgwatch.psutil_view: psutil's own named tuple with cgroup-aware totals, and the opt-in
patch of psutil.virtual_memory."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import psutil
import pytest

from cgwatch import hostmem, psutil_view, testdoor
from cgwatch.integrations import switches
from cgwatch.psutil_view import (
    is_patched,
    patch_psutil,
    patched_psutil,
    unpatch_psutil,
    virtual_memory,
)
from tests.cgroup_helpers import MiB, cgroup_tree, writable_reason

ORIGINAL = psutil.virtual_memory
LINUX = sys.platform.startswith("linux")


class FakeMonitor:
    """Answers fixed values where the view expects a cgwatch.Monitor."""

    def __init__(self, total: int, available: int) -> None:
        self.total, self.available = total, available
        self.calls = 0

    def total_memory(self) -> int:
        self.calls += 1
        return self.total

    def available_memory(self) -> int:
        return self.available


@pytest.fixture(autouse=True)
def restore_psutil() -> Iterator[None]:
    yield
    unpatch_psutil()
    # A test that wraps psutil on top of ours leaves our patch in the chain: reset by hand.
    testdoor.reset_psutil_view(ORIGINAL)


@pytest.fixture
def procfs(tmp_path: Path) -> Iterator[Path]:
    """A directory psutil (psutil.PROCFS_PATH) and the view read meminfo from instead of /proc:
    both then see the same fixed text."""
    saved = psutil.PROCFS_PATH
    psutil.PROCFS_PATH = str(tmp_path)
    testdoor.new_psutil_fast_path()
    try:
        yield tmp_path
    finally:
        psutil.PROCFS_PATH = saved
        testdoor.new_psutil_fast_path()


def test_same_type_and_fields_as_psutil_each_typed_as_psutils() -> None:
    host = psutil.virtual_memory()
    view = virtual_memory()
    assert type(view) is type(host)
    assert view._fields == host._fields
    for name in host._fields:
        assert type(getattr(view, name)) is type(getattr(host, name)), name
    assert isinstance(view.percent, float)


def test_fields_derived_from_the_cgroup_values(procfs: Path) -> None:
    # A fixed meminfo: the live host's MemFree moves between two reads (and on a loaded host
    # it can be below the 2000 MiB the view caps it at), so `free` is checked on known text.
    (procfs / "meminfo").write_text(MEMINFO_2_6_32)
    host = psutil.virtual_memory()
    view = virtual_memory(FakeMonitor(total=8000 * MiB, available=2000 * MiB))
    assert view.total == 8000 * MiB
    assert view.available == 2000 * MiB
    assert view.percent == 75.0
    if LINUX:
        assert view.used == 6000 * MiB
        assert host.free == 254536 * 1024  # psutil read the same fixed text
    assert view.free == min(host.free, 2000 * MiB)  # MemFree, below the 2000 MiB available
    low = virtual_memory(FakeMonitor(total=8000 * MiB, available=200 * MiB))
    assert low.free == min(host.free, 200 * MiB)  # the view's available, below MemFree
    # Host-wide counters pass through untouched.
    for name in set(host._fields) - {"total", "available", "percent", "used", "free"}:
        assert getattr(view, name) >= 0


def test_available_never_above_total_and_zero_total() -> None:
    view = virtual_memory(FakeMonitor(total=100, available=500))
    assert (view.total, view.available, view.percent) == (100, 100, 0.0)
    view = virtual_memory(FakeMonitor(total=0, available=0))
    assert (view.total, view.available, view.percent, view.free) == (0, 0, 0.0, 0)


def test_percent_rounded_like_psutil() -> None:
    view = virtual_memory(FakeMonitor(total=3, available=1))
    assert view.percent == 66.7


def test_patch_and_unpatch() -> None:
    fake = FakeMonitor(total=123 * MiB, available=45 * MiB)
    assert not is_patched()
    assert patch_psutil(fake) is True
    assert is_patched()
    assert psutil.virtual_memory().total == 123 * MiB
    assert psutil.virtual_memory.__wrapped__ is ORIGINAL  # type: ignore[attr-defined]
    assert patch_psutil(FakeMonitor(1, 1)) is False  # idempotent: first monitor stays
    assert psutil.virtual_memory().total == 123 * MiB
    assert unpatch_psutil() is True
    assert psutil.virtual_memory is ORIGINAL
    assert unpatch_psutil() is False
    assert psutil.virtual_memory().total == ORIGINAL().total


def test_context_manager_nests() -> None:
    fake = FakeMonitor(total=64 * MiB, available=32 * MiB)
    with patched_psutil(fake):
        with patched_psutil():
            assert psutil.virtual_memory().total == 64 * MiB
        assert is_patched()  # the inner block did not install it, so it does not remove it
    assert psutil.virtual_memory is ORIGINAL


def test_context_manager_unpatches_on_error() -> None:
    with pytest.raises(RuntimeError), patched_psutil(FakeMonitor(1, 1)):
        raise RuntimeError("boom")
    assert psutil.virtual_memory is ORIGINAL


def test_no_recursion_when_the_monitor_itself_asks_psutil() -> None:
    """cgwatch falls back to psutil for host figures where /proc/meminfo is unusable; with
    the patch on, that inner call must get psutil's own answer."""

    class AsksPsutil(FakeMonitor):
        def total_memory(self) -> int:
            return min(psutil.virtual_memory().total, 77 * MiB)

    with patched_psutil(AsksPsutil(0, 10 * MiB)):
        assert psutil.virtual_memory().total == 77 * MiB


def test_someone_elses_wrapper_on_top_is_left_in_place() -> None:
    patch_psutil(FakeMonitor(total=5 * MiB, available=1 * MiB))
    ours = psutil.virtual_memory

    def theirs() -> Any:
        return ours()

    psutil.virtual_memory = theirs
    assert unpatch_psutil() is False
    assert psutil.virtual_memory is theirs
    assert psutil.virtual_memory().total == 5 * MiB  # still answers, no recursion
    assert patch_psutil() is False  # ours is still in the chain: not stacked twice
    assert psutil.virtual_memory().total == 5 * MiB


def test_module_does_not_keep_a_stale_original() -> None:
    assert testdoor.psutil_replaced() is None
    with patched_psutil(FakeMonitor(1, 1)):
        assert testdoor.psutil_replaced() is ORIGINAL
    assert testdoor.psutil_replaced() is None


CHILD = textwrap.dedent("""
    import json, psutil, cgwatch
    from cgwatch.psutil_view import virtual_memory, patched_psutil

    monitor = cgwatch.default_monitor()
    ballast = bytearray(64 << 20)  # charge some anonymous memory to the cgroup

    def same_moment(read):
        for _ in range(200):
            a1 = monitor.available_memory()
            view = read()
            a2 = monitor.available_memory()
            # live figures: a page charged between two reads moves them, so keep the try
            # where none moved, the view's answer included
            if a1 == view.available == a2:
                break
        return dict(view._asdict()), [a1, a2], type(view).__name__

    view, avail, name = same_moment(virtual_memory)
    with patched_psutil():
        patched, patched_avail, _ = same_moment(psutil.virtual_memory)
    host = psutil.virtual_memory()
    print("RESULT " + json.dumps(dict(
        view=view, avail=avail, patched=patched, patched_avail=patched_avail,
        total=monitor.total_memory(), mode=monitor.status.mode, type_name=name,
        host_type_name=type(host).__name__, host_total=host.total)))
""")


@pytest.mark.realkernel
def test_in_a_limited_cgroup_total_and_available_equal_the_monitors() -> None:
    why = writable_reason()
    if why:
        pytest.skip(f"needs a writable memory cgroup: {why}")
    limit = 256 * MiB
    with cgroup_tree() as tree:
        cg = tree.make("psutil-view", limit=limit)
        proc = tree.spawn(cg, CHILD)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out + err
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["type_name"] == r["host_type_name"] == "svmem"
    assert r["total"] == limit < r["host_total"]
    for view, (a1, a2) in ((r["view"], r["avail"]), (r["patched"], r["patched_avail"])):
        assert view["total"] == r["total"]
        assert view["available"] == a1 == a2
        assert 0 < view["available"] < limit - 64 * MiB  # the ballast counts
        assert view["percent"] == round((limit - view["available"]) / limit * 100, 1)
        assert view["used"] == limit - view["available"]
        assert view["free"] <= view["available"]


# --- the fast construction: psutil's host counters from one meminfo read ---------------------

MEMINFO_6_18 = textwrap.dedent("""\
    MemTotal:       24684084 kB
    MemFree:        23328236 kB
    MemAvailable:   23977328 kB
    Buffers:           35516 kB
    Cached:           787740 kB
    SwapCached:            0 kB
    Active:           365868 kB
    Inactive:         750172 kB
    Active(anon):       1572 kB
    Inactive(anon):   300084 kB
    Active(file):     364296 kB
    Inactive(file):   450088 kB
    Unevictable:       15884 kB
    Mlocked:           15020 kB
    SwapTotal:             0 kB
    SwapFree:              0 kB
    Zswap:                 0 kB
    Zswapped:              0 kB
    Dirty:              1252 kB
    Writeback:             0 kB
    AnonPages:        308668 kB
    Mapped:           105248 kB
    Shmem:              8872 kB
    KReclaimable:      93024 kB
    Slab:             120008 kB
    SReclaimable:      93024 kB
    SUnreclaim:        26984 kB
    KernelStack:        1892 kB
    PageTables:         3464 kB
    SecPageTables:         0 kB
    NFS_Unstable:          0 kB
    Bounce:                0 kB
    WritebackTmp:          0 kB
    CommitLimit:    12342040 kB
    Committed_AS:    2454856 kB
    VmallocTotal:   34359738367 kB
    VmallocUsed:       14668 kB
    VmallocChunk:          0 kB
    Percpu:              832 kB
    AnonHugePages:    204800 kB
    ShmemHugePages:        0 kB
    ShmemPmdMapped:        0 kB
    FileHugePages:         0 kB
    FilePmdMapped:         0 kB
    Balloon:               0 kB
    HugePages_Total:       0
    HugePages_Free:        0
    HugePages_Rsvd:        0
    HugePages_Surp:        0
    Hugepagesize:       2048 kB
    Hugetlb:               0 kB
    DirectMap4k:       26624 kB
    DirectMap2M:     2070528 kB
    DirectMap1G:    25165824 kB
""")  # this machine, kernel 6.18.44 (cgroup v1 host)

# Shaped like a 2.6.32 kernel's (CentOS 6): no MemAvailable (3.14 added it), Shmem and
# SReclaimable present. psutil computes `available` itself there; the view replaces it anyway.
MEMINFO_2_6_32 = textwrap.dedent("""\
    MemTotal:        1922680 kB
    MemFree:          254536 kB
    Buffers:          172300 kB
    Cached:          1100344 kB
    SwapCached:         1020 kB
    Active:           901724 kB
    Inactive:         553452 kB
    Active(anon):     110172 kB
    Inactive(anon):    74972 kB
    Active(file):     791552 kB
    Inactive(file):   478480 kB
    Unevictable:           0 kB
    Mlocked:               0 kB
    SwapTotal:       4128764 kB
    SwapFree:        4120008 kB
    Dirty:                64 kB
    Writeback:             0 kB
    AnonPages:        181632 kB
    Mapped:            29588 kB
    Shmem:              2612 kB
    Slab:             158704 kB
    SReclaimable:     134084 kB
    SUnreclaim:        24620 kB
    KernelStack:        1480 kB
    PageTables:         6460 kB
    HugePages_Total:       0
    HugePages_Free:        0
    Hugepagesize:       2048 kB
""")

# Shaped like a kernel before 2.6.32 (no Shmem line): psutil warns and reports shared=0, so
# the fast path declines and psutil's own function answers.
MEMINFO_NO_SHMEM = "\n".join(line for line in MEMINFO_2_6_32.splitlines()
                              if not line.startswith("Shmem:")) + "\n"

HOST_COUNTERS = ("free", "active", "inactive", "buffers", "cached", "shared", "slab")


@pytest.mark.skipif(not LINUX, reason="psutil's Linux meminfo parser")
@pytest.mark.parametrize("text", [MEMINFO_6_18, MEMINFO_2_6_32], ids=["6.18", "2.6.32"])
def test_host_counters_equal_psutils_on_the_same_meminfo(procfs: Path, text: str) -> None:
    (procfs / "meminfo").write_text(text)
    theirs = psutil._psplatform.virtual_memory()  # type: ignore[attr-defined]
    ours = psutil_view.host_counters(text.encode())
    assert ours is not None
    assert ours == {name: getattr(theirs, name) for name in HOST_COUNTERS}
    # And the view built from them: psutil's tuple, every host field psutil's, exactly.
    view = virtual_memory(FakeMonitor(total=512 * MiB, available=100 * MiB))
    assert type(view) is type(theirs)
    assert testdoor.psutil_fast_path().usable  # it was the fast construction
    for name in HOST_COUNTERS[1:]:
        assert getattr(view, name) == getattr(theirs, name), name
    assert view.free == min(theirs.free, 100 * MiB)
    assert (view.total, view.available, view.used, view.percent) == (
        512 * MiB, 100 * MiB, 412 * MiB, 80.5)


@pytest.mark.parametrize("text", [
    MEMINFO_NO_SHMEM,
    "",
    MEMINFO_2_6_32.replace("Active:           901724 kB", "Active:           garbage kB"),
    MEMINFO_2_6_32.replace("Cached:          1100344 kB\n", ""),  # SwapCached must not match
], ids=["no-shmem", "empty", "garbage", "only-swapcached"])
def test_host_counters_decline_what_the_fast_path_cannot_read(text: str) -> None:
    assert psutil_view.host_counters(text.encode()) is None


@pytest.mark.skipif(not LINUX, reason="psutil's Linux meminfo parser")
def test_a_meminfo_without_shmem_falls_back_to_psutils_own_answer(procfs: Path) -> None:
    (procfs / "meminfo").write_text(MEMINFO_NO_SHMEM)
    with pytest.warns(RuntimeWarning, match="shared"):  # psutil's own warning, passed on
        view = virtual_memory(FakeMonitor(total=256 * MiB, available=64 * MiB))
    assert not testdoor.psutil_fast_path().usable
    assert (view.total, view.available, view.shared) == (256 * MiB, 64 * MiB, 0)
    assert view.active == 901724 * 1024


@pytest.mark.skipif(not LINUX, reason="Linux fast path")
def test_fast_path_answers_the_same_as_psutils_own_plus_cgwatch() -> None:
    """On the real /proc: the fast construction and the psutil-then-replace one agree on every
    field that does not move between two reads (the layout and the cgroup's figures)."""
    monitor = FakeMonitor(total=300 * MiB, available=200 * MiB)
    fast = virtual_memory(monitor)
    assert testdoor.psutil_fast_path().usable
    testdoor.psutil_fast_path().usable = False
    slow = virtual_memory(monitor)
    assert type(fast) is type(slow)
    for name in ("total", "available", "percent", "used"):
        assert getattr(fast, name) == getattr(slow, name), name
    assert 0 <= fast.free <= 200 * MiB and 0 <= slow.free <= 200 * MiB


# --- psutil is imported only where it is needed ----------------------------------------------


REPO = Path(__file__).resolve().parents[1]


def run_python(code: str, env: Optional[dict[str, str]] = None, *args: str) -> str:
    out = subprocess.run([sys.executable, *args, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs /proc/meminfo")
def test_import_cgwatch_and_both_queries_do_not_import_psutil() -> None:
    out = run_python("import sys, cgwatch\n"
                     "assert cgwatch.total_memory() > 0 and cgwatch.available_memory() > 0\n"
                     "print(sorted(m for m in sys.modules if m.split('.')[0] == 'psutil'))")
    assert out.strip() == "[]"


def test_hostmem_fallback_asks_psutils_own_function_even_under_the_patch(
        tmp_path: Path) -> None:
    """Without a meminfo the host figures come from psutil: its platform function, so the
    patched psutil.virtual_memory (which calls back into cgwatch) is never what answers."""
    with patched_psutil(FakeMonitor(total=7 * MiB, available=3 * MiB)):
        assert psutil.virtual_memory().total == 7 * MiB
        host = hostmem.HostMemory(root=str(tmp_path))
        assert host.source == "psutil" and "host values from psutil" in host.reason
        assert host.total == ORIGINAL().total != 7 * MiB
        assert host.available() > 7 * MiB


# --- the CGWATCH_PSUTIL switch (the .pth hook) -----------------------------------------------

# The children start with -S (no site-packages .pth runs, whatever this environment has
# installed), find psutil on a plain sys.path entry and cgwatch in the checkout (their cwd),
# then site.addsitedir() runs the tmp dir's .pth as interpreter start does for site-packages.
ISOLATED = "import os, sys; sys.path.append(os.environ['PURELIB'])\n"
SWITCH_CHILD = ISOLATED + textwrap.dedent("""
    import json, os, site, sys
    meta_before = len(sys.meta_path)
    site.addsitedir(os.environ["SITE_DIR"])
    loaded = lambda: sorted(m for m in sys.modules
                            if m.split(".")[0] in ("cgwatch", "psutil", "torch", "deepspeed"))
    at_start = loaded()
    hooks = len(sys.meta_path) - meta_before
    import psutil
    after_import = loaded()
    from psutil import virtual_memory as bound_early
    vm = psutil.virtual_memory()
    early = bound_early()
    import cgwatch
    from cgwatch import psutil_view, testdoor
    print("RESULT " + json.dumps(dict(
        at_start=at_start, hooks=hooks, after_import=after_import,
        total=vm.total, early_total=early.total, cgwatch_total=cgwatch.total_memory(),
        host_total=testdoor.psutil_host().total, patched=psutil_view.is_patched(),
        hooks_left=sum(type(f).__name__ == "PostImportFinder" for f in sys.meta_path))))
""")


# What the .pth line loads by path when a switch is on (switches._BOOT).
HOOK_FILES = ["cgwatch.envswitch", "cgwatch.integrations._autoload"]


@pytest.fixture
def site_dir(tmp_path: Path) -> Path:
    (tmp_path / "site").mkdir()
    path = Path(switches.install_pth(str(tmp_path / "site")))
    assert path.name == "cgwatch-autoload.pth"
    return path.parent


def child_env(site_dir: Path, **switch: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGWATCH")}
    purelib = os.path.dirname(os.path.dirname(psutil.__file__))
    return {**env, "SITE_DIR": str(site_dir), "PURELIB": purelib, **switch}


def result(out: str) -> Any:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out
    return json.loads(lines[-1][len("RESULT "):])


def test_install_pth_writes_one_line_and_replaces_the_old_deepspeed_one(tmp_path: Path) -> None:
    old = tmp_path / "cgwatch-deepspeed.pth"
    old.write_text("import os\n")
    out = subprocess.run([sys.executable, "-m", "cgwatch.integrations", "install-pth",
                          "--dir", str(tmp_path)], capture_output=True, text=True, check=True)
    path = tmp_path / "cgwatch-autoload.pth"
    assert out.stdout.strip() == str(path)
    assert not old.exists()
    text = path.read_text()
    assert text.count("\n") == 1 and text.startswith("import os;")  # site.py runs it
    assert switches.switch_status(str(tmp_path))["pth_current"]
    assert switches.uninstall_pth(str(tmp_path)) and not path.exists()
    assert not switches.uninstall_pth(str(tmp_path))


@pytest.mark.parametrize("value", ["", "0", "off"])
def test_switch_off_loads_nothing(site_dir: Path, value: str) -> None:
    r = result(run_python(SWITCH_CHILD, child_env(site_dir, CGWATCH_PSUTIL=value), "-S"))
    assert r["at_start"] == [] and r["hooks"] == 0
    assert r["after_import"] == ["psutil"] + sorted(
        m for m in r["after_import"] if m.startswith("psutil."))
    assert not r["patched"]
    assert r["total"] == r["host_total"]


def test_switch_on_defers_everything_to_the_first_call(site_dir: Path) -> None:
    r = result(run_python(SWITCH_CHILD, child_env(site_dir, CGWATCH_PSUTIL="1"), "-S"))
    # At start only the hook's two stdlib-only files, no cgwatch package, psutil, torch or
    # DeepSpeed.
    assert r["at_start"] == HOOK_FILES and r["hooks"] == 1
    # `import psutil` alone still imports no cgwatch.
    assert not [m for m in r["after_import"] if m.split(".")[0] == "cgwatch"
                and m not in HOOK_FILES]
    assert r["patched"]
    assert r["total"] == r["early_total"] == r["cgwatch_total"]  # also `from psutil import`
    assert r["hooks_left"] == 0  # the finder left sys.meta_path once psutil had loaded


def test_switch_and_patch_psutil_agree(site_dir: Path) -> None:
    code = ISOLATED + textwrap.dedent("""
        import json, os, site
        site.addsitedir(os.environ["SITE_DIR"])
        import psutil
        from cgwatch import psutil_view
        real = psutil.virtual_memory.__wrapped__
        first = psutil_view.patch_psutil()  # the switch's patch is in place already
        undone = psutil_view.unpatch_psutil()
        print("RESULT " + json.dumps(dict(
            first=first, undone=undone, restored=psutil.virtual_memory is real,
            patched_after=psutil_view.is_patched())))
    """)
    r = result(run_python(code, child_env(site_dir, CGWATCH_PSUTIL="yes"), "-S"))
    assert r == {"first": False, "undone": True, "restored": True, "patched_after": False}


def test_a_broken_hook_is_one_line_and_python_still_starts(site_dir: Path,
                                                         tmp_path: Path) -> None:
    """The .pth runs where cgwatch cannot be imported (a removed or moved cgwatch): one line
    on stderr, and psutil works as its authors made it."""
    code = ("import os, site, sys\n"
            "site.addsitedir(os.environ['SITE_DIR'])\n"  # before cgwatch is importable
            "sys.path.append(os.environ['PURELIB'])\n"
            "import psutil\n"
            "print(psutil.virtual_memory().total == psutil._psplatform.virtual_memory().total,"
            " 'cgwatch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env=child_env(site_dir, CGWATCH_PSUTIL="1"), timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]
    assert out.stderr.strip().splitlines() == [
        "cgwatch: CGWATCH_PSUTIL/CGWATCH_DEEPSPEED ignored: ImportError: the cgwatch package "
        "is not importable"]


SWITCH_IN_CGROUP = textwrap.dedent("""
    import json, os, site
    site.addsitedir(os.environ["SITE_DIR"])
    import psutil
    vm = psutil.virtual_memory()
    print("RESULT " + json.dumps(dict(total=vm.total, available=vm.available)))
""")


@pytest.mark.realkernel
def test_switch_in_a_limited_cgroup_answers_the_limit(site_dir: Path) -> None:
    why = writable_reason()
    if why:
        pytest.skip(f"needs a writable memory cgroup: {why}")
    limit = 192 * MiB
    with cgroup_tree() as tree:
        cg = tree.make("psutil-switch", limit=limit)
        results = {}
        for value in ("1", "0"):
            proc = tree.spawn(cg, SWITCH_IN_CGROUP, env=child_env(site_dir, CGWATCH_PSUTIL=value))
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            results[value] = result(out)
    assert results["1"]["total"] == limit
    assert 0 < results["1"]["available"] <= limit
    assert results["0"]["total"] == ORIGINAL().total > limit


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None,
                    reason="DeepSpeed is importable here: check prints its report")
def test_integrations_check_without_deepspeed_is_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "cgwatch.integrations", "check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("cgwatch: cannot check DeepSpeed: No module named 'deepspeed'")
    assert out.stderr.count("\n") == 1
