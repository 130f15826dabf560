"""Internal. The `cgwatch` logger for the modules `import cgwatch` loads, with `logging`
imported at the first record that can be emitted: its import is ~3 ms of every `import
cgwatch` (it pulls in traceback, string, re...), and most processes never log a record."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from typing import Optional

NAME = "cgwatch"


class LazyLogger:
    """The few methods the core modules call, forwarded to `logging.getLogger(NAME)` (the
    records name their caller: stacklevel=2)."""

    __slots__ = ("_logger",)

    def __init__(self) -> None:
        self._logger: Optional[logging.Logger] = None

    def logger(self) -> logging.Logger:
        found = self._logger
        if found is None:
            import logging

            found = self._logger = logging.getLogger(NAME)
        return found

    def debug(self, msg: str, *args: object) -> None:
        # Until something imports logging nothing can have configured it, and the default
        # (the root logger's WARNING) drops a debug record: dropped here without the import.
        if self._logger is None and "logging" not in sys.modules:
            return
        self.logger().debug(msg, *args, stacklevel=2)

    def info(self, msg: str, *args: object) -> None:
        # As debug(): dropped without the import until something imported logging.
        if self._logger is None and "logging" not in sys.modules:
            return
        self.logger().info(msg, *args, stacklevel=2)

    def warning(self, msg: str, *args: object) -> None:
        self.logger().warning(msg, *args, stacklevel=2)

    def exception(self, msg: str, *args: object) -> None:
        """Only inside an `except` block, as logging's own (the traceback is the one being
        handled). As Logger.exception, without its extra frame: on 3.9 stacklevel counts it."""
        self.logger().error(msg, *args, exc_info=True, stacklevel=2)


log = LazyLogger()


def reaches_last_resort(logger: logging.Logger, level: int) -> bool:
    """True when a record of `level` on `logger` goes to logging's last-resort handler:
    stderr, the message alone (its format is "%(message)s"). That is when no handler is on
    the logger or the ancestors it propagates to (Logger.callHandlers() then hands the record
    to `logging.lastResort`, WARNING and up; Python 3.2+): logging left unconfigured."""
    import logging

    last = logging.lastResort
    return last is not None and level >= last.level and logger.isEnabledFor(level) \
        and not logger.hasHandlers()

REPORTED_MAX = 100  # distinct problems logged per monitor

# Reasons logged by this process (inherited by a fork child: what its parent said already
# is not said again by each of a pool's workers).
_said: set[str] = set()


class Reporter:
    """One monitor's problem log: each distinct reason once (a process-wide one once per
    process), at most
    REPORTED_MAX reasons per monitor (a file whose bad content keeps changing makes a new
    reason each time, and a process runs for weeks), then one line saying the rest are not
    logged. A choice rather than a problem (polling to leave the uid's inotify instances to
    others) is logged at INFO: with no logging configured, Python's last-resort handler
    prints WARNING records to stderr, which was one line per worker of a fork pool."""

    def __init__(self) -> None:
        self._reported: set[str] = set()

    def report(self, reason: str, choice: bool = False, per_process: bool = False) -> None:
        """`per_process`: a state of the process, not of this monitor (the process's inotify
        instance): logged by the first monitor that meets it only."""
        if not reason or reason in self._reported or len(self._reported) > REPORTED_MAX:
            return
        self._reported.add(reason)
        if len(self._reported) > REPORTED_MAX:
            log.warning("cgwatch: more than %d distinct problems; not logging further ones "
                        "(status.reason still shows the current one)", REPORTED_MAX)
            return
        if per_process:
            if reason in _said:
                return
            _said.add(reason)
        if choice:
            log.info("cgwatch: %s", reason)
        else:
            log.warning("cgwatch: %s", reason)
