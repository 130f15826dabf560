"""The loopback interface for the exporter's HTTP tests.

The cgroup v2 VM (tests/vm/run) boots a busybox init that never brings `lo` up, so even
127.0.0.1 answers ENETUNREACH there. Inside that throw-away guest (CGWATCH_IN_VM=1) the tests
bring it up themselves, with the same ioctl `ip link set lo up` makes; elsewhere they leave the
machine's network alone.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

from cgwatch.envswitch import switch_on

SIOCGIFFLAGS = 0x8913  # linux/sockios.h
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1  # linux/if.h
IFREQ = "16sh22x"  # struct ifreq: the name, then ifr_flags in a 24-byte union


def ensure_up_in_vm() -> None:
    if not switch_on("CGWATCH_IN_VM", os.environ):
        return
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack(IFREQ, b"lo", 0)
        flags = struct.unpack(IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        if not flags & IFF_UP:
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))
