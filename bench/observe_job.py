"""The job of docs/guard.md's replay picture (docs/img/replay-observe.png): 60 MiB, then three
evaluations of 110 MiB held 1 s and freed, then a leak of 10 MiB/s until the kernel ends it.
Pages from anonymous mmaps (a free gives them back), paced in small sleeps.

    sudo .venv/bin/python -m cgwatch.cli run --guard --observe --record job.rec -- \\
        .venv/bin/python bench/observe_job.py     # in a cgroup limited to 256 MiB
    .venv/bin/python -m cgwatch.cli replay job.rec --reserve 35% --plot replay.png
"""

from __future__ import annotations

import mmap
import time

MiB = 1 << 20


def take(mib: int, seconds: float) -> list[mmap.mmap]:
    """`mib` MiB over `seconds`, written (an allocation alone maps the zero page)."""
    out, t0 = [], time.monotonic()
    for i in range(mib):
        m = mmap.mmap(-1, MiB)
        m.write(b"\x5a" * MiB)
        out.append(m)
        while time.monotonic() < t0 + (i + 1) * seconds / mib:
            time.sleep(0.002)
    return out


def main() -> None:
    print("started", flush=True)
    held = take(60, 1.0)
    time.sleep(1.0)
    for _ in range(3):  # evaluations
        spike = take(110, 1.0)
        time.sleep(1.0)
        for m in spike:
            m.close()
        time.sleep(1.5)
    while True:  # the leak
        held += take(10, 1.0)


if __name__ == "__main__":
    main()
