"""Internal. Writes a guard's record (the format: guardrecord.py) to a file, for `cgwatch
replay`: `RecordedDecision` is the guard's decision writing each call it is given.
Buffered: a check between samples is one encode and one write into the file object's
buffer (no system call); the buffer goes to the file at each sample (`flush`), so a job the
OOM killer ends leaves its record up to its last sample, ~0.5 s before. Bounded: past
`max_bytes` one line says the record was cut there and nothing more is written (the replay
says so). A write that fails (a full disk) is one warning and the end of the record: the
guard's check never raises for it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Optional

from .decision import Decision
from .guardrecord import RecordEncoder, clock_us, header_line, note_line

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import TextIO

    from .decision import LevelSample
    from .policy import Verdict

log = logging.getLogger("cgwatch")

DEFAULT_MAX_BYTES = 1 << 30  # a week of a 10 ms step loop is ~1 GB (docs/guard.md)


def clock() -> int:
    """The guard's clock when it records: monotonic microseconds (guardrecord.clock_us)."""
    return time.monotonic_ns() // 1000


class RecordFile:
    """A guard's record being written to `path` (truncated first): the header now (the
    decision's `options`, the clock's `start_us`, `observe`, and `extra` fields such as the
    command), then one line per `check()` and `note()`, until `close()`."""

    def __init__(self, path: str, options: dict[str, Any], start_us: int, observe: bool,
                 max_bytes: int = DEFAULT_MAX_BYTES, **extra: Any) -> None:
        if max_bytes <= 0:
            raise ValueError(f"guard: record_bytes must be positive, not {max_bytes}")
        self.path = path
        self.max_bytes = max_bytes
        self._file: Optional[TextIO] = open(path, "w", encoding="utf-8",  # noqa: SIM115
                                            buffering=1 << 16)
        self._encoder = RecordEncoder(start_us)
        self.written = 0
        self.cut = False
        self._write(header_line(options, start_us, time.time(), observe, live=True,
                                pid=os.getpid(), **extra))
        self.flush()

    def check(self, us: int, available: Optional[int], killed: int, step: Optional[int],
              levels: Optional[Sequence[Sequence[Any]]] = None, failed: bool = False,
              verdict: Optional[dict[str, Any]] = None) -> None:
        """One check's inputs; at a sample (`levels` or `failed`) the buffer is flushed."""
        if self._file is None:
            return
        self._write(self._encoder.check(us, available, killed, step, levels, failed, verdict))
        if levels is not None or failed:
            self.flush()

    def note(self, kind: str, value: Any, **extra: Any) -> None:
        """A line between checks (guardrecord.note_line): a save, an estimate, the end."""
        if self._file is not None:
            self._write(note_line(kind, value, **extra))
            self.flush()

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as e:
                self._fail(e)

    def close(self) -> None:
        """Flush and close (again: nothing)."""
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, line: str) -> None:
        assert self._file is not None
        if self.written + len(line) > self.max_bytes:
            cut = note_line("cut", clock(), bytes=self.written)
            self.cut = True
            log.warning("cgwatch guard: the record %s reached its size cap (%d bytes): "
                        "nothing more is recorded; a replay stops here", self.path,
                        self.max_bytes)
            try:
                self._file.write(cut)
            except OSError:
                pass
            self.close()
            return
        try:
            self._file.write(line)
        except OSError as e:
            self._fail(e)
            return
        self.written += len(line)

    def _fail(self, error: OSError) -> None:
        log.warning("cgwatch guard: writing the record %s failed (%r): nothing more is "
                    "recorded", self.path, error)
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass


def end_record(decision: Decision, now: float, oom_killed: bool) -> None:
    """The job ended at `now` (`oom_killed`: by the OOM killer): a recording decision's last
    line, and its file closed; nothing for a decision that does not record."""
    if isinstance(decision, RecordedDecision):
        decision.record.note("end", round(now * 1e6), oom_killed=oom_killed)
        decision.record.close()


def record_path(path: str, environ: Mapping[str, str]) -> str:
    """`path` with "{rank}" replaced by this process's rank (RANK, as torchrun and Slurm's
    launchers set it, else LOCAL_RANK, as Lightning's own launcher does; else 0): one
    record per rank, each of its own decision."""
    if "{rank}" not in path:
        return path
    return path.replace("{rank}", environ.get("RANK") or environ.get("LOCAL_RANK") or "0")


def recorded_decision(path: str, options: dict[str, Any], observe: bool,
                      max_bytes: int = DEFAULT_MAX_BYTES, **extra: Any) -> Decision:
    """A `Decision` with `options` that writes every call it is given to a record at
    `path` ("{rank}" in it: this rank's, `record_path`) (`RecordedDecision`), its header
    saying `observe` and `extra`."""
    start = clock()
    return RecordedDecision(RecordFile(record_path(path, os.environ), options, start, observe,
                                       max_bytes, **extra), **options)


class RecordedDecision(Decision):
    """The guard's decision, each call written to a record as it is made (guardrecord.py):
    `cgwatch replay` makes the same calls in the same order, and a Decision is pure, so it
    answers the same. The times it is given are rounded to the microsecond first (what the
    record holds, guardrecord.clock_us: < 1 us from the live clock); what the decision
    needs of a check is only what it is given here, so nothing else need be recorded."""

    def __init__(self, record: RecordFile, **options: Any) -> None:
        super().__init__(**options)
        self.record = record
        self._due: Optional[tuple[int, Optional[int], int]] = None  # the last due()'s call
        self._loading = False  # in load_state_dict(): its saves are in its own line

    def due(self, now: float, available: Optional[int], killed: int) -> bool:
        us = round(now * 1e6)
        answer = super().due(clock_us(us), available, killed)
        if answer:
            self._due = (us, available, killed)  # written with the sample, or its failure
        else:
            self._due = None
            self.record.check(us, available, killed, None)
        return answer

    def sample(self, now: float, available: Optional[int], levels: Sequence[LevelSample],
               killed: int, step: Optional[int] = None) -> Verdict:
        us = round(now * 1e6)
        previous = self.verdict
        verdict = super().sample(clock_us(us), available, levels, killed, step)
        self._due = None
        self.record.check(us, available, killed, step,
                          levels=[tuple(lvl.as_dict().values()) for lvl in levels],
                          verdict=verdict.as_dict() if verdict.key() != previous.key()
                          else None)
        return verdict

    def sampling_failed(self, now: float, killed: int) -> None:
        us = round(now * 1e6)
        super().sampling_failed(clock_us(us), killed)
        due, self._due = self._due, None
        # After a due() of this check that said sample: its figure, so the replay calls
        # due() first; else the read of available_memory() itself failed (no due()).
        # (The kills are due()'s then: the guard reads them again for this call, and a kill
        # counted between the two reads of one failing check is the one thing not replayed.)
        if due is not None and due[0] == us:
            self.record.check(us, due[1], due[2], None, failed=True)
        else:
            self.record.check(us, None, killed, None, failed=True)

    def saved(self, seconds: float) -> None:
        super().saved(seconds)
        if not self._loading:
            self.record.note("saved", seconds)

    def estimate_checkpoint(self, nbytes: int) -> bool:
        taken = super().estimate_checkpoint(nbytes)
        if taken and not self._loading:
            self.record.note("estimate", nbytes)
        return taken

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        # Written as given: its saves and estimate come back through saved() and
        # estimate_checkpoint() above too, but the replay loads the whole state, as live.
        self.record.note("state", dict(state))
        self._loading = True
        try:
            super().load_state_dict(state)
        finally:
            self._loading = False

