"""The one Python process a runtime-tier container runs (tests/runtime/oci.py starts it).

    python inside.py PLAN_JSON            # the container's process: runs the plan's steps
    python inside.py --probe DIR PLAN     # a helper: moves into DIR, queries, prints JSON

It performs several cases in one process, because a container boot costs ~1.5 min under the
VM's emulation, and prints one JSON line per sync point (`{"sync": NAME}`: the test acts
from outside, e.g. `update --memory`) and one `{"result": {...}}` line at the end. It only
gathers: what cgwatch answered, and next to it an independent reading of the kernel's files
(limit, usage, inactive_file) done here with plain open()s. The test compares them.
Nothing here may import the tests package: only the standard library and cgwatch.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from typing import Any, Optional

PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, PROJECT)

UNLIMITED_V1 = 1 << 62  # v1 shows "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712)
# The victim raises its own oom_score_adj (allowed without privilege) so that the OOM killer
# picks it and not this process or `cgwatch run`, which are of similar size at a 64 MiB limit
ALLOCATE = ("open('/proc/self/oom_score_adj', 'w').write('1000')\n"
            "chunks = []\n"
            "while True:\n"
            "    chunks.append(b'\\x01' * (1 << 20))\n")


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def flat(path: str) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in read(path).splitlines())}


def reading(directory: str, version: int) -> dict[str, Any]:
    """The kernel's own figures for one cgroup directory, read straight from its files."""
    stat = flat(os.path.join(directory, "memory.stat"))
    if version == 2:
        text = read(os.path.join(directory, "memory.max")).strip()
        limit = None if text == "max" else int(text)
        usage = int(read(os.path.join(directory, "memory.current")))
        inactive = stat["inactive_file"]
        hierarchical = None
    else:
        value = int(read(os.path.join(directory, "memory.limit_in_bytes")))
        limit = None if value >= UNLIMITED_V1 else value
        usage = int(read(os.path.join(directory, "memory.usage_in_bytes")))
        inactive = stat["total_inactive_file"]
        hierarchical = stat["hierarchical_memory_limit"]
    headroom = None if limit is None else limit - max(0, usage - inactive)
    return {"directory": directory, "limit": limit, "usage": usage, "inactive_file": inactive,
            "headroom": headroom, "hierarchical_memory_limit": hierarchical}


def query(monitor: Any, dirs: list[str], version: int) -> dict[str, Any]:
    """cgwatch's answers, then the files of `dirs` read right after (usage moves: the test
    allows a few MiB between the two)."""
    got = {"total": monitor.total_memory(), "available": monitor.available_memory(),
           "status": dict(monitor.status.__dict__),
           "levels": [lvl.as_dict() for lvl in monitor.levels()]}
    got["files"] = [reading(d, version) for d in dirs]
    return got


def cgwatch_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgwatch", *args], capture_output=True,
                          text=True, timeout=timeout)


def probe(directory: str, plan: dict[str, Any]) -> None:
    """--probe: move into `directory` before importing cgwatch, then answer once."""
    write(os.path.join(directory, "cgroup.procs"), str(os.getpid()))
    from cgwatch import Monitor

    with Monitor() as monitor:
        got = query(monitor, plan["dirs"], plan["version"])
    print(json.dumps(got), flush=True)


def spawn_probe(directory: str, dirs: list[str], version: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", directory,
                           json.dumps({"dirs": dirs, "version": version})],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"probe in {directory} failed (status {proc.returncode}): "
                           f"{proc.stderr} {proc.stdout}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


class Children:
    """The seed's B and C, made inside the container (needs a rw cgroup mount):
    B = own/b with a 256 MiB limit; C = own/p/c without a limit under own/p (512 MiB), beside
    own/p/sib holding 32 MiB (so p's usage is not c's alone)."""

    def __init__(self, own: str, version: int) -> None:
        self.own = own
        self.version = version
        self.made: list[str] = []
        self.holder: Optional[subprocess.Popen[str]] = None

    def make(self, relative: str, limit: Optional[int], parent_of_children: bool) -> str:
        path = os.path.join(self.own, relative)
        os.mkdir(path)
        self.made.append(path)
        if self.version == 2 and parent_of_children:
            write(os.path.join(path, "cgroup.subtree_control"), "+memory")
        if limit is not None:
            name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
            write(os.path.join(path, name), str(limit))
        return path

    def run(self) -> dict[str, Any]:
        mib = 1 << 20
        b = self.make("b", 256 * mib, False)
        p = self.make("p", 512 * mib, True)
        c = self.make("p/c", None, False)
        sib = self.make("p/sib", None, False)
        code = (f"open({os.path.join(sib, 'cgroup.procs')!r}, 'w').write(str(__import__('os')"
                ".getpid()))\n"
                "held = b'\\x01' * (32 << 20)\nprint('ready', flush=True)\n"
                "import sys; sys.stdin.read()\n")
        self.holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)
        assert self.holder.stdout is not None
        if self.holder.stdout.readline().strip() != "ready":
            raise RuntimeError("the 32 MiB holder in p/sib did not start")
        return {"b": spawn_probe(b, [b], self.version),
                "c": spawn_probe(c, [c, p], self.version),
                "sib_usage": reading(sib, self.version)["usage"]}

    def remove(self) -> None:
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()
        for path in reversed(self.made):
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except OSError as e:
                    if e.errno == errno.ENOENT:
                        break
                    time.sleep(0.1)


def events_step(monitor: Any, own: str, version: int) -> dict[str, Any]:
    from cgwatch import Events

    with Events(monitor) as events:
        # An alert arms the alert notifications (v1 usage eventfds, v2 a PSI trigger) on the
        # loop thread, in the same turn that checks it: at 99% of total_memory() it fires at
        # once, so once it has come, the mechanisms say what the arming met.
        events.alert_below("99%")
        first = events.get(timeout=60)
        mechanisms = events.mechanisms()
    got: dict[str, Any] = {"mechanisms": mechanisms, "mode": monitor.status.mode,
                           "reason": monitor.status.reason,
                           "first_item": type(first).__name__}
    # Independent of cgwatch: can this process open what registration writes to? (v1: an
    # eventfd through cgroup.event_control; v2: a PSI trigger written to memory.pressure)
    name, flags = (("memory.pressure", os.O_RDWR) if version == 2 else
                   ("cgroup.event_control", os.O_WRONLY))
    try:
        os.close(os.open(os.path.join(own, name), flags))
        got["registration_file"] = "writable"
    except OSError as e:
        got["registration_file"] = errno.errorcode.get(e.errno or 0, str(e.errno))
    if version == 2 and got["registration_file"] == "writable":
        # and can it write a PSI trigger there itself? (the kernel checks CAP_SYS_RESOURCE,
        # which Docker's default capabilities lack; 6.5+ lets others use 2 s windows)
        got["psi_write"] = {}
        for trigger in ("some 100000 1000000", "some 200000 2000000"):
            fd = os.open(os.path.join(own, "memory.pressure"), os.O_RDWR | os.O_NONBLOCK)
            try:
                os.write(fd, trigger.encode() + b"\0")
                got["psi_write"][trigger] = "ok"
            except OSError as e:
                got["psi_write"][trigger] = errno.errorcode.get(e.errno or 0, str(e.errno))
            finally:
                os.close(fd)
    return got


def update_step(monitor: Any, step: dict[str, Any], own: str, version: int) -> dict[str, Any]:
    before = monitor.total_memory()
    print(json.dumps({"sync": "update", "total": before}), flush=True)
    started = time.monotonic()
    deadline = started + step["timeout"]
    seen = None
    while time.monotonic() < deadline:
        if monitor.total_memory() == step["to"]:
            seen = time.monotonic() - started
            break
        time.sleep(0.001)
    return {"before": before, "after": monitor.total_memory(), "seen_after": seen,
            "file": reading(own, version)["limit"], "mode": monitor.status.mode}


def oom_step(own: str, version: int) -> dict[str, Any]:
    report = "/tmp/cgwatch-report.json"
    proc = cgwatch_cli("run", "--report", report, "--", sys.executable, "-c", ALLOCATE)
    got: dict[str, Any] = {"returncode": proc.returncode, "stderr": proc.stderr[-2000:]}
    try:
        got["report"] = json.loads(read(report))
    except (OSError, ValueError) as e:
        got["report"] = None
        got["report_error"] = str(e)
    # The kernel's counters, for the test to hold the report against
    if version == 2:
        got["counters"] = flat(os.path.join(own, "memory.events"))
    else:
        oom_control = flat(os.path.join(own, "memory.oom_control"))
        got["counters"] = {"oom_kill": oom_control["oom_kill"],
                           "failcnt": int(read(os.path.join(own, "memory.failcnt")))}
    got["limit"] = reading(own, version)["limit"]
    return got


def show_step() -> dict[str, Any]:
    data = cgwatch_cli("--json")
    table = cgwatch_cli()
    if data.returncode != 0 or table.returncode != 0:
        raise RuntimeError(f"cgwatch failed: {data.stderr} {table.stderr}")
    return {"json": json.loads(data.stdout), "table": table.stdout}


def lxcfs_step() -> dict[str, Any]:
    from cgwatch import hostmem

    host = hostmem.shared("/")
    meminfo = {k.rstrip(":"): int(v) * 1024 for k, v, *_ in
               (line.split() for line in read("/proc/meminfo").splitlines()) if _ == ["kB"]}
    # sysinfo(2) is not virtualised by lxcfs: it still reports the host's RAM
    return {"meminfo_total": meminfo["MemTotal"], "meminfo_available": meminfo["MemAvailable"],
            "sysinfo_total": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
            "host_source": host.source, "lower_bound": host.available_lower_bound(),
            "mountinfo_meminfo": [line for line in read("/proc/self/mountinfo").splitlines()
                                  if " /proc/meminfo " in line]}


def own_directory(version: int) -> str:
    """This process's cgroup directory, worked out here the plain way (not cgwatch's):
    the mount at /sys/fs/cgroup[/memory] plus our path relative to that mount's root."""
    mount_point = "/sys/fs/cgroup" if version == 2 else "/sys/fs/cgroup/memory"
    for line in read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if (version == 2 and controllers == "") or "memory" in controllers.split(","):
            break
    else:
        raise RuntimeError("no memory line in /proc/self/cgroup")
    for line in read("/proc/self/mountinfo").splitlines():
        fields = line.split()
        if fields[4] == mount_point:
            root = fields[3]
    relative = os.path.relpath(path, root)
    if relative.startswith(".."):
        raise RuntimeError(f"our cgroup {path} is not below the mount root {root}")
    return os.path.normpath(os.path.join(mount_point, relative))


def main(plan: dict[str, Any]) -> dict[str, Any]:
    version = plan["version"]
    own = own_directory(version)
    out: dict[str, Any] = {
        "own_dir": own,
        "proc_self_cgroup": read("/proc/self/cgroup"),
        "cgroup_mounts": [line for line in read("/proc/self/mountinfo").splitlines()
                          if " - cgroup" in line],
    }
    ops = [step["op"] for step in plan["steps"]]
    if version == 2 and "children" in ops:
        # v2's no-internal-processes rule: a cgroup holding processes cannot give the memory
        # controller to children, and this process sits in the container's cgroup. Move into
        # a leaf first (as systemd's init.scope does), then enable +memory there.
        leaf = os.path.join(own, "init")
        os.mkdir(leaf)
        write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
        write(os.path.join(own, "cgroup.subtree_control"), "+memory")
        out["moved_to"] = leaf

    from cgwatch import Monitor

    with Monitor() as monitor:
        for step in plan["steps"]:
            op = step["op"]
            if op == "own":
                out["own"] = query(monitor, [own], version)
            elif op == "events":
                out["events"] = events_step(monitor, own, version)
            elif op == "children":
                children = Children(own, version)
                try:
                    out["children"] = children.run()
                finally:
                    children.remove()
            elif op == "update":
                out["update"] = update_step(monitor, step, own, version)
            elif op == "oom":
                out["oom"] = oom_step(own, version)
            elif op == "show":
                out["show"] = show_step()
            elif op == "lxcfs":
                out["lxcfs"] = lxcfs_step()
            else:
                raise ValueError(f"unknown step {op!r}")
    return out


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if sys.argv[1] == "--probe":
        probe(sys.argv[2], json.loads(sys.argv[3]))
        sys.exit(0)
    try:
        result = main(json.loads(sys.argv[1]))
    except BaseException:
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
        sys.exit(1)
    print(json.dumps({"result": result}), flush=True)
