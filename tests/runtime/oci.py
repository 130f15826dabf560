"""Real OCI containers for the runtime tier: bundles, config.json, run/update/delete.

A bundle's root file system needs no image and no network: an empty directory with read-only
bind mounts of the host's /usr and /etc, the /lib* and /bin links (or directories) as the host
has them, the interpreter's real installation (a pyenv build in a home directory, say: the venv's
`python3` is a link to it), the venv and the checkout, each at its host path. The container's
cgroup is placed below the test's own memory cgroup (`linux.cgroupsPath`), so nothing is made
outside the subtree the tests own, and everything is removed again (`Container.close`, called
from a `finally`).

cgroup v1 (this host): Debian's runc 1.1.5 creates the container's cgroup in every v1
hierarchy it needs (cpuset, devices, ...), outside the memory cgroup the tests own: with the
host's hierarchies it would write there, and shown the memory hierarchy alone it stops
("unable to apply cgroup configuration: mkdir /sys/fs/cgroup/cpuset/...: no such file or
directory"; "mountpoint for devices not found" in other setups). crun 1.8.1 creates cgroups
only in the hierarchies mounted under /sys/fs/cgroup: every runtime command is therefore run
in a private mount namespace whose /sys/fs/cgroup is a tmpfs holding only the memory
hierarchy (`runtime_argv`), and the tier runs crun alone on v1. cgroup v2 (the
VM): runc with its cgroupfs driver and crun, no wrapper.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Optional

from tests.cgroup_helpers import PROJECT, MiB, Tree, read

GiB = 1 << 30
INSIDE = os.path.join(PROJECT, "tests", "runtime", "inside.py")
V1_MEMORY = "/sys/fs/cgroup/memory"

# Run as `sh -c NS_SCRIPT sh RUNTIME ARGS...` inside `unshare --mount --propagation private`:
# /sys/fs/cgroup becomes a tmpfs holding only the memory hierarchy (moved there from its
# usual place, so its mount root stays what the host has), then the runtime is exec'd.
NS_SCRIPT = (
    "set -e\n"
    "t=$(mktemp -d)\n"
    f"mount --bind {V1_MEMORY} \"$t\"\n"
    "mount -t tmpfs cgwatch-runtime /sys/fs/cgroup\n"
    f"mkdir {V1_MEMORY}\n"
    f"mount --move \"$t\" {V1_MEMORY}\n"
    "rmdir \"$t\"\n"
    'exec "$@"\n'
)


# Checks of what this process made (each returns what of it is still there): the session's
# end (tests/runtime/conftest.py) fails the run if any is left. Only this process's own
# things, so a runtime test running at the same time elsewhere cannot be taken for a leak.
MADE: list[Callable[[], list[str]]] = []


def runtimes(version: int) -> list[str]:
    """The runtimes this tier runs on a cgroup version (see the module docstring for why v1
    has crun only)."""
    return ["crun"] if version == 1 else ["runc", "crun"]


def missing_reason(runtime: str) -> str:
    """Empty when `runtime` (and what its wrapper needs) is installed; else the skip reason."""
    needed = [runtime, "unshare", "mount"]
    missing = [tool for tool in needed if shutil.which(tool) is None]
    if missing:
        return (f"not on PATH: {' '.join(missing)} (PATH=$(tests/tools):$PATH unpacks runc, "
                "crun and lxcfs; scripts/test and tests/runtime/run do)")
    return ""


def runtime_argv(runtime: str, version: int, *args: str) -> list[str]:
    argv = [runtime, *args]
    if version == 1:
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", NS_SCRIPT,
                "sh", *argv]
    return argv


def runtime_call(runtime: str, version: int, *args: str, timeout: float = 120,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(runtime_argv(runtime, version, *args), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{runtime} {' '.join(args)} failed ({proc.returncode}): "
                             f"{proc.stderr.strip()}")
    return proc


@dataclass
class Shape:
    """How the container is made: the runtime options the tier varies."""

    cgroupns: bool  # a private cgroup namespace
    cgroup_ro: bool  # the cgroup file system mounted read-only (Docker's default) or rw
    limit: int = 1 * GiB
    # A directory where lxcfs is mounted: its proc/meminfo is bind-mounted over /proc/meminfo
    lxcfs: Optional[str] = None


def _root_mounts() -> list[dict[str, Any]]:
    """Read-only bind mounts of what the container's python needs, each at its host path."""
    real_prefix = os.path.realpath(sys.base_prefix)  # the interpreter's real installation
    paths = ["/usr", "/etc", real_prefix, os.path.realpath(sys.prefix), PROJECT]
    for top in sorted(os.listdir("/")):  # /lib, /lib64, /bin, /sbin: links on merged-/usr
        full = "/" + top
        if (top.startswith("lib") or top in ("bin", "sbin")) and not os.path.islink(full) \
                and os.path.isdir(full):
            paths.append(full)
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        # one mount per tree: a path inside one already bound (the venv in the checkout) is
        # seen through it
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return [{"destination": p, "type": "bind", "source": p,
             "options": ["rbind", "ro", "nosuid", "nodev"]} for p in kept]


def _make_rootfs(rootfs: str) -> None:
    os.mkdir(rootfs)
    for top in os.listdir("/"):
        full = "/" + top
        if os.path.islink(full) and (top.startswith("lib") or top in ("bin", "sbin")):
            os.symlink(os.readlink(full), os.path.join(rootfs, top))  # lib -> usr/lib


CAPABILITIES = [  # Docker's default set
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
    "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
]


def config(args: list[str], cgroups_path: str, shape: Shape) -> dict[str, Any]:
    """The OCI runtime spec (1.0) of one container."""
    cgroup_opts = ["nosuid", "noexec", "nodev", "relatime", "ro" if shape.cgroup_ro else "rw"]
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": cgroup_opts},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=1777", "size=65536k"]},
        *_root_mounts(),
    ]
    if shape.lxcfs is not None:
        mounts.append({"destination": "/proc/meminfo", "type": "bind",
                       "source": os.path.join(shape.lxcfs, "proc", "meminfo"),
                       "options": ["bind", "ro"]})
    namespaces = [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]
    if shape.cgroupns:
        namespaces.append({"type": "cgroup"})
    caps = list(CAPABILITIES)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8",
                    "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1",
                    # a crash of a python inside says where (a traceback on stderr)
                    "PYTHONFAULTHANDLER=1"],
            "cwd": "/tmp",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": "cgwatch-test",
        "mounts": mounts,
        "linux": {
            "cgroupsPath": cgroups_path,
            "resources": {"memory": {"limit": shape.limit}},
            "namespaces": namespaces,
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                              "/proc/sysrq-trigger"],
        },
    }


@dataclass
class Container:
    """One container running `inside.py` with a plan; talk to it with `line()`, `update()`,
    and collect its result with `result()`. `close()` removes everything it made."""

    runtime: str
    version: int
    tree: Tree
    parent: str  # host directory of the cgroup the container's cgroup is made in
    shape: Shape
    id: str = field(default_factory=lambda: f"cgwatch-test-{uuid.uuid4().hex[:8]}")
    bundle: str = ""
    cgroup: str = ""  # the container's cgroup directory on the host
    proc: Optional[subprocess.Popen[str]] = None
    stderr_file: Optional[IO[str]] = None

    def start(self, plan: dict[str, Any]) -> None:
        MADE.append(self.left_behind)
        self.bundle = tempfile.mkdtemp(prefix="cgwatch-bundle-")
        _make_rootfs(os.path.join(self.bundle, "rootfs"))
        self.cgroup = os.path.join(self.parent, "ctr")
        res_root = self.tree.base  # a host directory: its path in the hierarchy follows
        mount_point = V1_MEMORY if self.version == 1 else "/sys/fs/cgroup"
        assert res_root.startswith(mount_point)
        cgroups_path = "/" + os.path.relpath(self.cgroup, mount_point)
        args = [os.path.join(os.path.realpath(sys.prefix), "bin", "python3"), INSIDE,
                json.dumps(plan)]
        with open(os.path.join(self.bundle, "config.json"), "w") as f:
            json.dump(config(args, cgroups_path, self.shape), f, indent=1)
        # stderr to a file: a pipe nobody reads could fill and stall the container
        self.stderr_file = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            runtime_argv(self.runtime, self.version, "run", "--bundle", self.bundle, self.id),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.stderr_file,
            text=True)

    def stderr(self) -> str:
        if self.stderr_file is None:
            return ""
        self.stderr_file.seek(0)
        return self.stderr_file.read()

    def line(self) -> dict[str, Any]:
        """The container's next JSON line (its python prints one per sync point and one
        result)."""
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            text = self.proc.stdout.readline()
            if not text:
                self.proc.wait(timeout=60)
                raise AssertionError(f"{self.runtime} container ended (status "
                                     f"{self.proc.returncode}) early: {self.stderr()}")
            if text.startswith("{"):
                got: dict[str, Any] = json.loads(text)
                if "error" in got:
                    raise AssertionError(f"inside the container: {got['error']}")
                return got

    def update_memory(self, limit: int) -> float:
        """`RUNTIME update --memory LIMIT` from outside; its duration in seconds."""
        started = time.monotonic()
        runtime_call(self.runtime, self.version, "update", "--memory", str(limit), self.id)
        return time.monotonic() - started

    def result(self, timeout: float = 600) -> dict[str, Any]:
        got = self.line()
        assert self.proc is not None
        self.proc.wait(timeout=timeout)
        assert self.proc.returncode == 0, self.stderr()
        assert "result" in got, got
        result: dict[str, Any] = got["result"]
        return result

    def left_behind(self) -> list[str]:
        listing = runtime_call(self.runtime, self.version, "list", "-q", check=False,
                               timeout=60)
        left = [f"{self.runtime} container {self.id}"] if self.id in listing.stdout.split() \
            else []
        return left + [p for p in (self.bundle, self.cgroup) if p and os.path.exists(p)]

    def close(self) -> None:
        """Kill and delete the container, remove its cgroups and its bundle: whatever
        happened before."""
        if self.proc is not None:
            if self.proc.poll() is None:
                runtime_call(self.runtime, self.version, "kill", self.id, "KILL",
                             check=False, timeout=60)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=30)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            runtime_call(self.runtime, self.version, "delete", "--force", self.id,
                         check=False, timeout=60)
        if self.stderr_file is not None:
            self.stderr_file.close()
        if self.cgroup:
            remove_cgroup_tree(self.cgroup)
        if self.bundle:
            _remove_bundle(self.bundle)


def remove_cgroup_tree(top: str) -> None:
    """rmdir `top` and what is below it, deepest first, killing what still runs there."""
    if not os.path.isdir(top):
        return
    dirs = [root for root, _, _ in os.walk(top)]
    for path in reversed(dirs):
        for _ in range(50):
            try:
                for pid in read(os.path.join(path, "cgroup.procs")).split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        pass
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def _remove_bundle(bundle: str) -> None:
    # The rootfs's bind mounts live in the container's mount namespace, gone with it: on the
    # host the rootfs holds only our links and the empty mount points the runtime made.
    # Never delete through a mount: refuse if anything is mounted below the bundle here.
    with open("/proc/self/mountinfo") as f:
        mounted = [line.split()[4] for line in f]
    below = [m for m in mounted if m == bundle or m.startswith(bundle + "/")]
    assert not below, f"still mounted under {bundle}: {below}"
    shutil.rmtree(bundle, ignore_errors=True)


__all__ = ["MADE", "GiB", "MiB", "Container", "Shape", "missing_reason", "runtime_call", "runtimes"]
