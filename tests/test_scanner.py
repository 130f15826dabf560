"""The events scanner's state across scans, without a thread: baselines, the v2 carry of a kill
split over scans, memory.events.local folded into its event, v1 `oom` notifications attributed
to the level that ran out, resets, levels that come and go.

One table: each row is a path of levels in tmp_path (leaf first, with their limits), the
counter files written there before the first resync, and steps. A step writes counter files
(one write(2) on the existing inode, as the kernel's files behave), may signal v1 eventfds,
may resync to other levels, then scans at monotonic time `at`; the events it returns are
compared as (cgroup_path, counter, old, new, propagated[, local_old, local_new]) tuples (the
local pair only where the event has one). Expected values are written out, not recomputed.
The pure rules underneath are table-tested in tests/test_events_counters.py.
"""

from __future__ import annotations

import os
import select
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from cgwatch import notify
from cgwatch.event import Event
from cgwatch.kept import kept_dir
from cgwatch.scanner import CARRY_SECONDS, Scanner
from cgwatch.seam import Layout
from cgwatch.tree import Level

GiB = 1 << 30
MiB = 1 << 20

C, B, A, ROOT = "/a/b/c", "/a/b", "/a", "/"
V2_KEYS = ("low", "high", "max", "oom", "oom_kill", "oom_group_kill")

Levels = tuple[tuple[str, Optional[int]], ...]  # (cgroup path, limit), leaf first
File = tuple[str, Optional[str]]  # (file name, text; None: the file does not exist)
Expected = tuple[object, ...]

V2_PATH: Levels = ((C, None), (B, None), (A, GiB))
V2_WITH_ROOT: Levels = ((C, None), (B, None), (A, GiB), (ROOT, None))
V1_PATH: Levels = ((C, 512 * MiB), (B, None), (A, GiB))
LEAF: Levels = ((C, GiB),)


def ev(**counts: int) -> File:
    """v2 memory.events with these counters (0 for the rest)."""
    assert set(counts) <= set(V2_KEYS), counts
    return "memory.events", "".join(f"{k} {counts.get(k, 0)}\n" for k in V2_KEYS)


def loc(**counts: int) -> File:
    """v2 memory.events.local."""
    return "memory.events.local", ev(**counts)[1]


def ooc(oom_kill: int = 0, under_oom: int = 0) -> File:
    """v1 memory.oom_control (oom_kill_disable is a setting, never an event)."""
    return "memory.oom_control", f"oom_kill_disable 0\nunder_oom {under_oom}\noom_kill {oom_kill}\n"


def fail(count: int) -> File:
    """v1 memory.failcnt."""
    return "memory.failcnt", f"{count}\n"


def raw(name: str, text: Optional[str]) -> File:
    return name, text


@dataclass(frozen=True)
class Step:
    at: Optional[float]  # scan(now=at); None: this step does not scan
    expect: tuple[Expected, ...] = ()
    write: Mapping[str, Sequence[File]] = field(default_factory=dict)
    layout: Optional[Levels] = None  # resync to these levels (after the writes) first
    notify: Mapping[str, int] = field(default_factory=dict)  # v1: signals on a level's eventfd
    # v1: on_ready() for these levels' eventfds only, as the loop hands them over one by one;
    # None: drain_ooms() (every eventfd), as Events.scan_now does
    ready: Optional[tuple[str, ...]] = None


def S(at: Optional[float], *expect: Expected,
      write: Optional[Mapping[str, Sequence[File]]] = None, layout: Optional[Levels] = None,
      notify: Optional[Mapping[str, int]] = None, ready: Optional[tuple[str, ...]] = None) -> Step:
    return Step(at, expect, write or {}, layout, notify or {}, ready)


@dataclass(frozen=True)
class Row:
    version: int
    levels: Levels
    steps: tuple[Step, ...]
    initial: Optional[Mapping[str, Sequence[File]]] = None  # None: every counter 0
    efds: tuple[str, ...] = ()  # v1: levels given an `oom_control` eventfd after each resync


def row(version: int, levels: Levels, *steps: Step,
        initial: Optional[Mapping[str, Sequence[File]]] = None, efds: tuple[str, ...] = (),
        id: str, marks: Sequence[pytest.MarkDecorator] = ()) -> object:
    return pytest.param(Row(version, levels, steps, initial, efds), id=id, marks=marks)


F, T = False, True

ROWS = [
    # ---- v2 baselines ----------------------------------------------------------------------
    row(2, V2_PATH,
        S(0.0),
        S(0.1, (C, "max", 7, 8, F), (B, "max", 7, 8, T), (A, "max", 9, 10, T),
          write={C: [ev(oom_kill=3, max=8)], B: [ev(oom_kill=3, max=8)],
                 A: [ev(oom_kill=5, max=10)]}),
        initial={C: [ev(oom_kill=3, max=7)], B: [ev(oom_kill=3, max=7)],
                 A: [ev(oom_kill=5, max=9)]},
        id="v2-nonzero-at-first-resync-is-baseline"),
    row(2, LEAF,
        S(0.0, write={C: [ev(max=4)]}),  # the empty read was no baseline: this is
        S(0.1, (C, "max", 4, 5, F), write={C: [ev(max=5)]}),
        initial={C: [raw("memory.events", "")]},
        id="v2-empty-at-first-baseline-when-it-has-counters"),
    row(2, LEAF,
        S(0.0, write={C: [raw("memory.events", "")]}),  # mid-rewrite: the old baseline stays
        S(0.1, (C, "max", 1, 3, F), write={C: [ev(max=3)]}),
        initial={C: [ev(max=1)]},
        id="v2-empty-read-later-keeps-the-baseline"),
    row(2, LEAF,
        S(0.0, write={C: [ev(max=4)]}),
        S(0.1, (C, "max", 4, 5, F), write={C: [ev(max=5)]}),
        initial={C: [raw("memory.events", "garbage without numbers\n")]},
        id="v2-unparsable-at-first-baseline-when-it-parses"),
    row(2, LEAF,
        S(0.0, write={C: [ev(max=4)]}),
        S(0.1, (C, "max", 4, 5, F), write={C: [ev(max=5)]}),
        initial={C: []},
        id="v2-missing-at-first-baseline-when-it-appears"),
    row(2, LEAF,
        S(0.0, write={C: [ev(oom_kill=2, max=1)]}),  # went down: reset, not a rise
        S(0.1, (C, "oom_kill", 2, 3, F), write={C: [ev(oom_kill=3, max=1)]}),
        initial={C: [ev(oom_kill=5, max=9)]},
        id="v2-reset-is-not-a-rise-and-the-new-baseline"),
    # ---- v2 propagation and the carry of a split kill --------------------------------------
    row(2, V2_PATH,
        # (a) the whole kill in one scan; `oom` rose at the limited level /a only
        S(0.0, (C, "oom_kill", 0, 1, F), (B, "oom_kill", 0, 1, T), (A, "oom", 0, 1, F),
          (A, "oom_kill", 0, 1, T),
          write={C: [ev(oom_kill=1)], B: [ev(oom_kill=1)], A: [ev(oom=1, oom_kill=1)]}),
        id="v2-split-a-one-scan"),
    row(2, V2_PATH,
        # (b) leaf in scan 1, parent and grandparent in scan 2
        S(0.0, (C, "oom_kill", 0, 1, F), write={C: [ev(oom_kill=1)]}),
        S(0.05, (B, "oom_kill", 0, 1, T), (A, "oom_kill", 0, 1, T),
          write={B: [ev(oom_kill=1)], A: [ev(oom_kill=1)]}),
        id="v2-split-b-leaf-then-parent-and-grandparent"),
    row(2, V2_PATH,
        # (c) one level per scan
        S(0.0, (C, "oom_kill", 0, 1, F), write={C: [ev(oom_kill=1)]}),
        S(0.05, (B, "oom_kill", 0, 1, T), write={B: [ev(oom_kill=1)]}),
        S(0.1, (A, "oom_kill", 0, 1, T), write={A: [ev(oom_kill=1)]}),
        id="v2-split-c-leaf-parent-grandparent-in-three-scans"),
    row(2, V2_PATH,
        # (d) past CARRY_SECONDS the parent's rise is its own; the grandparent's repeats it
        S(0.0, (C, "oom_kill", 0, 1, F), write={C: [ev(oom_kill=1)]}),
        S(1.5, (B, "oom_kill", 0, 1, F), (A, "oom_kill", 0, 1, T),
          write={B: [ev(oom_kill=1)], A: [ev(oom_kill=1)]}),
        id="v2-split-d-parent-after-carry-seconds-is-its-own"),
    row(2, V2_PATH,
        S(0.0, (C, "oom_kill", 0, 1, F), write={C: [ev(oom_kill=1)]}),
        S(1.5, (B, "oom_kill", 0, 1, F), write={B: [ev(oom_kill=1)]}),
        S(1.6, (A, "oom_kill", 0, 1, T), write={A: [ev(oom_kill=1)]}),  # carried from /a/b
        id="v2-split-d-late-parent-own-then-carried-to-grandparent"),
    row(2, V2_PATH,
        S(0.0, (C, "oom_kill", 0, 1, F), write={C: [ev(oom_kill=1)]}),
        S(CARRY_SECONDS, (B, "oom_kill", 0, 1, T), (A, "oom_kill", 0, 1, T),
          write={B: [ev(oom_kill=1)], A: [ev(oom_kill=1)]}),
        id="v2-carry-boundary-exactly-carry-seconds-still-carried"),
    row(2, V2_PATH,
        # (e) a sibling's kill at the parent in the same scan as our leaf's
        S(0.0, (C, "oom_kill", 0, 1, F), (B, "oom_kill", 0, 2, F), (A, "oom_kill", 0, 2, T),
          write={C: [ev(oom_kill=1)], B: [ev(oom_kill=2)], A: [ev(oom_kill=2)]}),
        id="v2-split-e-sibling-kill-at-parent-same-scan"),
    row(2, V2_PATH,
        S(0.0, (C, "oom_kill", 0, 1, F), write={C: [ev(oom_kill=1)]}),
        S(0.05, (B, "oom_kill", 0, 2, F), (A, "oom_kill", 0, 2, T),
          write={B: [ev(oom_kill=2)], A: [ev(oom_kill=2)]}),
        id="v2-sibling-kill-at-parent-after-a-split"),
    row(2, V2_PATH,
        # two kills at the leaf; the parent shows one of them in the same scan
        S(0.0, (C, "oom_kill", 0, 2, F), (B, "oom_kill", 0, 1, T),
          write={C: [ev(oom_kill=2)], B: [ev(oom_kill=1)]}),
        S(0.05, (B, "oom_kill", 1, 2, T), (A, "oom_kill", 0, 2, T),
          write={B: [ev(oom_kill=2)], A: [ev(oom_kill=2)]}),
        id="v2-two-kills-split-unevenly"),
    row(2, V2_PATH,
        S(0.0, (C, "oom_kill", 0, 1, F), write={C: [ev(oom_kill=1)]}),
        S(0.3),  # nothing new: the carry waits
        S(0.6, (B, "oom_kill", 0, 1, T), (A, "oom_kill", 0, 1, T),
          write={B: [ev(oom_kill=1)], A: [ev(oom_kill=1)]}),
        id="v2-carry-survives-a-quiet-scan"),
    row(2, V2_PATH,
        S(0.0, (C, "oom_kill", 0, 1, F), write={C: [ev(oom_kill=1)]}),
        S(0.05, write={B: [raw("memory.events", "")], A: [raw("memory.events", "")]}),
        S(0.1, (B, "oom_kill", 0, 1, T), (A, "oom_kill", 0, 1, T),
          write={B: [ev(oom_kill=1)], A: [ev(oom_kill=1)]}),
        id="v2-carry-survives-an-empty-read-of-the-parents"),
    row(2, V2_PATH,
        # each counter has its own carry
        S(0.0, (C, "max", 0, 1, F), (C, "oom_kill", 0, 1, F), (B, "max", 0, 1, T),
          write={C: [ev(max=1, oom_kill=1)], B: [ev(max=1)]}),
        S(0.05, (B, "oom_kill", 0, 1, T), (A, "max", 0, 1, T), (A, "oom_kill", 0, 1, T),
          write={B: [ev(max=1, oom_kill=1)], A: [ev(max=1, oom_kill=1)]}),
        id="v2-carry-per-counter"),
    row(2, V2_WITH_ROOT,
        # the v2 root has no memory.events; it never shows anything
        S(0.0, (C, "oom_kill", 0, 1, F), (B, "oom_kill", 0, 1, T), (A, "oom_kill", 0, 1, T),
          write={C: [ev(oom_kill=1)], B: [ev(oom_kill=1)], A: [ev(oom_kill=1)]}),
        S(0.5),
        S(1.5),
        S(1.6, (C, "oom_kill", 1, 2, F), write={C: [ev(oom_kill=2)]}),
        S(1.65, (B, "oom_kill", 1, 2, T), (A, "oom_kill", 1, 2, T),
          write={B: [ev(oom_kill=2)], A: [ev(oom_kill=2)]}),
        initial={C: [ev()], B: [ev()], A: [ev()], ROOT: []},
        id="v2-root-without-memory-events"),
    row(2, V2_WITH_ROOT,
        S(0.0, (C, "oom_kill", 0, 1, F), (B, "oom_kill", 0, 1, T), (A, "oom_kill", 0, 1, T),
          write={C: [ev(oom_kill=1)], B: [ev(oom_kill=1)], A: [ev(oom_kill=1)]}),
        # a second kill 0.98 s after the first, split: the parents show it 0.03 s later
        S(0.98, (C, "oom_kill", 1, 2, F), write={C: [ev(oom_kill=2)]}),
        S(1.01, (B, "oom_kill", 1, 2, T), (A, "oom_kill", 1, 2, T),
          write={B: [ev(oom_kill=2)], A: [ev(oom_kill=2)]}),
        initial={C: [ev()], B: [ev()], A: [ev()], ROOT: []},
        id="v2-carry-window-runs-from-the-latest-rise"),
    # ---- v2 memory.events.local ------------------------------------------------------------
    row(2, V2_PATH,
        S(0.0, (C, "oom_kill", 0, 1, F, 0, 1), (B, "oom_kill", 0, 1, T, 0, 0),
          (A, "oom_kill", 0, 1, T),  # /a has no memory.events.local here: no local pair
          write={C: [ev(oom_kill=1), loc(oom_kill=1)], B: [ev(oom_kill=1)],
                 A: [ev(oom_kill=1)]}),
        # a process in /a/b itself is killed
        S(0.1, (B, "oom_kill", 1, 2, F, 0, 1), (A, "oom_kill", 1, 2, T),
          write={B: [ev(oom_kill=2), loc(oom_kill=1)], A: [ev(oom_kill=2)]}),
        initial={C: [ev(), loc()], B: [ev(), loc()], A: [ev()]},
        id="v2-local-folded-into-the-event"),
    row(2, LEAF,
        S(0.0, (C, "max", 9, 10, F, 9, 10), write={C: [ev(oom_kill=4, max=10),
                                                       loc(oom_kill=4, max=10)]}),
        S(0.1, (C, "oom_kill", 4, 5, F, 4, 5), write={C: [ev(oom_kill=5, max=10),
                                                          loc(oom_kill=5, max=10)]}),
        initial={C: [ev(oom_kill=4, max=9), loc(oom_kill=4, max=9)]},
        id="v2-local-nonzero-at-first-resync-is-baseline"),
    row(2, LEAF,
        # a rise of memory.events.local alone is never an event of its own
        S(0.0, write={C: [ev(oom_kill=1), loc(oom_kill=1)]}),
        initial={C: [ev(oom_kill=1), loc()]},
        id="v2-local-rise-alone-is-no-event"),
    row(2, LEAF,
        S(0.0, write={C: [ev(), loc()]}),  # the local file's baseline: oom_kill 0
        S(0.1, (C, "oom_kill", 0, 1, F, 0, 1), write={C: [ev(oom_kill=1), loc(oom_kill=1)]}),
        initial={C: [ev(), raw("memory.events.local", "")]},
        id="v2-local-empty-at-first-then-its-baseline"),
    row(2, LEAF,
        S(0.0, write={C: [ev(), loc()]}),  # reset (re-created cgroup): both back to 0
        S(0.1, (C, "oom_kill", 0, 1, F, 0, 1), write={C: [ev(oom_kill=1), loc(oom_kill=1)]}),
        initial={C: [ev(oom_kill=5), loc(oom_kill=5)]},
        id="v2-local-after-a-reset"),
    row(2, LEAF,
        # the local file rises a scan before memory.events (the kernel writes them apart, and
        # `cgwatch run`'s explanation reads local_old..local_new as this level's own share)
        S(0.0, write={C: [loc(oom=1, max=9)]}),
        S(0.1, (C, "max", 0, 9, F, 0, 9), (C, "oom", 0, 1, F, 0, 1),
          write={C: [ev(oom=1, max=9)]}),
        initial={C: [ev(), loc()]},
        id="v2-local-rise-seen-a-scan-before-the-hierarchical-one"),
    # ---- v2 levels that come and go --------------------------------------------------------
    row(2, ((B, None), (A, GiB)),
        # /a/b/c joins the path with oom_kill 2 already: a baseline, no event
        S(0.0, (B, "oom_kill", 0, 1, F), (A, "oom_kill", 0, 1, T),
          write={C: [ev(oom_kill=2)], B: [ev(oom_kill=1)], A: [ev(oom_kill=1)]},
          layout=V2_PATH),
        S(0.1, (C, "oom_kill", 2, 3, F), (B, "oom_kill", 1, 2, T), (A, "oom_kill", 1, 2, T),
          write={C: [ev(oom_kill=3)], B: [ev(oom_kill=2)], A: [ev(oom_kill=2)]}),
        initial={C: [ev()], B: [ev()], A: [ev()]},
        id="v2-level-first-seen-later-gets-a-baseline"),
    row(2, V2_PATH,
        S(0.0, write={C: [ev(oom_kill=1)]}, layout=((B, None), (A, GiB))),
        # back on the path: what it rose by while away is its baseline, not a rise
        S(0.1, write={C: [ev(oom_kill=2)]}, layout=V2_PATH),
        S(0.2, (C, "oom_kill", 2, 3, F), write={C: [ev(oom_kill=3)]}),
        id="v2-level-removed-is-forgotten"),
    row(2, V2_PATH,
        # a limit change keeps the baselines: the rise across it is reported
        S(0.0, (C, "oom_kill", 0, 1, F), (B, "oom_kill", 0, 1, T), (A, "oom_kill", 0, 1, T),
          write={C: [ev(oom_kill=1)], B: [ev(oom_kill=1)], A: [ev(oom_kill=1)]},
          layout=((C, None), (B, None), (A, 2 * GiB))),
        id="v2-limit-change-keeps-baselines"),
    row(2, V2_PATH,
        S(0.0, write={C: [ev(oom_kill=1)]}, layout=()),  # no memory cgroup (version None)
        S(0.1, write={C: [ev(oom_kill=2)]}, layout=V2_PATH),  # back: baselines again
        S(0.2, (C, "oom_kill", 2, 3, F), write={C: [ev(oom_kill=3)]}),
        id="v2-no-cgroup-then-back"),
    # ---- v1 counters -----------------------------------------------------------------------
    row(1, V1_PATH,
        S(0.0),
        S(0.1, (C, "oom_kill", 2, 3, F), (A, "failcnt", 10, 11, F),
          write={C: [ooc(oom_kill=3)], A: [fail(11)]}),
        initial={C: [ooc(oom_kill=2), fail(4)], B: [ooc(), fail(0)], A: [ooc(), fail(10)]},
        id="v1-nonzero-at-first-resync-is-baseline"),
    row(1, V1_PATH,
        # v1 counters are not hierarchical: two levels rising are two events of their own
        S(0.0, (C, "oom_kill", 0, 1, F), (B, "oom_kill", 0, 1, F),
          write={C: [ooc(oom_kill=1)], B: [ooc(oom_kill=1)]}),
        id="v1-never-propagated"),
    row(1, V1_PATH,
        S(0.0, (A, "under_oom", 0, 1, F), write={A: [ooc(under_oom=1)]}),
        S(0.1, write={A: [ooc(under_oom=0)]}),  # cleared: not a rise
        S(0.2, (A, "under_oom", 0, 1, F), write={A: [ooc(under_oom=1)]}),
        id="v1-under-oom-clears-and-rises-again"),
    row(1, V1_PATH,
        S(0.0, write={C: [fail(0)]}),
        S(0.1, (C, "failcnt", 0, 1, F), write={C: [fail(1)]}),
        initial={C: [ooc(), fail(10)], B: [ooc(), fail(0)], A: [ooc(), fail(0)]},
        id="v1-failcnt-reset-is-not-a-rise"),
    row(1, V1_PATH,
        S(0.0, write={C: [fail(3)]}),
        S(0.1, (C, "failcnt", 3, 4, F), write={C: [fail(4)]}),
        initial={C: [ooc(), raw("memory.failcnt", "")], B: [ooc(), fail(0)],
                 A: [ooc(), fail(0)]},
        id="v1-failcnt-empty-at-first-baseline-later"),
    # ---- v1 `oom` notifications ------------------------------------------------------------
    row(1, V1_PATH,
        # an OOM at /a notifies /a and the levels below it; then the kill lands in /a/b/c
        S(0.0, (A, "oom", 0, 1, F), (C, "oom_kill", 0, 1, F), (A, "under_oom", 0, 1, F),
          notify={C: 1, A: 1}, write={C: [ooc(oom_kill=1)], A: [ooc(under_oom=1)]}),
        efds=(C, A),
        id="v1-oom-at-the-parent-attributed-to-it"),
    row(1, V1_PATH,
        S(0.0, (C, "oom", 0, 1, F), notify={C: 1}),
        S(0.1, (C, "oom", 1, 2, F), (C, "oom_kill", 0, 1, F), notify={C: 1},
          write={C: [ooc(oom_kill=1)]}),
        efds=(C, A),
        id="v1-oom-at-the-leaf-counts-on"),
    row(1, V1_PATH,
        S(0.0, (C, "oom", 0, 1, F), (A, "oom", 0, 1, F), notify={C: 2, A: 1}),
        S(0.1, (A, "oom", 1, 2, F), notify={C: 1, A: 1}),
        efds=(C, A),
        id="v1-oom-at-both-levels"),
    row(1, V1_PATH,
        S(None, notify={C: 1}),  # drained, not yet scanned
        S(None, notify={C: 1}),
        S(0.0, (C, "oom", 0, 2, F)),
        efds=(C, A),
        id="v1-drained-notifications-add-up-until-a-scan"),
    row(1, V1_PATH,
        S(0.0, (A, "oom", 0, 2, F), notify={C: 1, A: 2}),  # read mid-notification: never < 0
        efds=(C, A),
        id="v1-ancestor-count-larger-never-negative"),
    row(1, V1_PATH,
        # no eventfd at /a: /a/b/c's notifications are all its own
        S(0.0, (C, "oom", 0, 1, F), notify={C: 1}),
        efds=(C,),
        id="v1-no-registered-ancestor"),
    row(1, V1_PATH,
        # An OOM at /a signals both eventfds; the loop hands them over one by one
        # (events.py: on_ready(fd) then a scan, per descriptor).
        S(0.0, (A, "oom", 0, 1, F), notify={C: 1, A: 1}, ready=(C,)),
        S(0.001, ready=(A,)),
        efds=(C, A),
        id="v1-oom-at-the-parent-leaf-descriptor-handed-over-first"),
]


class Tree:
    """Cgroup directories under tmp_path and the Layouts of their levels."""

    def __init__(self, root: Path, version: int) -> None:
        self.root = root
        self.version = version
        self.generation = 0

    def directory(self, cgroup_path: str) -> str:
        return str(self.root / "cg" / cgroup_path.lstrip("/"))

    def write(self, files: Mapping[str, Sequence[File]]) -> None:
        for cgroup_path, texts in files.items():
            os.makedirs(self.directory(cgroup_path), exist_ok=True)
            for name, text in texts:
                path = os.path.join(self.directory(cgroup_path), name)
                if text is None:
                    if os.path.exists(path):
                        os.remove(path)
                    continue
                # One write(2) on the existing inode, as the kernel's files behave.
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, text.encode())
                finally:
                    os.close(fd)

    def layout(self, levels: Levels) -> Layout:
        self.generation += 1
        if not levels:
            return Layout(None, (), self.generation)
        made = []
        for cgroup_path, limit in levels:
            directory = self.directory(cgroup_path)
            os.makedirs(directory, exist_ok=True)
            made.append(Level(cgroup_path, directory, limit, None, kept_dir(directory)))
        return Layout(self.version, tuple(made), self.generation)


def default_files(version: int, levels: Levels) -> dict[str, list[File]]:
    files = [ev()] if version == 2 else [ooc(), fail(0)]
    return {cgroup_path: list(files) for cgroup_path, _ in levels}


def attach_efds(scanner: Scanner, paths: tuple[str, ...]) -> None:
    """Real eventfds where the scanner would register `memory.oom_control` ones (closed by
    scanner.close(), or by resync when the level leaves)."""
    for lvl in scanner.levels:
        if lvl.cgroup_path in paths and lvl.oom_efd is None:
            lvl.oom_efd = notify.eventfd()


def efd_of(scanner: Scanner, cgroup_path: str) -> int:
    fd = next(lvl.oom_efd for lvl in scanner.levels if lvl.cgroup_path == cgroup_path)
    assert fd is not None
    return fd


def shown(event: Event) -> Expected:
    brief = (event.cgroup_path, event.counter, event.old, event.new, event.propagated)
    if event.local_old is None and event.local_new is None:
        return brief
    return (*brief, event.local_old, event.local_new)


def check_fields(event: Event, scanner: Scanner, version: int, at: float) -> None:
    """What the table does not spell out: the event names its level as the scanner has it."""
    lvl = scanner.levels[event.level]
    assert (event.cgroup_path, event.directory, event.limit) == \
        (lvl.cgroup_path, lvl.directory, lvl.limit)
    assert (event.version, event.time) == (version, at)
    if event.counter == "oom" and version == 1:
        assert event.source == "cgroup.event_control"
    else:
        assert event.source in (("memory.events",) if version == 2 else
                                ("memory.oom_control", "memory.failcnt"))


@pytest.mark.parametrize("case", ROWS)
def test_scanner_across_scans(case: Row, tmp_path: Path) -> None:
    tree = Tree(tmp_path, case.version)
    tree.write(case.initial if case.initial is not None
               else default_files(case.version, case.levels))
    scanner = Scanner(use_eventfd=True, psi_trigger="")
    try:
        assert scanner.resync(tree.layout(case.levels))
        attach_efds(scanner, case.efds)
        got: list[Optional[tuple[Expected, ...]]] = []
        for step in case.steps:
            tree.write(step.write)
            if step.layout is not None:
                assert scanner.resync(tree.layout(step.layout))
                attach_efds(scanner, case.efds)
            for cgroup_path, count in step.notify.items():
                os.write(efd_of(scanner, cgroup_path), count.to_bytes(8, "little"))
            if step.ready is None:
                scanner.drain_ooms()
            else:
                for cgroup_path in step.ready:
                    assert scanner.on_ready(efd_of(scanner, cgroup_path), select.POLLIN) == "oom"
            if step.at is None:
                got.append(None)
                continue
            found = scanner.scan(step.at)
            for event in found:
                check_fields(event, scanner, case.version, step.at)
            got.append(tuple(shown(e) for e in found))
        assert got == [None if step.at is None else step.expect for step in case.steps]
    finally:
        scanner.close()
    assert scanner.levels == []


def test_resync_same_levels_is_no_change(tmp_path: Path) -> None:
    tree = Tree(tmp_path, 2)
    tree.write(default_files(2, V2_PATH))
    scanner = Scanner(use_eventfd=True, psi_trigger="")
    try:
        assert scanner.resync(tree.layout(V2_PATH))
        first = list(scanner.levels)
        # a new generation with the same levels (a re-resolve): the same WatchedLevels
        assert not scanner.resync(tree.layout(V2_PATH))
        assert scanner.levels == first
        assert scanner.resync(tree.layout(((C, None), (B, None), (A, 2 * GiB))))
        assert [lvl.limit for lvl in scanner.levels] == [None, None, 2 * GiB]
        assert scanner.levels == first  # the limit changed, the watched levels stayed
    finally:
        scanner.close()


def test_limit_above(tmp_path: Path) -> None:
    tree = Tree(tmp_path, 2)
    scanner = Scanner(use_eventfd=True, psi_trigger="")
    try:
        scanner.resync(tree.layout(((C, None), (B, 256 * MiB), (A, GiB), (ROOT, None))))
        assert scanner.limit_above(0) == (256 * MiB, B)
        assert scanner.limit_above(1) == (256 * MiB, B)
        assert scanner.limit_above(2) == (GiB, A)
        assert scanner.limit_above(3) is None
    finally:
        scanner.close()
