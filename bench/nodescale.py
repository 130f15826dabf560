"""Node scale: many cgwatch processes of one uid, as a node full of training ranks and fork
pools runs them, and what they leave to the other programs of that uid.

    sudo .venv/bin/python -m bench.nodescale [--quick] [--json out.json] [--processes 1,130,300]
        [--userns-limit N] [--fork-pool]

For each count, a fleet is started: a parent process, moved into a fresh memory cgroup made
below our own and switched to an unused uid (so root's inotify quota, shared by the whole
machine, is never touched), forks that many children; each child makes a Monitor and waits
for signals. With `--userns-limit N` the parent first enters a private user namespace and
writes N to its own /proc/sys/user/max_inotify_instances (the host's sysctl is untouched;
the namespace's count is also charged to the uid outside). `--fork-pool`: the parent makes a
monitor before forking (the shape of a DataLoader or a multiprocessing pool).

Measured per fleet: how many children watch and how many poll; how many inotify instances
the uid can still create (another program of that uid: 0 means `tail -F` would fall back to
polling; the least of 10 samples), with all children running and after half of them
exited; how many answers total_memory() gives right after a limit write on their cgroup
(the write returns, then every child is signalled and answers at once); and the children's
idle CPU (the sum of every
thread's schedstat run time over a quiet period, in % of one core). And a neighbour: another
program of the uid (as `tail -F`) calling inotify_init1 and closing it in a tight loop while
the children start and for a second after; its failed calls (EMFILE: a cgwatch probe held the
uid's last instances) are `neighbour.failures` (before the shared count of quota.py, 300
children made 10079 of 180036 calls fail, in 0.86 s).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import select
import signal
import stat
import subprocess
import sys
import time
import uuid
from typing import Any, Optional

UID = 43117  # an unused uid: its inotify quota is ours alone on this machine


def others_can_run(path: str) -> bool:
    """Whether a uid that is neither the owner nor in the group can reach and run `path`: every
    directory on the way needs o+x (a venv's interpreter may link into root's home, 0700)."""
    real = os.path.realpath(path)
    parts = real.split("/")
    for end in range(1, len(parts)):
        if not os.stat("/".join(parts[:end]) or "/").st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(real).st_mode & stat.S_IXOTH)


def fleet_python() -> str:
    """A Python the unprivileged uid can run: ours, else the system's."""
    if not others_can_run(sys.executable) and os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3"
    return sys.executable
GiB = 1 << 30

# The fleet parent, run as UID (its argv: count, userns limit or 0, fork-pool 0/1, how long
# the neighbour goes on after the children started, in seconds, or 0 for none). It
# answers the orchestrator's commands on stdin with one JSON line each on stdout.
FLEET = r'''
import ctypes, errno, json, os, select, signal, sys, time
count, ns_limit, pool = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
neighbour = float(sys.argv[4])
libc = ctypes.CDLL(None, use_errno=True)
if ns_limit:
    CLONE_NEWUSER = 0x10000000
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    open("/proc/self/setgroups", "w").write("deny")
    open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
    open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
    open("/proc/sys/user/max_inotify_instances", "w").write(str(ns_limit))
print(json.dumps({"ready": os.getpid()}), flush=True)
sys.stdin.readline()  # "go": the orchestrator moved us into the cgroup
def run_neighbour(out):
    # Another program of the uid (tail -F, an editor): makes one instance and closes it, in a
    # tight loop, from before the first child starts until all of them answered and the
    # neighbour's seconds passed (their retries), when the parent sends SIGUSR2 (a pipe's
    # end would stay open in every forked child).
    stopped = []
    signal.signal(signal.SIGUSR2, lambda *_: stopped.append(1))
    attempts = failures = 0
    first = last = 0.0
    while not stopped:
        fd = libc.inotify_init1(os.O_CLOEXEC)
        attempts += 1
        if fd < 0:
            failures += 1
            last = time.monotonic()
            first = first or last
        else:
            os.close(fd)
    os.write(out, json.dumps({"attempts": attempts, "failures": failures,
                              "window_s": round(last - first, 3)}).encode())
    os._exit(0)
neighbour_pid = -1
if neighbour:
    out_r, out_w = os.pipe()
    neighbour_pid = os.fork()
    if neighbour_pid == 0:
        os.close(out_r)
        run_neighbour(out_w)
    os.close(out_w)
    time.sleep(0.2)
import cgwatch
parent_monitor = cgwatch.Monitor() if pool else None
r, w = os.pipe()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
children = []
for _ in range(count):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        m = cgwatch.Monitor()
        m.total_memory()
        os.write(w, (json.dumps({"pid": os.getpid(), "mode": m.status.mode}) + "\n").encode())
        while True:
            signal.sigwaitinfo({signal.SIGUSR1})
            total = m.total_memory()
            os.write(w, (json.dumps({"pid": os.getpid(), "total": total,
                                      "mode": m.status.mode}) + "\n").encode())
    children.append(pid)
os.close(w)
buf = b""
def collect(n, timeout=60.0):
    global buf
    rows, deadline = [], time.monotonic() + timeout
    while len(rows) < n and time.monotonic() < deadline:
        while b"\n" in buf and len(rows) < n:
            line, buf = buf.split(b"\n", 1)
            rows.append(json.loads(line))
        if len(rows) >= n:
            break
        if select.select([r], [], [], 0.5)[0]:
            buf += os.read(r, 65536)
    return rows
def free_instances(cap=4096):
    fds = []
    try:
        while len(fds) < cap:
            fd = libc.inotify_init1(os.O_CLOEXEC)
            if fd < 0:
                break
            fds.append(fd)
    finally:
        for fd in fds:
            os.close(fd)
    return len(fds)
def cpu_ns(pids):
    total = 0
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
        except OSError:
            pass
    return total
t_start = time.monotonic()
ready = collect(count)
start_seconds = time.monotonic() - t_start
def modes(rows):
    out = {}
    for row in rows:
        out[row["mode"]] = out.get(row["mode"], 0) + 1
    return out
started = {"started": len(ready), "modes": modes(ready), "start_s": round(start_seconds, 2)}
if neighbour:
    time.sleep(neighbour)
    os.kill(neighbour_pid, signal.SIGUSR2)
    started["neighbour"] = json.loads(os.read(out_r, 4096))
    os.waitpid(neighbour_pid, 0)
print(json.dumps(started), flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "free":
        samples = []
        for _ in range(int(cmd[1]) if len(cmd) > 1 else 1):
            samples.append(free_instances())
            time.sleep(0.05)
        print(json.dumps({"free": min(samples), "samples": samples}), flush=True)
    elif cmd[0] == "ask":
        for pid in children:
            os.kill(pid, signal.SIGUSR1)
        rows = collect(len(children))
        print(json.dumps({"answers": [row["total"] for row in rows], "modes": modes(rows)}),
              flush=True)
    elif cmd[0] == "idle":
        seconds = float(cmd[1])
        before, t0 = cpu_ns(children), time.monotonic()
        time.sleep(seconds)
        after, t1 = cpu_ns(children), time.monotonic()
        print(json.dumps({"cpu_percent": 100.0 * (after - before) / 1e9 / (t1 - t0)}),
              flush=True)
    elif cmd[0] == "exit":
        n = int(cmd[1])
        gone, children = children[:n], children[n:]
        for pid in gone:
            os.kill(pid, signal.SIGKILL)
        for pid in gone:
            os.waitpid(pid, 0)
        print(json.dumps({"left": len(children)}), flush=True)
    elif cmd[0] == "quit":
        break
for pid in children:
    os.kill(pid, signal.SIGKILL)
for pid in children:
    os.waitpid(pid, 0)
'''


def _own_memory_dir() -> str:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from cgwatch import discovery, tree

    res, _ = tree.resolve_process("/")
    if not isinstance(res, discovery.Resolved) or res.version != 1:
        raise SystemExit("bench.nodescale needs a writable v1 memory cgroup (this host)")
    return res.directory


class Fleet:
    """One fleet parent and its children, in a cgroup of their own."""

    def __init__(self, count: int, *, ns_limit: int = 0, pool: bool = False,
                 env: Optional[dict[str, str]] = None, uid: int = UID,
                 neighbour: float = 0.0) -> None:
        self.uid = uid
        self.cgroup = os.path.join(_own_memory_dir(), f"cgwatch-fleet-{uuid.uuid4().hex[:8]}")
        os.mkdir(self.cgroup)
        self.limit_file = os.path.join(self.cgroup, "memory.limit_in_bytes")
        self.set_limit(8 * GiB)
        project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        full_env = dict(os.environ, PYTHONPATH=project, **(env or {}))
        try:
            self.proc = subprocess.Popen(
                [fleet_python(), "-c", FLEET, str(count), str(ns_limit), "1" if pool else "0",
                 str(neighbour)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env=full_env, user=uid, group=uid, extra_groups=[], cwd="/")
        except BaseException:
            os.rmdir(self.cgroup)  # nothing was started in it
            raise
        try:
            pid = self._reply(30)["ready"]
            with open(os.path.join(self.cgroup, "cgroup.procs"), "w") as f:
                f.write(str(pid))
            self._send("go")
            self.started = self._reply(120 + count * 0.5)
        except BaseException:
            self.close()
            raise

    def set_limit(self, limit: int) -> None:
        fd = os.open(self.limit_file, os.O_WRONLY)
        try:
            os.write(fd, str(limit).encode())
        finally:
            os.close(fd)

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _reply(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise TimeoutError(f"fleet did not answer in {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"fleet exited: {err[-2000:]}")
        return json.loads(line)  # type: ignore[no-any-return]

    def command(self, line: str, timeout: float = 120) -> dict[str, Any]:
        self._send(line)
        return self._reply(timeout)

    def stderr_lines(self) -> int:
        """Lines the fleet wrote to stderr (after close())."""
        return len(self._err.splitlines())

    def close(self) -> None:
        self._err = ""
        try:
            if self.proc.poll() is None:
                try:
                    self._send("quit")
                    _, self._err = self.proc.communicate(timeout=60)
                except Exception:  # noqa: BLE001 - clean up whatever happens
                    self.proc.kill()
                    _, self._err = self.proc.communicate(timeout=30)
            else:
                _, self._err = self.proc.communicate(timeout=30)
        finally:
            # Also when the parent died and its orphaned children hold its stdout open.
            self._remove_cgroup()
            self._remove_shared_counts()

    def _remove_shared_counts(self) -> None:
        """The fleet's uid's shared counts (quota.py: one file per uid and user namespace,
        which outlives its processes by design): ours to remove, the uid being the bench's."""
        try:
            names = os.listdir("/dev/shm")
        except OSError:
            return
        for name in names:
            path = os.path.join("/dev/shm", name)
            try:
                if name.startswith("cgwatch-inotify-") and os.lstat(path).st_uid == self.uid:
                    os.unlink(path)
            except OSError:
                continue

    def _remove_cgroup(self) -> None:
        for _ in range(100):
            try:
                with open(os.path.join(self.cgroup, "cgroup.procs")) as f:
                    pids = [int(p) for p in f.read().split()]
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                os.rmdir(self.cgroup)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ESRCH):
                    raise
                time.sleep(0.1)


def measure(count: int, *, idle_seconds: float, ns_limit: int = 0, pool: bool = False,
            env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The node-scale row of one fleet of `count` processes (with a neighbour: another
    program of the uid making instances while they start)."""
    fleet = Fleet(count, ns_limit=ns_limit, pool=pool, env=env, neighbour=1.0)
    try:
        row: dict[str, Any] = {"processes": count, "modes": fleet.started["modes"],
                               "start_s": fleet.started["start_s"],
                               "neighbour": fleet.started["neighbour"]}
        # Instances the uid can still make, the least of 10 samples 50 ms apart (a
        # program starting at any of those moments gets at least that many).
        row["free_running"] = fleet.command("free 10")["free"]
        time.sleep(1.0)  # let anything that retries take instances back
        row["free_after_1s"] = fleet.command("free 10")["free"]
        right = late = 0
        trials = 5
        for i in range(trials):
            limit = (7 * GiB) - i * (1 << 20)
            fleet.set_limit(limit)
            got = fleet.command("ask")
            right += sum(1 for total in got["answers"] if total == limit)
            # an ask whose answers did not all come in 60 s (a loaded machine), not wrong ones
            late += count - len(got["answers"])
        row["answers_right"] = f"{right}/{trials * count}"
        row["answers_late"] = late
        row["idle_cpu_percent"] = round(fleet.command(f"idle {idle_seconds}",
                                                      timeout=idle_seconds + 60)["cpu_percent"], 3)
        fleet.command(f"exit {count // 2}")
        time.sleep(1.0)
        row["free_after_half_exit"] = fleet.command("free 10")["free"]
        row["modes_after"] = fleet.command("ask")["modes"]
    finally:
        fleet.close()
    row["stderr_lines"] = fleet.stderr_lines()
    return row


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.nodescale")
    parser.add_argument("--quick", action="store_true", help="one small fleet, short idle")
    parser.add_argument("--processes", default="1,130,300")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--userns-limit", type=int, default=0)
    parser.add_argument("--fork-pool", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.processes.split(",")]
    idle_seconds = args.idle_seconds
    ns_limit = args.userns_limit
    if args.quick:
        counts, idle_seconds, ns_limit = [24], 2.0, ns_limit or 8
    rows = []
    for count in counts:
        row = measure(count, idle_seconds=idle_seconds, ns_limit=ns_limit, pool=args.fork_pool)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nodescale": rows, "userns_limit": ns_limit,
                       "fork_pool": args.fork_pool}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
