"""`run --guard --checkpoint-dir DIR`'s watch of DIR (cgwatch/cli/ckptwatch.py) against the real
kernel's inotify in a temporary directory, driven by files written here the way the jobs write
them (savetimes.py has the grouping's tables): a save learned and given to the guard, its state
file for the next life, the fallback to listings, and the files it refuses. The guard is its
pure part, a `Decision` (what Guard.saved, estimate_checkpoint and state_dict forward to).
Checked on 6.18."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, Optional

import pytest

from cgwatch.cli.ckptwatch import POLLING, STATE_NAME, WATCHING, SaveWatch
from cgwatch.cli.runguard import find_saved
from cgwatch.decision import Decision
from cgwatch.savetimes import SIGNAL, WATCHED, parse_learned

MiB = 1 << 20


def saves(decision: Decision) -> list[float]:
    """The timed saves the guard was given (its state, as the next life gets it)."""
    return list(decision.state_dict()["saves"])


@pytest.fixture
def watches() -> Iterator[list[SaveWatch]]:
    made: list[SaveWatch] = []
    yield made
    for watch in made:
        watch.close()


def watching(directory: str, made: list[SaveWatch], budget: Optional[int] = None
             ) -> tuple[SaveWatch, Decision]:
    taught = Decision()
    watch = SaveWatch(directory, taught, budget)  # type: ignore[arg-type]
    made.append(watch)
    watch.start()
    return watch, taught


def write_slowly(path: str, chunks: int, size: int, pause: float) -> None:
    """One file, `chunks` writes of `size` bytes `pause` seconds apart (a save taking
    (chunks - 1) x pause seconds), as torch.save writes one: open, write, close."""
    with open(path, "wb") as f:
        for k in range(chunks):
            if k:
                time.sleep(pause)
            f.write(b"x" * size)
            f.flush()


def wait_for(condition: Any, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not learned in time"
        time.sleep(0.05)


def test_a_save_written_is_learned_and_kept(tmp_path: Any, watches: list[SaveWatch]) -> None:
    """A 4 MiB file written over 1.5 s: one save of ~1.5 s (each event is timed when it is
    read, a few ms late; a loaded machine makes it longer), given to the guard with its
    size, and kept in DIR's state file."""
    watch, taught = watching(str(tmp_path), watches)
    assert watch.mode == WATCHING and watch.line == ""
    write_slowly(str(tmp_path / "step-10.pt"), 4, MiB, 0.5)
    wait_for(lambda: saves(taught))
    assert 1.4 <= saves(taught)[0] < 3.0, saves(taught)  # timed as read: ms late
    assert taught.checkpoint_bytes == 4 * MiB
    assert taught.lead == 1.5 * saves(taught)[0]
    [save] = watch.report()["saves"]
    assert (save["bytes"], save["files"], save["name"]) == (4 * MiB, 1, "step-10.pt")
    with open(tmp_path / STATE_NAME) as f:
        kept = parse_learned(json.load(f))
    assert [(s["how"], s["bytes"], s["seconds"]) for s in kept.saves] == [
        (WATCHED, 4 * MiB, save["seconds"])]
    # the state file is not the checkpoint `run` names after a stop
    assert find_saved(str(tmp_path), 0.0) == str(tmp_path / "step-10.pt")


def test_a_checkpoint_directory_made_while_watching(tmp_path: Any,
                                                    watches: list[SaveWatch]) -> None:
    """HF's way: checkpoint-10/ made after the start, three files written into it one after
    another over ~1 s: watched as it comes, one save of three files."""
    watch, taught = watching(str(tmp_path), watches)
    directory = tmp_path / "checkpoint-10"
    directory.mkdir()
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
        write_slowly(str(directory / name), 2, MiB, 0.4)
    wait_for(lambda: saves(taught))
    [save] = watch.report()["saves"]
    assert (save["bytes"], save["files"], save["name"]) == (6 * MiB, 3, "checkpoint-10")
    # the first file was opened before its new directory was watched: its open counts from
    # when the directory was seen, milliseconds late
    assert 1.1 <= save["seconds"] < 3.0, save


def test_listings_when_no_watch_may_be_taken(tmp_path: Any, watches: list[SaveWatch]) -> None:
    """With no watch to spare DIR is listed every second: the save is still learned, its
    time at most a listing's interval longer than the truth."""
    watch, taught = watching(str(tmp_path), watches, budget=0)
    assert (watch.mode, watch.why_polling) == (POLLING, "more than 0 directories to watch")
    write_slowly(str(tmp_path / "step-10.pt"), 4, MiB, 0.5)
    wait_for(lambda: saves(taught))
    assert 1.4 <= saves(taught)[0] < 4.0, saves(taught)
    assert taught.checkpoint_bytes == 4 * MiB


def test_a_tree_larger_than_the_budget_is_listed(tmp_path: Any,
                                                 watches: list[SaveWatch]) -> None:
    for k in range(5):
        (tmp_path / f"checkpoint-{k}").mkdir()
    watch, _ = watching(str(tmp_path), watches, budget=5)  # DIR and its 5: 6 watches
    assert (watch.mode, watch.why_polling) == (POLLING, "more than 5 directories to watch")
    assert watching(str(tmp_path), watches, budget=6)[0].mode == WATCHING


def test_small_writes_teach_nothing(tmp_path: Any, watches: list[SaveWatch]) -> None:
    """A 10 kB JSON (a trainer_state.json, a CSV flush): no checkpoint; the state kept at
    the end holds no save."""
    watch, taught = watching(str(tmp_path), watches)
    write_slowly(str(tmp_path / "metrics.json"), 1, 10_000, 0)
    time.sleep(3.0)  # QUIET (2 s) and a turn of the thread
    watch.close()
    assert (saves(taught), taught.checkpoint_bytes) == ([], None)
    kept = parse_learned(json.loads((tmp_path / STATE_NAME).read_text()))
    assert kept.saves == () and kept.guard == taught.state_dict()


def test_the_next_life_starts_from_what_was_learned(tmp_path: Any,
                                                    watches: list[SaveWatch]) -> None:
    """The requeue: a second watch of the same DIR (a new `run`) gives its guard the saves
    the first saw on disk, before any save of its own, and says so; the stop's save (signal
    to exit) is kept in the file but not taught (savetimes.Learned.seen_on_disk: the
    Slurm tier's requeue loop)."""
    first, _ = watching(str(tmp_path), watches)
    write_slowly(str(tmp_path / "step-10.pt"), 4, MiB, 0.5)
    wait_for(lambda: first.report()["saves"])
    first.close()
    first.signal_save(0.4)
    learned = first.report()["saves"][0]["seconds"]
    second, taught = watching(str(tmp_path), watches)
    assert saves(taught) == [max(1.0, learned)] and taught.checkpoint_bytes == 4 * MiB
    assert second.line == (
        f"cgwatch guard: starting from 1 save learned by earlier runs "
        f"({tmp_path / STATE_NAME}): the longest {learned:.1f} s, 4.0 MiB; "
        f"lead {1.5 * max(1.0, learned):.1f} s")
    assert [s["how"] for s in second.report()["loaded"]] == [WATCHED, SIGNAL]


@pytest.mark.parametrize("content, why", [
    (b"\x00\xff garbage", "Expecting value"),                 # not JSON (nor UTF-8)
    (b'{"format": "other"}', "not a cgwatch guard state"),   # another program's file
    (b'{"format": "cgwatch guard state", "version": 9}', "version 9, not 1"),
    (b"[" * 70_000, "larger than 65536 bytes"),               # never read whole
    (None, "cannot read it (Is a directory)"),                # not a file
])
def test_a_bad_state_file_is_ignored_in_one_line(tmp_path: Any, watches: list[SaveWatch],
                                                 content: Optional[bytes], why: str) -> None:
    path = tmp_path / STATE_NAME
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    watch, taught = watching(str(tmp_path), watches)
    assert watch.line.startswith(f"cgwatch guard: ignoring {path}: "), watch.line
    assert why in watch.line, watch.line
    assert saves(taught) == [] and watch.report()["loaded"] is None
    if content is not None:  # replaced by the next state written
        watch.close()
        watch.signal_save(1.0)
        kept = parse_learned(json.loads(path.read_text()))
        assert [s["seconds"] for s in kept.saves] == [1.0] and kept.guard is not None
        assert kept.guard["saves"] == [1.0]


def test_a_directory_made_after_the_start_is_watched_once_it_exists(
        tmp_path: Any, watches: list[SaveWatch]) -> None:
    """DIR does not exist yet (a Trainer makes its output_dir itself): listed until it
    does, then watched; its first save is learned."""
    directory = tmp_path / "out"
    watch, taught = watching(str(directory), watches)
    assert (watch.mode, watch.why_polling) == (POLLING, "no such directory (yet)")
    directory.mkdir()
    wait_for(lambda: watch.mode == WATCHING, 5.0)
    write_slowly(str(directory / "step-10.pt"), 4, MiB, 0.5)
    wait_for(lambda: saves(taught))
    assert 1.4 <= saves(taught)[0] < 3.0, saves(taught)  # timed as read: ms late


def test_the_guards_pieces_are_kept_but_not_taught_to_the_next_life(
        tmp_path: Any, watches: list[SaveWatch]) -> None:
    """A life that saved nothing still writes what its guard learned (the pieces the job
    took: Guard.state_dict()) into the file, but the next life does not start from it
    (savetimes.Learned.seen_on_disk: restored, the guard's state stopped every new life of the Slurm
    tier's requeued HF job ~10 s after its start), and says nothing: no save to name."""
    first = Decision()
    first.load_state_dict({"rise": {"largest": 64 * MiB, "pieces": [64 * MiB, 64 * MiB]}})
    watch = SaveWatch(str(tmp_path), first)  # type: ignore[arg-type]
    watch.close()
    second, taught = watching(str(tmp_path), watches)
    assert taught.rise == 0 and second.line == ""
    kept = json.loads((tmp_path / STATE_NAME).read_text())["guard"]["rise"]
    assert kept["largest"] == 64 * MiB
