"""Reading a cgroup's files straight from the kernel, independent of cgwatch; shared by the
tests and by the child processes they start (tests/probe_child.py). Standard library only:
a child that imported pytest (through tests/cgroup_helpers.py) paid 0.1 s here and 3-8 s
under the VM tier's emulation, once per probe."""

from __future__ import annotations

import os


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def measured_headroom(directory: str, version: int) -> int:
    """limit - (usage - inactive_file) read straight from the files (independent of cgwatch)."""
    names = ("memory.max", "memory.current", "inactive_file") if version == 2 else (
        "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    limit = int(read(os.path.join(directory, names[0])))
    usage = int(read(os.path.join(directory, names[1])))
    stat = dict(line.split() for line in read(os.path.join(directory, "memory.stat")).splitlines())
    return limit - max(0, usage - int(stat[names[2]]))
