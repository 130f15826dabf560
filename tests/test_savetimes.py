"""What a save takes, learned from a checkpoint directory (cgwatch/savetimes.py), as tables:
the saves a sequence of file events shows (recorded from real jobs, then the traps), the
events two listings show (polling), which saves teach the lead, and the state file's
refusals. Expected values are worked out by hand from the events."""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple, Optional

import pytest

from cgwatch.savetimes import (
    CLOSED,
    KEPT,
    MOVED,
    OPENED,
    SIGNAL,
    WATCHED,
    WRITTEN,
    Learned,
    find_saves,
    listing_events,
    parse_learned,
)

MiB = 1 << 20
GiB = 1 << 30


class Row(NamedTuple):
    id: str
    events: list[tuple[Any, ...]]
    # each save: (start, end, bytes, seconds, files, name)
    saves: list[tuple[float, float, int, Optional[float], int, str]]


# Recorded on this machine (6.18, ext4, the 2-core VM): inotify on the directory and each
# directory made in it (IN_OPEN, IN_CLOSE_WRITE with the size then, IN_CLOSE_NOWRITE,
# IN_MOVED_FROM/TO), mapped as cli/ckptwatch.py maps them; times from the first event.
HF = Row(
    # transformers 5.24 Trainer, a 4-layer GPT-2 (n_embd 256), save_steps=10 for 30 steps,
    # save_total_limit=2, 0.4 s a step: checkpoint-<step>/ of 8 files, the model written to
    # a temporary name and renamed (safetensors), then the optimizer, scheduler, RNG state.
    "hf-trainer-checkpoint-dirs",
    [(0.0, OPENED, "checkpoint-10/config.json"),
     (0.0016, WRITTEN, "checkpoint-10/config.json", 820),
     (0.0025, OPENED, "checkpoint-10/generation_config.json"),
     (0.0051, WRITTEN, "checkpoint-10/generation_config.json", 195),
     (0.3356, OPENED, "checkpoint-10/.tmphTvd89"),
     (0.3598, MOVED, "checkpoint-10/model.safetensors", 20868080, "checkpoint-10/.tmphTvd89"),
     (0.3599, WRITTEN, "checkpoint-10/model.safetensors", 20868080),
     (0.3676, OPENED, "checkpoint-10/training_args.bin"),
     (0.3687, WRITTEN, "checkpoint-10/training_args.bin", 5265),
     (0.3715, OPENED, "checkpoint-10/optimizer.pt"),
     (0.4995, WRITTEN, "checkpoint-10/optimizer.pt", 41768779),
     (0.4995, OPENED, "checkpoint-10/scheduler.pt"),
     (0.4995, WRITTEN, "checkpoint-10/scheduler.pt", 1465),
     (0.4995, OPENED, "checkpoint-10/rng_state.pth"),
     (0.4995, WRITTEN, "checkpoint-10/rng_state.pth", 14455),
     (0.4995, OPENED, "checkpoint-10/trainer_state.json"),
     (0.4995, WRITTEN, "checkpoint-10/trainer_state.json", 766),
     (8.3196, OPENED, "checkpoint-20/config.json"),
     (8.3196, WRITTEN, "checkpoint-20/config.json", 820),
     (8.3196, OPENED, "checkpoint-20/generation_config.json"),
     (8.3196, WRITTEN, "checkpoint-20/generation_config.json", 195),
     (8.326, OPENED, "checkpoint-20/.tmpjOBbht"),
     (8.3587, MOVED, "checkpoint-20/model.safetensors", 20868080, "checkpoint-20/.tmpjOBbht"),
     (8.3587, WRITTEN, "checkpoint-20/model.safetensors", 20868080),
     (8.3636, OPENED, "checkpoint-20/training_args.bin"),
     (8.3636, WRITTEN, "checkpoint-20/training_args.bin", 5265),
     (8.3636, OPENED, "checkpoint-20/optimizer.pt"),
     (8.4939, WRITTEN, "checkpoint-20/optimizer.pt", 41768779),
     (8.4942, OPENED, "checkpoint-20/scheduler.pt"),
     (8.4943, WRITTEN, "checkpoint-20/scheduler.pt", 1465),
     (8.4945, OPENED, "checkpoint-20/rng_state.pth"),
     (8.5076, WRITTEN, "checkpoint-20/rng_state.pth", 14455),
     (8.5076, OPENED, "checkpoint-20/trainer_state.json"),
     (8.5076, WRITTEN, "checkpoint-20/trainer_state.json", 765)],
    # 820 + 195 + 20868080 + 5265 + 41768779 + 1465 + 14455 + 766 = 62659825 (765: 62659824);
    # the first open to the last close: 0.4995 s, and 8.5076 - 8.3196 = 0.188 s.
    [(0.0, 0.4995, 62659825, 0.4995, 8, "checkpoint-10"),
     (8.3196, 8.5076, 62659824, 0.188, 8, "checkpoint-20")])

HF_SOON = Row(
    # The same Trainer at full speed: checkpoint-20/ began 1.65 s after checkpoint-10/ ended,
    # within QUIET; another directory of DIR is another save, however soon.
    "hf-trainer-saves-1.7-s-apart",
    [(0.0, OPENED, "checkpoint-10/config.json"),
     (0.0006, WRITTEN, "checkpoint-10/config.json", 820),
     (0.1554, OPENED, "checkpoint-10/.tmp0D1zNi"),
     (0.1721, MOVED, "checkpoint-10/model.safetensors", 20868080, "checkpoint-10/.tmp0D1zNi"),
     (0.1721, WRITTEN, "checkpoint-10/model.safetensors", 20868080),
     (0.1809, OPENED, "checkpoint-10/optimizer.pt"),
     (0.2396, WRITTEN, "checkpoint-10/optimizer.pt", 41768779),
     (1.902, OPENED, "checkpoint-20/config.json"),
     (1.9028, WRITTEN, "checkpoint-20/config.json", 820),
     (1.9104, OPENED, "checkpoint-20/.tmpZdT8fC"),
     (1.9262, MOVED, "checkpoint-20/model.safetensors", 20868080, "checkpoint-20/.tmpZdT8fC"),
     (1.9262, WRITTEN, "checkpoint-20/model.safetensors", 20868080),
     (1.9294, OPENED, "checkpoint-20/optimizer.pt"),
     (2.0174, WRITTEN, "checkpoint-20/optimizer.pt", 41768779)],
    # 820 + 20868080 + 41768779 = 62637679
    [(0.0, 0.2396, 62637679, 0.2396, 3, "checkpoint-10"),
     (1.902, 2.0174, 62637679, 0.1154, 3, "checkpoint-20")])

LIGHTNING = Row(
    # lightning 2.6.6 ModelCheckpoint(every_n_train_steps=20, save_top_k=-1, save_last=True):
    # each .ckpt is serialized into memory, written to a temporary file in $TMPDIR and
    # moved in (fsspec's transaction): only IN_MOVED_TO reaches DIR, no time. last.ckpt is
    # the same checkpoint again, 0.1 s later: one save, untimed, of both files.
    "lightning-ckpt-moved-in",
    [(0.0, MOVED, "epoch=0-step=20.ckpt", 25203952, None),
     (0.098, MOVED, "last.ckpt", 25203952, None),
     (5.3217, MOVED, "epoch=0-step=40.ckpt", 25203952, None),
     (5.4135, MOVED, "last.ckpt", 25203952, None)],
    [(0.0, 0.098, 50407904, None, 2, "epoch=0-step=20.ckpt"),
     (5.3217, 5.4135, 50407904, None, 2, "epoch=0-step=40.ckpt")])

TORCH_SAVE = Row(
    # torch 2.13 torch.save({"model", "opt", "step"}) of a 1024x4096x1024 MLP with Adam,
    # every 10 steps: one file, open to close.
    "torch-save-files",
    [(0.0, OPENED, "step-10.pt"),
     (0.298, WRITTEN, "step-10.pt", 100730035),
     (6.5235, OPENED, "step-20.pt"),
     (6.6584, WRITTEN, "step-20.pt", 100730035)],
    [(0.0, 0.298, 100730035, 0.298, 1, "step-10.pt"),
     (6.5235, 6.6584, 100730035, 0.1349, 1, "step-20.pt")])

RENAMED = Row(
    # tests/restart_job.py's way (a temporary name, fsync, close, rename), 2 MiB in 8 writes
    # 0.1 s apart: the close came when the file was already renamed (no size: stat failed),
    # the rename carries the file and its size.
    "json-written-then-renamed",
    [(0.0, OPENED, "step-000010.json.tmp"),
     (0.8078, WRITTEN, "step-000010.json.tmp", None),
     (0.8078, MOVED, "step-000010.json", 2097152, "step-000010.json.tmp"),
     (3.8118, OPENED, "step-000020.json.tmp"),
     (4.6576, WRITTEN, "step-000020.json.tmp", None),
     (4.6576, MOVED, "step-000020.json", 2097152, "step-000020.json.tmp")],
    [(0.0, 0.8078, 2097152, 0.8078, 1, "step-000010.json"),
     (3.8118, 4.6576, 2097152, 0.8458, 1, "step-000020.json")])

TRAPS = [
    Row("a log held open is no save's file: TensorBoard's event file, open from the start, "
        "closed at the end (40 kB in 30 s); the save in between is the checkpoint alone",
        [(0.0, OPENED, "events.out.tfevents"),
         (10.0, OPENED, "step-10.pt"), (10.3, WRITTEN, "step-10.pt", 100 * MiB),
         (30.0, WRITTEN, "events.out.tfevents", 40000)],
        [(10.0, 10.3, 100 * MiB, 0.3, 1, "step-10.pt")]),
    Row("a read at resume (IN_OPEN, IN_CLOSE_NOWRITE) is no save",
        [(0.0, OPENED, "checkpoint-10/optimizer.pt"),
         (0.4, CLOSED, "checkpoint-10/optimizer.pt")],
        []),
    Row("one file written for 30 s raises no event between open and close: one save of 30 s",
        [(0.0, OPENED, "step-10.pt"), (5.0, "tick", ""), (29.0, "tick", ""),
         (30.0, WRITTEN, "step-10.pt", 32 * GiB)],
        [(0.0, 30.0, 32 * GiB, 30.0, 1, "step-10.pt")]),
    Row("a save waits for a file opened in it, still open after QUIET: one save, not two",
        [(0.0, OPENED, "model.pt"), (0.1, WRITTEN, "model.pt", 2 * MiB),
         (0.2, OPENED, "optimizer.pt"), (2.5, "tick", ""), (9.0, "tick", ""),
         (10.0, WRITTEN, "optimizer.pt", 64 * MiB)],
        [(0.0, 10.0, 66 * MiB, 10.0, 2, "optimizer.pt")]),
    Row("two files QUIET (2 s) apart: two saves; within it: one",
        [(0.0, OPENED, "a.pt"), (0.5, WRITTEN, "a.pt", 2 * MiB),
         (1.0, OPENED, "a.optim.pt"), (1.5, WRITTEN, "a.optim.pt", 4 * MiB),
         (4.0, OPENED, "b.pt"), (4.5, WRITTEN, "b.pt", 2 * MiB)],
        [(0.0, 1.5, 6 * MiB, 1.5, 2, "a.optim.pt"),
         (4.0, 4.5, 2 * MiB, 0.5, 1, "b.pt")]),
    Row("a directory renamed into place (tmp-checkpoint-10 -> checkpoint-10) mid-save: one "
        "save, named as it ends",
        [(0.0, OPENED, "tmp-checkpoint-10/model.pt"),
         (1.0, WRITTEN, "tmp-checkpoint-10/model.pt", 8 * MiB),
         (1.1, OPENED, "tmp-checkpoint-10/optimizer.pt"),
         (2.0, WRITTEN, "tmp-checkpoint-10/optimizer.pt", 16 * MiB),
         (2.1, MOVED, "checkpoint-10", None, "tmp-checkpoint-10"),
         (2.2, OPENED, "checkpoint-10/trainer_state.json"),
         (2.3, WRITTEN, "checkpoint-10/trainer_state.json", 1000)],
        [(0.0, 2.3, 24 * MiB + 1000, 2.3, 3, "checkpoint-10")]),
    Row("a file rewritten in one save counts once, at its last size",
        [(0.0, OPENED, "last.pt"), (0.5, WRITTEN, "last.pt", 1 * MiB),
         (0.6, OPENED, "last.pt"), (1.0, WRITTEN, "last.pt", 3 * MiB)],
        [(0.0, 1.0, 3 * MiB, 1.0, 1, "last.pt")]),
    Row("the watch ends mid-save: what was written so far is flushed",
        [(0.0, OPENED, "step-10.pt"), (0.5, WRITTEN, "step-10.pt", 5 * MiB),
         (0.6, OPENED, "step-10.optim.pt")],
        [(0.0, 0.5, 5 * MiB, 0.5, 1, "step-10.pt")]),
]


@pytest.mark.parametrize("row", [HF, HF_SOON, LIGHTNING, TORCH_SAVE, RENAMED, *TRAPS],
                         ids=lambda row: row.id[:60])
def test_find_saves(row: Row) -> None:
    found = [(s.start, s.end, s.bytes, s.seconds, s.files, s.name)
             for s in find_saves(row.events)]
    assert len(found) == len(row.saves), found
    for got, want in zip(found, row.saves):
        assert got[2:] == pytest.approx(want[2:], abs=1e-6) if want[3] is not None \
            else got[2:] == want[2:], (got, want)
        assert got[:2] == pytest.approx(want[:2], abs=1e-6), (got, want)


@pytest.mark.parametrize("before, after, polled_before, events", [
    # a file new since the last listing: opened after it at the latest, written at its mtime
    ({}, {"step-10.pt": (100, 1005.0)}, 1004.2,
     [(1004.2, OPENED, "step-10.pt", 0), (1005.0, WRITTEN, "step-10.pt", 100)]),
    # one that grew: the same; one unchanged: nothing
    ({"a.pt": (10, 1000.0), "b.pt": (5, 990.0)}, {"a.pt": (20, 1001.5), "b.pt": (5, 990.0)},
     1001.0, [(1001.0, OPENED, "a.pt", 0), (1001.5, WRITTEN, "a.pt", 20)]),
    # an mtime before the last listing (a file copied with its times, or the kernel's
    # coarse clock): opened no later than written
    ({}, {"old.pt": (7, 500.0)}, 1000.0,
     [(500.0, OPENED, "old.pt", 0), (500.0, WRITTEN, "old.pt", 7)]),
    # a file removed: nothing (a save writes)
    ({"gone.pt": (7, 500.0)}, {}, 1000.0, []),
])
def test_listing_events(before: dict[str, tuple[int, float]],
                        after: dict[str, tuple[int, float]], polled_before: float,
                        events: list[tuple[float, str, str, int]]) -> None:
    assert listing_events(before, after, polled_before) == events


def test_polled_listings_of_a_growing_file_make_one_save() -> None:
    """Listed every second while a 3 MiB file grew for 2.2 s (mtimes 10.4, 11.3, 12.2): its
    opens are the listings before each change, the writes its mtimes; one save, from the
    listing before it was first seen (10.0) to its last write, 2.2 s (at most a poll more
    than the truth)."""
    listings = [(10.0, {}), (11.0, {"s.pt": (1 * MiB, 10.4)}),
                (12.0, {"s.pt": (2 * MiB, 11.3)}), (13.0, {"s.pt": (3 * MiB, 12.2)}),
                (14.0, {"s.pt": (3 * MiB, 12.2)})]
    events: list[tuple[Any, ...]] = []
    for (at, before), (_, after) in zip(listings, listings[1:]):
        events.extend(listing_events(before, after, at))
    [save] = find_saves(events)
    assert (save.start, save.end, save.bytes, save.files) == (10.0, 12.2, 3 * MiB, 1)
    assert save.seconds == pytest.approx(2.2)


def learned(*saves: tuple[Optional[float], Optional[int], str]) -> Learned:
    state = Learned()
    for seconds, nbytes, how in saves:
        state = state.add(seconds, nbytes, how, "x", 1.0)
    return state


@pytest.mark.parametrize("kept, nbytes, worth", [
    ((), 1 * MiB, True),                        # the least that is a checkpoint
    ((), 1 * MiB - 1, False),                   # a CSV flush, a trainer_state.json
    (((2.0, 64 * MiB, WATCHED),), 8 * MiB, True),       # 1/8 of the largest kept
    (((2.0, 64 * MiB, WATCHED),), 8 * MiB - 1, False),  # a side file's write
    (((0.3, None, SIGNAL),), 1 * MiB, True),            # a stop's save has no size
])
def test_worth(kept: tuple[tuple[Optional[float], Optional[int], str], ...], nbytes: int,
               worth: bool) -> None:
    assert learned(*kept).worth(nbytes) is worth


def test_timed_floors_a_save_seen_on_disk_not_a_stops() -> None:
    """A save seen on disk misses the time to reach it (at least 1 s); a stop's save, signal
    to exit, is all of it; an untimed one (Lightning's, moved in) teaches only its size."""
    state = learned((0.2, 4 * MiB, WATCHED), (0.3, None, SIGNAL), (None, 50 * MiB, WATCHED),
                    (2.5, 60 * MiB, WATCHED))
    assert state.timed == [1.0, 0.3, 2.5]
    assert state.seen_on_disk == [1.0, 2.5]  # what a new life is taught: no stop's save
    assert state.largest == 60 * MiB


def test_add_keeps_the_last_few() -> None:
    state = learned(*[(float(k), MiB, WATCHED) for k in range(KEPT + 3)])
    assert [s["seconds"] for s in state.saves] == [float(k) for k in range(3, KEPT + 3)]
    assert parse_learned(json.loads(json.dumps(state.as_dict()))) == state


def test_the_guards_state_is_kept_as_it_is() -> None:
    state = learned((1.5, 2 * MiB, WATCHED)).with_guard({"version": 1, "saves": [1.5]})
    assert parse_learned(json.loads(json.dumps(state.as_dict()))) == state


GOOD = {"format": "cgwatch guard state", "version": 1,
        "saves": [{"seconds": 2.0, "bytes": 8 * MiB, "how": "watched", "name": "step-10.pt",
                   "at": 1.0}], "guard": None}


def bad_save(**fields: Any) -> dict[str, Any]:
    return {**GOOD, "saves": [{**GOOD["saves"][0], **fields}]}


@pytest.mark.parametrize("data, why", [
    ([], "not a cgwatch guard state"),                          # JSON, not an object
    ({"format": "something else"}, "not a cgwatch guard state"),  # another program's file
    ({**GOOD, "version": 2}, "version 2, not 1"),                 # a later cgwatch's
    ({**GOOD, "saves": {}}, "'saves' is not a list"),
    ({**GOOD, "saves": GOOD["saves"] * (KEPT + 1)}, f"at most {KEPT}"),  # not bounded
    ({**GOOD, "guard": [1]}, "'guard' is not an object"),
    # the guard takes its saves as they are: an infinite one would stop every job at once
    ({**GOOD, "guard": {"saves": [math.inf]}}, "the guard's 'saves' are not"),
    ({**GOOD, "guard": {"saves": ["2"]}}, "the guard's 'saves' are not"),
    ({**GOOD, "guard": {"saves": 2.0}}, "the guard's 'saves' are not"),
    ({**GOOD, "saves": [3]}, "a save is not an object"),
    (bad_save(seconds=-1.0), "a save is malformed"),
    (bad_save(seconds=math.inf), "a save is malformed"),     # json.loads reads Infinity
    (bad_save(seconds=math.nan), "a save is malformed"),     # and NaN
    (bad_save(seconds=True), "a save is malformed"),         # a bool is no number here
    (bad_save(bytes=1.5), "a save is malformed"),
    (bad_save(bytes=-1), "a save is malformed"),
    (bad_save(how="guessed"), "a save is malformed"),
    (bad_save(name=7), "a save is malformed"),
])
def test_parse_learned_refuses(data: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_learned(data)


def test_parse_learned_reads_what_it_wrote() -> None:
    state = parse_learned(GOOD)
    assert state.timed == [2.0] and state.largest == 8 * MiB and state.guard is None
