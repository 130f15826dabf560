"""Which ranks saved after their guard's stop: a small record per rank that the adapters
write and `cgwatch run` reads, so that the outermost command can exit 75 when a launcher
cannot say it.

Why: with the adapters every rank exits 75 (`GUARD_EXIT_STATUS`) after its save, but the
launchers do not pass that on (measured with torch 2.13 and Lightning 2.6.6, docs/guard.md):
torchrun reports any non-zero worker as a failure and exits 1 (or restarts the group itself
with `--max-restarts`), and Lightning's launcher (rank 0) can be SIGKILLed by its own
child-process observer once rank 1 has exited non-zero, so it ends with 137. A launcher's
status cannot tell "every rank saved" from "a rank failed"; a record written by each rank
right after its own save can, whatever the launcher does with the ranks afterwards.

The protocol (one owner per part):
- `cgwatch run` makes a fresh directory for each run of CMD (`tempfile.mkdtemp`), puts its
  path in CMD's environment as `CGWATCH_SAVES_DIR` (torchrun's workers and Lightning's rank 1
  inherit it), reads it after CMD ended and removes it.
- Each rank, only where that variable is set, writes `rank-<global rank>.json` (to a
  temporary name, then renamed: a reader never sees half a record) twice: when its trainer
  starts (`record_start`: `saved` false) and right after its part of the save that followed
  a guard stop (`record_save`: `saved` true, the step). A record also carries the number of
  ranks on this node (`local_world_size`: on several nodes each node's `run` sees its own
  ranks) and the launcher's attempt (`TORCHELASTIC_RESTART_COUNT`, 0 elsewhere).
- `all_saved` (pure) decides on the newest attempt's records: every one of the node's ranks
  has a record of that attempt, and each says saved. A group that torchrun restarted
  rewrote the start records, so an older attempt's saves do not count for a newer one that
  failed; a rank killed before its save (the OOM killer, a crash, a signal) never wrote
  `saved`, so the job is not called saved.

Known limit: a restarted group in which *no* rank got as far as its trainer's start leaves
the previous attempt's records; that attempt did save, and its checkpoint is whole.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple, Optional

SAVES_ENV = "CGWATCH_SAVES_DIR"
ATTEMPT_ENV = "TORCHELASTIC_RESTART_COUNT"  # torchrun: 0, then 1, 2, ... after each restart
_PREFIX = "rank-"
_MAX_RECORD = 4096  # bytes: a record is ~150; anything larger is not one of ours

__all__ = ["SAVES_ENV", "Saves", "all_saved", "read_records", "record_save", "record_start"]


class Saves(NamedTuple):
    """What the records say about the newest `attempt`: `saved` ranks of the `expected`
    ranks on this node (0 expected: no record at all, the adapters were not used), `ranks`
    that wrote a record, and the step of their stop (None: none, or they differ)."""

    saved: int
    expected: int
    ranks: int
    attempt: int
    step: Optional[int]

    @property
    def complete(self) -> bool:
        """Every rank of the newest attempt saved after its guard's stop (and no record of
        a rank more than the node has: such a directory is not one group's)."""
        return self.expected > 0 and self.saved == self.expected == self.ranks


def record_start(rank: int, local_world_size: int,
                 environ: Optional[dict[str, str]] = None) -> Optional[str]:
    """Say this rank's trainer started (not saved). The path written, or None where
    `CGWATCH_SAVES_DIR` is not set (not under `cgwatch run`) or it could not be written."""
    return _write(rank, local_world_size, False, None, None, environ)


def record_save(rank: int, local_world_size: int, step: Optional[int],
                checkpoint: Optional[str] = None,
                environ: Optional[dict[str, str]] = None) -> Optional[str]:
    """Say this rank's part of the save that followed its guard's stop is done (call it
    after the save returned, before leaving). The path written, or None (`record_start`)."""
    return _write(rank, local_world_size, True, step, checkpoint, environ)


def _write(rank: int, local_world_size: int, saved: bool, step: Optional[int],
           checkpoint: Optional[str], environ: Optional[dict[str, str]]) -> Optional[str]:
    env = os.environ if environ is None else environ
    directory = env.get(SAVES_ENV)
    if not directory:
        return None
    try:
        attempt = int(env.get(ATTEMPT_ENV, "0"))
    except ValueError:
        attempt = 0
    record = {"rank": rank, "local_world_size": local_world_size, "attempt": attempt,
              "saved": saved, "step": step, "checkpoint": checkpoint, "pid": os.getpid()}
    path = os.path.join(directory, f"{_PREFIX}{rank}.json")
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w") as f:
            json.dump(record, f)
        os.replace(temporary, path)
    except OSError:  # run's directory gone (run killed) or unwritable: the job goes on
        return None
    return path


def read_records(directory: str) -> list[dict[str, Any]]:
    """The records in `directory` (unreadable or malformed ones are left out: a rank that
    did not write a whole record did not say it saved)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    records = []
    for name in names:
        if not (name.startswith(_PREFIX) and name.endswith(".json")):
            continue  # a temporary a killed rank left
        try:
            with open(os.path.join(directory, name), "rb") as f:
                record = json.loads(f.read(_MAX_RECORD + 1)[:_MAX_RECORD])
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def all_saved(records: list[dict[str, Any]]) -> Saves:
    """Decide on `records` (the protocol in the module docstring); pure."""
    valid = [r for r in records if _is_int(r.get("rank")) and _is_int(r.get("attempt"))
             and _is_int(r.get("local_world_size")) and r["local_world_size"] > 0]
    if not valid:
        return Saves(0, 0, 0, 0, None)
    attempt = max(r["attempt"] for r in valid)
    newest = {r["rank"]: r for r in valid if r["attempt"] == attempt}
    expected = max(r["local_world_size"] for r in newest.values())
    saved = [r for r in newest.values() if r.get("saved") is True]
    steps = {r.get("step") for r in saved}
    step = steps.pop() if len(steps) == 1 else None
    return Saves(len(saved), expected, len(newest), attempt,
                 step if _is_int(step) else None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
