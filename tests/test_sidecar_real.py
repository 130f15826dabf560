"""A sidecar in its own cgroup namespace watching an application's process (`Monitor(pid=)`,
`cgwatch serve --pid`), on real kernels: v1 on this machine, v2 in the VM (tests/v2/run).

Kernel facts (6.18 v1, 6.1 v2): /proc/APP/cgroup and the cgroup mount roots in
/proc/APP/mountinfo are both printed relative to the READER's cgroup namespace; a sidecar
whose namespace root is a sibling of the application's cgroup reads "/../app" in both when
the application has its own cgroup mount (a container's), and the mount point is a path in
the application's mount namespace, reachable under /proc/APP/root. When the application
sees the whole hierarchy instead, its mount root reads "/../../.." there: the path between
the two cannot be named from the sidecar, and `cgwatch serve --pid` refuses.

Processes are shell one-liners and `unshare` (util-linux); the sidecar's Python is the one
child the VM has to pay for (~30x slower there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.cgroup_helpers import (
    PROJECT,
    MiB,
    Tree,
    cgroup_tree,
    limit_file,
    real_kernel_marks,
    wait_for,
    write,
)

pytestmark = real_kernel_marks()

SIDECAR = """
import json, sys
import cgwatch
monitor = cgwatch.Monitor(pid=int(sys.argv[1]), thread=False)
def report():
    status = monitor.status
    print(json.dumps({"mode": status.mode, "reason": status.reason,
                      "cgroup_path": status.cgroup_path, "directory": status.directory,
                      "total": monitor.total_memory(), "available": monitor.available_memory(),
                      "levels": [[lvl.cgroup_path, lvl.limit] for lvl in monitor.levels()]}),
          flush=True)
report()
sys.stdin.readline()  # the test changed the application's limit from outside
report()
"""


@pytest.fixture
def tree() -> Iterator[Tree]:
    with cgroup_tree() as made:
        yield made


def start_app(tree: Tree, cgroup: str, *, own_mount: bool) -> subprocess.Popen[str]:
    """`sleep` in `cgroup`; with `own_mount`, in a private cgroup and mount namespace with a
    fresh cgroup mount of its own, as a container runtime makes it (root: its cgroup)."""
    tree.allow_processes(cgroup)
    script = "exec sleep 120"
    if own_mount:
        fresh = ("umount /sys/fs/cgroup; mount -t cgroup2 none /sys/fs/cgroup"
                 if tree.version == 2 else
                 "mount -t tmpfs cgwatch-app /sys/fs/cgroup; mkdir /sys/fs/cgroup/memory; "
                 "mount -t cgroup -o memory cgwatch-app /sys/fs/cgroup/memory")
        script = (f"exec unshare --cgroup --mount --propagation private sh -ec "
                  f"'{fresh}; exec sleep 120'")
    app = subprocess.Popen(["sh", "-ec", f"echo $$ > {cgroup}/cgroup.procs; {script}"],
                           stderr=subprocess.PIPE, text=True)
    tree.procs.append(app)

    def ready() -> bool:
        with open(f"/proc/{app.pid}/comm") as f:
            return f.read().strip() == "sleep"

    assert wait_for(ready, timeout=30), app.stderr.read() if app.stderr else ""
    return app


def sidecar(tree: Tree, cgroup: str, *argv: str, **kw: object) -> subprocess.Popen[str]:
    """A process in `cgroup` that unshares its cgroup namespace (its cgroup becomes "/"),
    then runs `python ARGV` with the checkout's cgwatch."""
    tree.allow_processes(cgroup)
    proc = subprocess.Popen(
        ["sh", "-ec", f'echo $$ > {cgroup}/cgroup.procs; exec unshare --cgroup "$@"', "sh",
         sys.executable, *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": PROJECT}, **kw)  # type: ignore[call-overload]
    tree.procs.append(proc)
    return proc


def test_a_sidecar_in_its_own_cgroup_namespace_reports_the_applications_cgroup(
        tree: Tree) -> None:
    """The application (a container with its own cgroup mount) is limited to 64 MiB, the pod
    to 512 MiB; the sidecar sees the application's level through /proc/APP/root, and a limit
    written from outside reaches its next query."""
    tree.make("pod", 512 * MiB)
    app_cgroup = tree.make("pod/app", 64 * MiB)
    side_cgroup = tree.make("pod/sidecar")
    app = start_app(tree, app_cgroup, own_mount=True)
    proc = sidecar(tree, side_cgroup, "-c", SIDECAR, str(app.pid), stdin=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    assert line, proc.communicate(timeout=60)
    seen = json.loads(line)
    assert seen["mode"] != "host", seen
    assert seen["cgroup_path"] == "/../app", seen
    assert seen["directory"].startswith(f"/proc/{app.pid}/root/sys/fs/cgroup"), seen
    assert seen["levels"][0] == ["/../app", 64 * MiB], seen
    assert seen["total"] == 64 * MiB, seen
    assert 0 < seen["available"] <= 64 * MiB, seen

    write(os.path.join(app_cgroup, limit_file(tree.version)), str(96 * MiB))
    proc.stdin.write("\n")
    proc.stdin.flush()
    after = json.loads(proc.stdout.readline())
    assert after["total"] == 96 * MiB, after
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""


def test_serve_refuses_a_process_whose_cgroup_the_sidecar_cannot_name(tree: Tree) -> None:
    """The application sees the whole hierarchy (no cgroup namespace of its own): from the
    sidecar's namespace its mount root reads "/../../.." and its cgroup "/../app", so the
    path in between is unknown. `cgwatch serve --pid` exits 1 saying so, instead of
    serving the host's RAM under the application's name."""
    pytest.importorskip("prometheus_client", reason="cgwatch serve needs cgwatch[prometheus]")
    tree.make("pod", 512 * MiB)
    app = start_app(tree, tree.make("pod/app", 64 * MiB), own_mount=False)
    proc = sidecar(tree, tree.make("pod/sidecar"), "-m", "cgwatch.cli", "serve", "--port",
                   "0", "--pid", str(app.pid))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert f"cannot find the memory cgroup of process {app.pid}" in err, err
    assert "http://" not in err and out == "", (out, err)
