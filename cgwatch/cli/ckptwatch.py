"""Internal. `run --guard --checkpoint-dir DIR`: the lead from the job's own saves. DIR's tree
is watched while CMD runs; each save the job writes there (savetimes.py: what one save is,
which are worth learning) is given to the guard, its seconds as a timed save
(`Guard.saved`) and its bytes as the checkpoint's size (`Guard.estimate_checkpoint`), and
kept, with each stop's own save, in DIR/.cgwatch-guard.json, where the next life (a restart,
a requeue) starts from it: a 32 GiB job requeued starts with its measured lead.

Watching: the process's one inotify instance (watchhub.py's, under quota.py's rule for
instances), one watch per directory, new directories watched as they come (HF's
`checkpoint-<step>/`), at most MAX_DEPTH levels below DIR and at most `watch_budget()`
watches: 64, and never more than 1/64 of fs.inotify.max_user_watches, the uid's (a
checkpoint tree can hold thousands of directories; the watches are every program's of the
uid). More directories than that, no instance, or ENOSPC on a watch: every watch is given
back and DIR's tree is listed every POLL_INTERVAL seconds instead (bounded: MAX_DEPTH levels,
MAX_FILES files), a save's time then known to within that interval (an upper bound).

The state file: written atomically (a temporary name in DIR, then rename(2)), at most
MAX_STATE_BYTES; a file that is not one (foreign, truncated, another version) is ignored
with one line on stderr, never trusted in part, and replaced by the next write.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from ..inotify import (
    IN_CLOSE_NOWRITE,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE_SELF,
    IN_ISDIR,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_OPEN,
    Target,
    TargetGone,
    WatchEvent,
    WatchUnavailable,
)
from ..savetimes import (
    CLOSED,
    MOVED,
    OPENED,
    SIGNAL,
    WATCHED,
    WRITTEN,
    Learned,
    Save,
    SaveFinder,
    listing_events,
    parse_learned,
)
from ..units import human_bytes
from ..watchhub import LevelWatch

if TYPE_CHECKING:
    from ..guard import Guard

STATE_NAME = ".cgwatch-guard.json"  # in DIR; its temporary names start with it too
MAX_STATE_BYTES = 64 << 10
MAX_DEPTH = 3  # DIR/lightning_logs/version_0/checkpoints: 3 below DIR
MAX_WATCHES = 64
MAX_FILES = 4096  # a listing stops there (polling)
MAX_LISTED = 1024  # directories a listing goes into at most
POLL_INTERVAL = 1.0
TICK = 0.25  # how often a save over is looked for while watching
WATCHING, POLLING = "inotify", "polling"
MISSING = "no such directory (yet)"


def watch_budget(path: str = "/proc/sys/fs/inotify/max_user_watches") -> int:
    """The most watches to take: MAX_WATCHES, never over 1/64 of the uid's limit."""
    try:
        with open(path) as f:
            return min(MAX_WATCHES, int(f.read()) // 64)
    except (OSError, ValueError):
        return MAX_WATCHES


def read_learned(directory: str) -> tuple[Optional[Learned], str]:
    """DIR's state file: (what it holds, "") or (None, why it is not used; "" when there is
    none)."""
    path = os.path.join(directory, STATE_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"cannot read it ({e.strerror or e})"
    if len(raw) > MAX_STATE_BYTES:
        return None, f"larger than {MAX_STATE_BYTES} bytes"
    try:
        return parse_learned(json.loads(raw)), ""
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors too
        return None, str(e)[:120]


def write_learned(directory: str, learned: Learned) -> None:
    """Replace DIR's state file at once (a reader sees the old file or the new, never a part);
    nothing when DIR is gone or unwritable: a lead not kept is no reason to fail the job."""
    path = os.path.join(directory, STATE_NAME)
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(temporary, "w") as f:
            json.dump(learned.as_dict(), f)
        os.replace(temporary, path)
    except (OSError, ValueError):
        try:
            os.unlink(temporary)
        except OSError:
            pass


def list_tree(root: str, depth: int = MAX_DEPTH, limit: int = MAX_FILES
              ) -> tuple[dict[str, tuple[int, float]], list[str]]:
    """Files below `root` (relative path -> (size, mtime)) and its directories (absolute,
    `root` first), `depth` levels of directories down at most, at most `limit` files and
    MAX_LISTED directories; the state file left out."""
    files: dict[str, tuple[int, float]] = {}
    dirs = [root]
    level = [root]
    for down in range(depth + 1):
        below = []
        for directory in level:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue  # removed meanwhile
            for entry in entries:
                if entry.name.startswith(STATE_NAME):
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        below.append(entry.path)
                    elif entry.is_file(follow_symlinks=False) and len(files) < limit:
                        st = entry.stat(follow_symlinks=False)
                        files[entry.path[len(root) + 1:]] = (st.st_size, st.st_mtime)
                except OSError:
                    continue
        if down == depth:
            break
        level = below[:max(0, MAX_LISTED - len(dirs))]
        dirs.extend(level)
    return files, dirs


class SaveWatch:
    """DIR watched for saves on a thread from `start()` to `close()` (module docstring);
    what it learned goes to `guard` as it comes. `watches`: the most inotify watches to take
    (None: `watch_budget()`; more directories than that: DIR is polled). `loaded`: the state
    found in DIR at the start, `line`: what to say of it ("" when nothing was found)."""

    def __init__(self, directory: str, guard: Guard, watches: Optional[int] = None) -> None:
        self.directory = os.path.abspath(directory)
        self.guard = guard
        self.budget = watch_budget() if watches is None else watches
        self.mode: Optional[str] = None
        self.why_polling = ""
        self.learned_here: list[dict[str, Any]] = []  # this run's saves, for the report
        self._lock = threading.Lock()
        self._finder = SaveFinder()
        self._dirs: list[str] = []
        self._moved_from: Optional[str] = None  # the path of a rename's first half
        self._listing: dict[str, tuple[int, float]] = {}
        self._listed_at = 0.0
        self._watch: Optional[LevelWatch] = None  # while watching (or starting to)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by the hub when it reads the instance (poke)
        self._thread = threading.Thread(target=self._run, name="cgwatch-run-saves",
                                        daemon=True)
        loaded, why = read_learned(self.directory)
        self.loaded = loaded
        self.learned = loaded if loaded is not None else Learned()
        self.line = ""
        if why:
            self.line = f"cgwatch guard: ignoring {self._state_path()}: {why}"
        elif loaded is not None:
            self._teach(loaded)
            if loaded.seen_on_disk:
                self.line = learned_line(loaded, self._state_path(), guard.lead)

    def _state_path(self) -> str:
        return os.path.join(self.directory, STATE_NAME)

    def _teach(self, learned: Learned) -> None:
        """The guard starts from the saves an earlier life saw on disk: their seconds
        (`Learned.seen_on_disk`) and the largest one's bytes. Not the guard's own state_dict (its
        pieces, the checkpoint estimate) nor a stop's signal-to-exit time, though the file
        keeps them: found by the Slurm tier's requeue of a torchrun HF job (1200M,
        --checkpoint-seconds 2), which, restored from them, was stopped in every new life
        ~10 s after its start, 17 requeues in 400 s. A new life's start-up is a depth the
        old life's pieces know nothing of (its turns are not kept), and a signal-to-exit
        time holds the launcher's teardown; which of the two stopped it was not told apart."""
        for seconds in learned.seen_on_disk:
            self.guard.saved(seconds)
        if learned.largest:
            self.guard.estimate_checkpoint(learned.largest)

    # ---- the thread --------------------------------------------------------------------------

    def start(self) -> None:
        """Say what was found at the start (`line`), then watch."""
        if self.line:
            print(self.line, file=sys.stderr, flush=True)
        self._watch_or_poll()
        self._thread.start()

    def close(self) -> None:
        """Stop watching; learn the save still being written (a stop's), keep the state."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._deliver()  # what was read for us since the last turn
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()
        with self._lock:
            saves = self._finder.flush()
        for save in saves:
            self._learn(save)
        if not saves:
            self._keep(self.learned)  # the guard's own state as it ends (its pieces)

    def signal_save(self, seconds: float) -> None:
        """A stop's save under `run --guard` (the signal to CMD's end): kept for the next
        life: given to the guard too (it has stopped), whose state is what the next starts
        from."""
        self.guard.saved(seconds)
        self._keep(self.learned.add(seconds, None, SIGNAL, "", time.time()))

    def report(self) -> dict[str, Any]:
        """For run's JSON report: where, how it watched, what it found at the start and what
        this run learned."""
        return {"file": self._state_path(), "watching": self.mode,
                "why_polling": self.why_polling or None,
                "loaded": list(self.loaded.saves) if self.loaded is not None else None,
                "saves": self.learned_here}

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_INTERVAL if self.mode == POLLING else TICK)
            self._wake.clear()
            try:
                self._turn()
            except Exception as e:  # noqa: BLE001 - a lead not learned must not end the run
                self._give_up(e)
                return

    def _turn(self) -> None:
        self._deliver()
        if self.why_polling == MISSING and os.path.isdir(self.directory):
            self._watch_or_poll()  # made after the start (HF makes output_dir at a save)
        with self._lock:
            if self.mode == POLLING:
                self._poll()
            saves = self._finder.due(time.time())
        for save in saves:
            self._learn(save)

    def _give_up(self, error: Exception) -> None:
        """Stop learning (the guard keeps what it has): one line in the report."""
        with self._lock:
            self._poll_instead(f"stopped: {error!r}"[:200])
            self.mode = None

    def _learn(self, save: Save) -> None:
        if not self.learned.worth(save.bytes):
            return
        seconds = None if save.seconds is None else round(save.seconds, 3)
        self.learned_here.append({"seconds": seconds, "bytes": save.bytes,
                                  "files": save.files, "name": save.name})
        learned = self.learned.add(seconds, save.bytes, WATCHED, save.name, time.time())
        if seconds is not None:
            self.guard.saved(learned.timed[-1])
        self.guard.estimate_checkpoint(learned.largest)
        self._keep(learned)

    def _keep(self, learned: Learned) -> None:
        self.learned = learned = learned.with_guard(self.guard.state_dict())
        if os.path.isdir(self.directory):
            write_learned(self.directory, learned)

    # ---- watching ----------------------------------------------------------------------------

    def _watch_or_poll(self) -> None:
        files, dirs = list_tree(self.directory)
        self._listing, self._listed_at = files, time.time()
        if not os.path.isdir(self.directory):
            return self._poll_instead(MISSING)
        if len(dirs) > self.budget:
            return self._poll_instead(f"more than {self.budget} directories to watch")
        self.why_polling = ""
        self._watch = LevelWatch(self._poke, self._deliver)
        with self._lock:
            self._dirs = dirs
            # a directory made between the listing and its parent's watch: listed again
            while self._rewatch():
                now = list_tree(self.directory)[1]
                if set(now) <= set(self._dirs):
                    self.mode = WATCHING
                    self._watch.want_loop(True)
                    return
                self._dirs = [*self._dirs, *(d for d in now if d not in self._dirs)]

    def _rewatch(self) -> bool:
        """Watch exactly self._dirs; False (and polling) when that cannot be."""
        for _ in range(len(self._dirs) + 1):
            if len(self._dirs) > self.budget:
                self._poll_instead(f"more than {self.budget} directories to watch")
                return False
            watch = self._watch
            if watch is None:
                return False  # polling already
            try:
                watch.start()  # the process's instance (made if none, as quota.py allows)
                watch.replace([Target(d, "saves", 0) for d in self._dirs])
                return True
            except TargetGone as e:  # removed meanwhile (HF's rotation): without it
                self._forget(str(e))
            except WatchUnavailable as e:  # ENOSPC: the uid's watches are all taken
                self._poll_instead(str(e))
                return False
        return False

    def _forget(self, gone: str) -> None:
        self._dirs = [d for d in self._dirs if d != gone and not d.startswith(gone + "/")]

    def _poll_instead(self, why: str) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()  # every watch given back
            # what the watch saw is fed: the listings go on from now
            self._listing, self._listed_at = list_tree(self.directory)[0], time.time()
        self.mode, self.why_polling = POLLING, why

    def _poke(self) -> None:
        """The hub is reading the instance, or has read events of ours: whoever read them
        (the loop thread, or a query of run's monitor, which queues them without delivering),
        this thread takes them now (`_deliver`). Called under the hub's lock: no lock here."""
        self._wake.set()

    def _deliver(self) -> None:
        """The events read for us, fed to the finder at the time they are taken (the loop
        thread's delivery, or this thread woken by `_poke`: within milliseconds)."""
        if threading.current_thread() is not self._thread:
            try:
                return self._take()
            except Exception as e:  # noqa: BLE001 - the loop thread serves every monitor
                return self._give_up(e)
        self._take()

    def _take(self) -> None:
        with self._lock:  # the events in the order read (this thread and the loop's)
            watch = self._watch
            if watch is None or self.mode != WATCHING:
                return
            changes, rebuild = watch.read()
            now = time.time()
            for change in changes:
                self._apply(now, change)
            if rebuild:  # a watch vanished, or the queue overflowed: look again
                self._dirs = list_tree(self.directory)[1]
                self._rewatch()

    def _apply(self, now: float, change: WatchEvent) -> None:
        mask, name = change.mask, change.name
        path = os.path.join(change.target.path, name) if name else change.target.path
        if mask & IN_DELETE_SELF:
            self._forget(path)  # the kernel dropped its watch (IN_IGNORED)
            return
        if not name or name.startswith(STATE_NAME):
            return  # a listing of a watched directory; the state file
        relative = path[len(self.directory) + 1:]
        moved_from, self._moved_from = self._moved_from, None
        if mask & IN_ISDIR:
            if mask & IN_MOVED_FROM:
                self._moved_from = relative
            elif mask & (IN_CREATE | IN_MOVED_TO):
                self._new_directory(now, path, moved_from if mask & IN_MOVED_TO else None,
                                    bool(mask & IN_MOVED_TO))
        elif mask & IN_OPEN:
            self._finder.feed(now, OPENED, relative)
        elif mask & IN_CLOSE_NOWRITE:
            self._finder.feed(now, CLOSED, relative)
        elif mask & IN_CLOSE_WRITE:
            self._finder.feed(now, WRITTEN, relative, _size(path))
        elif mask & IN_MOVED_FROM:
            self._moved_from = relative
        elif mask & IN_MOVED_TO:
            self._finder.feed(now, MOVED, relative, _size(path), moved_from)

    def _new_directory(self, now: float, path: str, old: Optional[str], moved: bool) -> None:
        """A directory made or moved in: watched (with what it holds), its files fed as
        written now (made here: since `now`, its making) or arrived whole (moved in)."""
        depth = path[len(self.directory):].count("/")
        if old is not None:
            self._finder.feed(now, MOVED, path[len(self.directory) + 1:], None, old)
            self._forget(os.path.join(self.directory, old))
        if depth > MAX_DEPTH:
            return
        files, dirs = list_tree(path, MAX_DEPTH - depth)
        prefix = path[len(self.directory) + 1:] + "/"
        for relative, (size, _) in files.items() if old is None else ():
            if not moved:
                self._finder.feed(now, OPENED, prefix + relative)
                self._finder.feed(time.time(), WRITTEN, prefix + relative, size)
            else:
                self._finder.feed(now, MOVED, prefix + relative, size, None)
        self._dirs = [*self._dirs, *dirs]
        self._rewatch()

    def _poll(self) -> None:
        now = time.time()
        files, _ = list_tree(self.directory)
        for event in listing_events(self._listing, files, self._listed_at):
            self._finder.feed(*event)
        self._listing, self._listed_at = files, now


def _size(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_size
    except OSError:
        return None  # renamed or removed already: what a later event says counts


def learned_line(learned: Learned, path: str, lead: float) -> str:
    """The line `run` says when it starts from an earlier life's saves (pure)."""
    timed = learned.seen_on_disk
    longest = f"the longest {max(timed):.1f} s" if timed else "none timed"
    size = f", {human_bytes(learned.largest)}" if learned.largest else ""
    count = len(timed)
    return (f"cgwatch guard: starting from {count} save{'s' if count != 1 else ''} learned "
            f"by earlier runs ({path}): {longest}{size}; lead {lead:.1f} s")

