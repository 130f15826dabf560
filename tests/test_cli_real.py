"""`cgwatch run` against the real kernel: a child that dies of SIGBUS on a full 16 MiB
/dev/shm (a private mount namespace, as Docker's 64 MiB default would), directly and
DataLoader-style (a worker dies, the main process fails), and the oom_score_adj it leaves
itself. Root only (mount namespace, lowering oom_score_adj)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Any

import pytest

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespace, "
                                "oom_score_adj below 0)")

FILL = """
import mmap, os, sys
fd = os.open("/dev/shm/" + sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 32 << 20)  # twice the tmpfs: touching the pages past 16 MiB raises SIGBUS
m = mmap.mmap(fd, 32 << 20)
for offset in range(0, 32 << 20, 4096):
    m[offset] = 1
print("not reached")
"""

# The main process starts a worker that maps the next batch into /dev/shm and dies of SIGBUS;
# the main process reports it as PyTorch's DataLoader does and exits 1.
DATALOADER = """
import signal, subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], "torch_worker_batch"])
if worker.wait() == -signal.SIGBUS:
    print(f"RuntimeError: DataLoader worker (pid {worker.pid}) is killed by signal: Bus error",
          file=sys.stderr)
    sys.exit(1)
"""


def in_small_shm(*cmd: str) -> subprocess.CompletedProcess[str]:
    """`cmd` in a private mount namespace whose /dev/shm is a fresh 16 MiB tmpfs: gone with
    the namespace when its last process exits (nothing to unmount on the host)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare (util-linux)")
    script = ('mount -t tmpfs -o size=16m cgwatch-test-shm /dev/shm || exit 99; exec "$@"')
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           script, "sh", *cmd], capture_output=True, text=True, cwd=PROJECT,
                          timeout=300, start_new_session=True)
    if proc.returncode == 99 or "unshare failed" in proc.stderr:
        pytest.skip(f"no private mount namespace here: {proc.stderr.strip()}")
    return proc


def flat(err: str) -> str:
    return " ".join(" ".join(line.removeprefix("cgwatch:") for line in err.splitlines()).split())


def test_sigbus_on_a_full_dev_shm_is_explained() -> None:
    proc = in_small_shm(sys.executable, "-m", "cgwatch", "run", "--", sys.executable, "-c",
                        FILL, "batch")
    assert proc.returncode == 128 + signal.SIGBUS, proc.stderr
    assert "not reached" not in proc.stdout
    text = flat(proc.stderr)
    assert "died of SIGBUS (exit status 135) while /dev/shm was 100% full" in text
    assert "16.0 MiB of 16.0 MiB" in text
    assert "docker run --shm-size" in text and "emptyDir with medium: Memory" in text
    # the host's /dev/shm was not touched
    assert not os.path.exists("/dev/shm/batch")


def test_dataloader_style_failure_is_explained_in_json(tmp_path: Any) -> None:
    report = tmp_path / "report.json"
    proc = in_small_shm(sys.executable, "-m", "cgwatch", "run", "--report", str(report), "--",
                        sys.executable, "-c", DATALOADER, FILL)
    assert proc.returncode == 1, proc.stderr
    assert "DataLoader worker" in proc.stderr
    text = flat(proc.stderr)
    assert "failed (exit status 1) while /dev/shm was 100% full" in text
    data = json.loads(report.read_text())
    assert data["exit_status"] == 1 and data["dev_shm"]["peak"]["size"] == 16 * (1 << 20)
    assert data["dev_shm"]["peak"]["percent_used"] == 100.0
    assert any("SIGBUS" in line for line in data["explanation"])


def _may_lower_oom_score_adj() -> bool:
    """CAP_SYS_RESOURCE (lowering oom_score_adj below its minimum) is not always given to
    root: this machine's sandbox drops it (CapEff without bit 24; the write fails with EIO)."""
    probe = subprocess.run(["sh", "-c", "echo -1 > /proc/self/oom_score_adj"],
                           capture_output=True, timeout=60)
    return probe.returncode == 0


WATCH_SCORE = """
import os, sys, time
path = "/proc/%d/oom_score_adj" % os.getppid()
deadline = time.monotonic() + float(sys.argv[1])
value = open(path).read().strip()
while value != sys.argv[2] and time.monotonic() < deadline:
    time.sleep(0.02)
    value = open(path).read().strip()
print(value)
"""


def start_at(value: int) -> Any:
    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(value))
    return preexec


@pytest.mark.parametrize("start, wait, expected, needs_cap", [
    (0, 60.0, "-500", True),      # lowered once CMD runs (a bound: it returns when seen;
    (200, 60.0, "-500", True),    # the VM tier's emulation on a loaded host is slow)
    (-900, 1.0, "-900", True),    # never raised (the old code wrote -500 whatever it found)
    (-1000, 1.0, "-1000", True),
    (200, 1.0, "200", False),     # not allowed to lower: unchanged, and nothing said
])
def test_run_only_lowers_its_own_oom_score_adj(start: int, wait: float, expected: str,
                                               needs_cap: bool) -> None:
    if needs_cap != _may_lower_oom_score_adj():
        pytest.skip("needs CAP_SYS_RESOURCE" if needs_cap else "for a root without "
                    "CAP_SYS_RESOURCE")
    # wait: the child polls until it sees `expected`; for a value that must not change it
    # looks for a value it must not see (the old -500) for `wait` seconds.
    look_for = expected if expected == "-500" else "-500"
    proc = subprocess.run([sys.executable, "-m", "cgwatch", "run", "--", sys.executable, "-c",
                           WATCH_SCORE, str(wait), look_for], capture_output=True, text=True,
                          cwd=PROJECT, timeout=180, preexec_fn=start_at(start))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == expected
    assert proc.stderr == ""


def shm_line(pattern: str, line: str) -> tuple[float, float]:
    """(percent, used) read from a `cgwatch watch` /dev/shm line that must match `pattern`."""
    match = re.search(pattern, line)
    assert match, line
    return float(match.group(1)), float(match.group(2))


def test_watch_warns_when_dev_shm_fills() -> None:
    """`cgwatch watch --shm-above 50` on a 16 MiB /dev/shm: shown at start (smaller than the
    available memory), a WARNING once 12 MiB are written, INFO once they are removed."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare (util-linux)")
    script = ('mount -t tmpfs -o size=16m cgwatch-test-shm /dev/shm || exit 99; '
              f'exec {sys.executable} -m cgwatch watch --interval 0.05 --shm-above 50')
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=PROJECT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        start = [proc.stdout.readline() for _ in range(4)]
        if not start[0]:
            assert proc.stderr is not None
            pytest.skip(f"no private mount namespace here: {proc.stderr.read().strip()}")
        assert "  /dev/shm 16.0 MiB (smaller than available), 0% used\n" in start
        shm = f"/proc/{proc.pid}/root/dev/shm/batch"  # the namespace's /dev/shm, from outside
        with open(shm, "wb") as f:
            f.write(b"\1" * (12 << 20))
        # The watcher samples every 50 ms while the write (or the unlink's truncation) is
        # still moving the tmpfs's block count: each line reports the first sample past the
        # threshold, somewhere between the threshold and the end state, never one exact value.
        warning = proc.stdout.readline()
        percent, used = shm_line(r"WARNING /dev/shm is (\S+)% full \((\S+) MiB of 16\.0 MiB\), "
                                 r"above 50%: ", warning)
        assert 50 < percent <= 75 and 8.0 <= used <= 12.0, warning
        assert abs(percent - used / 16 * 100) < 1, warning   # one sample, not two
        assert "docker run --shm-size" in warning
        os.unlink(shm)
        back = proc.stdout.readline()
        percent, used = shm_line(r"INFO    /dev/shm is back to (\S+)% full \((\S+) \S+ of "
                                 r"16\.0 MiB\)", back)
        assert percent <= 45, back   # 50% minus the watcher's 5-point hysteresis
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
