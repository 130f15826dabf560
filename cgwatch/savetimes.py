"""Internal. What a save takes, learned from the job's own periodic checkpoints: the files a
checkpoint directory saw written, grouped into saves (`SaveFinder`), the saves worth a lead
kept and persisted (`Learned`). Pure: the events come from cli/ckptwatch.py (inotify, or
listings when it polls), their times from its clock.

One save is one *burst* of files written: HF's `checkpoint-<step>/` (config, model,
optimizer, scheduler, RNG and trainer state, written back to back: 8 files in 0.25 s for a
62 MiB checkpoint here, transformers 5.24), a Lightning `.ckpt`, a `torch.save` file, a
job's own `step-K.json` written to a temporary name and renamed. A file is written from its
open to its close after writing (IN_OPEN .. IN_CLOSE_WRITE; a rename carries it); files
whose writes come within QUIET seconds of each other are one save, and a save is over once
QUIET seconds passed with none of the files opened meanwhile still open (a 32 GiB optimizer
file raises no event between its open and its close). Its time is the first open to the last
close; its size the files' sizes at their last close. A file that arrived whole (renamed in
from outside the directory: Lightning 2.6 serializes into memory, writes a temporary file in
$TMPDIR and moves it in; or found whole by a listing) counts in the size, not the time: a
save of such files only is *untimed* (`seconds` None).

Not saves: a file held open between writes (TensorBoard's event file, a log: opened at the
start, closed at the end) is written slower than SLOWEST bytes/s over more than a second and
is left out; a save under MIN_BYTES, or under 1/SMALLER of the largest save kept (a CSV
flush, a trainer_state.json rewritten), teaches nothing about the checkpoint and is not kept
(`Learned.worth`): one such tiny "save" would otherwise take the place of the real one as the
longest of the guard's last saves.

What a save seen on disk misses: the time before its first write (reaching a step's end,
gathering the state, Lightning's serialization into memory). So a learned save is at least
policy.MIN_SAVE_SECONDS, and `run --guard` also learns each stop's own save, signal to
exit (`SIGNAL`).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from .frozen import Frozen, fill
from .policy import MIN_SAVE_SECONDS

# Event kinds fed to SaveFinder (modes are module-level strings)
OPENED = "opened"  # a file opened (for writing or reading: inotify does not say which)
CLOSED = "closed"  # a file closed without writing (IN_CLOSE_NOWRITE): a read, no save
WRITTEN = "written"  # a file closed after writing (IN_CLOSE_WRITE), with its size
MOVED = "moved"  # a file renamed to `path` (from `old`, or from outside: None), its size

# How a save was learned
WATCHED = "watched"  # written into the checkpoint directory (SaveFinder)
SIGNAL = "signal"  # a stop's save under `run --guard`: the signal to CMD's end

QUIET = 2.0  # seconds without a write that end a save
HELD = 600.0  # seconds a save waits at most for a file opened in it that stays open
SLOWEST = 1 << 20  # bytes/s: a file written slower over more than 1 s is a log held open
MIN_BYTES = 1 << 20  # a smaller save is no checkpoint worth learning from
SMALLER = 8  # a save under 1/SMALLER of the largest kept is a side file's write, not a save
KEPT = 8  # saves kept (the file stays small whatever the run time)
_OPENS_KEPT = 256  # files remembered open (oldest forgotten first)
NAME_CHARS = 200  # a save's name is cut to this in the state


class Save(Frozen):
    """One save seen: when (`start`, `end`: the feeder's clock), its `bytes`, its `seconds`
    (first open to last close; None when no file of it was seen written: untimed), how many
    files, and `name`: DIR's entry its largest file is (or is under): `checkpoint-10`,
    `step-10.pt`."""

    __slots__ = _fields = ("start", "end", "bytes", "seconds", "files", "name")
    start: float
    end: float
    bytes: int
    seconds: Optional[float]
    files: int
    name: str

    def __init__(self, start: float, end: float, bytes: int, seconds: Optional[float],
                 files: int, name: str) -> None:
        fill(self, locals())


class _Burst:
    """A save being seen: its files' sizes by path, the first open and last close of the
    files seen written, and the last write of any."""

    def __init__(self, start: Optional[float], end: float, path: str) -> None:
        self.start = start  # None: no file of it seen written, only arrived
        self.closed = end if start is not None else None
        self.first = end  # the first file's close or arrival
        self.last = end
        self.name, below, _ = path.partition("/")
        self.directory = bool(below)  # written into a directory of DIR (HF's checkpoint-N)
        self.sizes: dict[str, int] = {}

    def other_directory(self, path: str) -> bool:
        """Whether `path` is in another directory of DIR than this save's files: another
        save (HF's checkpoint-20/ after checkpoint-10/, however soon)."""
        name, below, _ = path.partition("/")
        return self.directory and bool(below) and name != self.name

    def save(self) -> Save:
        seconds = None if self.start is None or self.closed is None else \
            max(0.0, self.closed - self.start)
        start = self.first if self.start is None else min(self.start, self.first)
        largest = max(self.sizes, key=self.sizes.__getitem__, default=self.name)
        return Save(start, self.last, sum(self.sizes.values()), seconds, len(self.sizes),
                    largest.partition("/")[0])


class SaveFinder:
    """Saves from a directory's file events fed in time order (`feed`); `due(now)` gives
    those over (module docstring: the rule), `flush()` every one still open. Paths are
    relative to the watched directory, "/"-separated. Bounded: one save at a time, at most
    _OPENS_KEPT open files remembered."""

    def __init__(self, quiet: float = QUIET, held: float = HELD) -> None:
        self.quiet = quiet
        self.held = held
        self._opens: dict[str, float] = {}  # path -> when opened (not yet closed)
        self._burst: Optional[_Burst] = None
        self._done: list[Save] = []

    def feed(self, time: float, kind: str, path: str, size: Optional[int] = None,
             old: Optional[str] = None) -> None:
        """One event: `kind` OPENED, CLOSED, WRITTEN (`size`) or MOVED (`size`, `old`)."""
        if kind == OPENED:
            self._opens.setdefault(path, time)
            if len(self._opens) > _OPENS_KEPT:
                del self._opens[min(self._opens, key=self._opens.__getitem__)]
        elif kind == CLOSED:
            self._opens.pop(path, None)
        elif kind == MOVED and old is not None:
            self._rename(old, path)
            burst = self._burst
            if burst is not None and path in burst.sizes and size is not None:
                burst.sizes[path] = size
        elif kind in (WRITTEN, MOVED):
            opened = self._opens.pop(path, None) if kind == WRITTEN else None
            self._wrote(time, path, max(0, size or 0), opened)

    def _rename(self, old: str, new: str) -> None:
        """A file or a directory renamed inside the tree: what is known of it follows."""
        def moved(path: str) -> Optional[str]:
            if path == old:
                return new
            return new + path[len(old):] if path.startswith(old + "/") else None

        for path in [p for p in self._opens if moved(p) is not None]:
            self._opens[moved(path) or path] = self._opens.pop(path)
        burst = self._burst
        if burst is None:
            return
        for path in [p for p in burst.sizes if moved(p) is not None]:
            burst.sizes[moved(path) or path] = burst.sizes.pop(path)
        if burst.name == old:  # the save's directory renamed into place (tmp-checkpoint-N)
            burst.name = new

    def _wrote(self, time: float, path: str, size: int, opened: Optional[float]) -> None:
        if opened is not None and time - opened > 1.0 and size < (time - opened) * SLOWEST:
            return  # held open between writes: a log, not a save's file
        burst = self._burst
        begins = opened if opened is not None else time
        if burst is not None and (begins > burst.last + self.quiet
                                  or burst.other_directory(path)):
            self._done.append(burst.save())
            burst = None
        if burst is None:
            burst = self._burst = _Burst(opened, time, path)
        elif opened is not None:
            burst.start = opened if burst.start is None else min(burst.start, opened)
            burst.closed = time if burst.closed is None else max(burst.closed, time)
        burst.last = max(burst.last, time)
        burst.sizes[path] = size

    def due(self, now: float) -> list[Save]:
        """The saves over by `now`: QUIET seconds after the last write, no file opened since
        the save began still open (at most HELD seconds)."""
        burst = self._burst
        if burst is not None and now - burst.last > self.quiet:
            since = burst.save().start - self.quiet
            if not any(since <= t and now - t < self.held for t in self._opens.values()):
                self._done.append(burst.save())
                self._burst = None
        done, self._done = self._done, []
        return done

    def flush(self) -> list[Save]:
        """Every save seen, the one still being written included (the watch ends)."""
        if self._burst is not None:
            self._done.append(self._burst.save())
            self._burst = None
        done, self._done = self._done, []
        return done


def find_saves(events: list[tuple[Any, ...]], quiet: float = QUIET) -> list[Save]:
    """The saves in a recorded sequence of events, each (time, kind, path[, size[, old]]),
    in time order, `due()` asked at each (an event of another kind, "tick", asks only
    that: the watching thread's turn): feed all, then flush (the tests' tables)."""
    finder = SaveFinder(quiet)
    done: list[Save] = []
    for time, kind, path, *rest in events:
        finder.feed(time, kind, path, *rest)
        done.extend(finder.due(time))
    return done + finder.flush()


def listing_events(before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]],
                   polled_before: float) -> list[tuple[float, str, str, int]]:
    """The events two listings of the directory show (path -> (size, mtime), the times on
    the clock of the mtimes), for polling where inotify cannot watch: each file new or
    changed since the listing taken at `polled_before` was opened after it at the latest
    (the earliest it can have begun: a save's time is never under-counted by more than the
    kernel's coarse file clock) and written at its mtime, in time order."""
    events: list[tuple[float, str, str, int]] = []
    for path, (size, mtime) in after.items():
        if before.get(path) != (size, mtime):
            events.append((min(polled_before, mtime), OPENED, path, 0))
            events.append((mtime, WRITTEN, path, size))
    return sorted(events, key=lambda e: (e[0], e[1] != OPENED))


class Learned(Frozen):
    """What a job's saves taught, oldest first: each a dict with `seconds` (None: untimed),
    `bytes` (None: unknown), `how` (WATCHED or SIGNAL), `name` and `at` (wall-clock time),
    at most KEPT; `guard`: the guard's own state (Guard.state_dict(), kept as it is)."""

    __slots__ = _fields = ("saves", "guard")
    saves: tuple[dict[str, Any], ...]
    guard: Optional[dict[str, Any]]

    def __init__(self, saves: tuple[dict[str, Any], ...] = (),
                 guard: Optional[dict[str, Any]] = None) -> None:
        fill(self, locals())

    def worth(self, nbytes: int) -> bool:
        """Whether a save of `nbytes` seen on disk is a checkpoint to learn from (module
        docstring): at least MIN_BYTES and 1/SMALLER of the largest kept."""
        return nbytes >= max(MIN_BYTES, self.largest // SMALLER)

    @property
    def largest(self) -> int:
        """The most bytes a kept save wrote (0: none known)."""
        return max((s["bytes"] for s in self.saves if s["bytes"] is not None), default=0)

    @property
    def timed(self) -> list[float]:
        """The kept saves' seconds, as Guard.saved gets them: a save seen on disk at least
        MIN_SAVE_SECONDS (module docstring), a stop's save (signal to exit) as it was."""
        return [s["seconds"] if s["how"] == SIGNAL else max(MIN_SAVE_SECONDS, s["seconds"])
                for s in self.saves if s["seconds"] is not None]

    @property
    def seen_on_disk(self) -> list[float]:
        """`timed` without the stops' saves: what a new life's guard is taught (a stop's
        signal-to-exit holds a launcher's teardown; cli/ckptwatch.SaveWatch._teach)."""
        return [max(MIN_SAVE_SECONDS, s["seconds"]) for s in self.saves
                if s["how"] == WATCHED and s["seconds"] is not None]

    def add(self, seconds: Optional[float], nbytes: Optional[int], how: str, name: str,
            at: float) -> Learned:
        """With one more save (the oldest dropped past KEPT)."""
        save = {"seconds": None if seconds is None else round(seconds, 3), "bytes": nbytes,
                "how": how, "name": name[:NAME_CHARS], "at": round(at, 3)}
        return Learned((*self.saves, save)[-KEPT:], self.guard)

    def with_guard(self, state: Optional[dict[str, Any]]) -> Learned:
        return Learned(self.saves, state)

    def as_dict(self) -> dict[str, Any]:
        """The state file's object (parse_learned reads it back)."""
        return {"format": FORMAT, "version": VERSION, "saves": list(self.saves),
                "guard": self.guard}


FORMAT = "cgwatch guard state"
VERSION = 1


def parse_learned(data: Any) -> Learned:
    """The state `Learned.as_dict()` wrote; ValueError saying why for anything else (another
    program's file, another version, a field of the wrong type or out of range)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a cgwatch guard state")
    if data.get("version") != VERSION:
        raise ValueError(f"version {data.get('version')!r}, not {VERSION}")
    saves = data.get("saves")
    guard = data.get("guard")
    if not isinstance(saves, list) or len(saves) > KEPT:
        raise ValueError(f"'saves' is not a list of at most {KEPT}")
    if guard is not None and not isinstance(guard, dict):
        raise ValueError("'guard' is not an object")
    timed = guard.get("saves", []) if guard is not None else []
    if not isinstance(timed, list) or len(timed) > KEPT or not all(map(_number, timed)):
        # Guard.load_state_dict takes any number: an infinite save would stop every job
        raise ValueError(f"the guard's 'saves' are not at most {KEPT} numbers >= 0")
    kept = []
    for save in saves:
        if not isinstance(save, dict):
            raise ValueError("a save is not an object")
        seconds, nbytes, how = save.get("seconds"), save.get("bytes"), save.get("how")
        name, at = save.get("name", ""), save.get("at", 0.0)
        if not (seconds is None or _number(seconds)) or not (
                nbytes is None or (isinstance(nbytes, int) and not isinstance(nbytes, bool)
                                   and nbytes >= 0)) \
                or how not in (WATCHED, SIGNAL) or not isinstance(name, str) \
                or not _number(at):
            raise ValueError(f"a save is malformed: {str(save)[:80]}")
        kept.append({"seconds": seconds, "bytes": nbytes, "how": how,
                     "name": name[:NAME_CHARS], "at": at})
    return Learned(tuple(kept), guard)


def _number(value: Any) -> bool:
    """A finite number >= 0 (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0
