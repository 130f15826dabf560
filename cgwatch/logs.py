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

    def warning(self, msg: str, *args: object) -> None:
        self.logger().warning(msg, *args, stacklevel=2)

    def exception(self, msg: str, *args: object) -> None:
        """Only inside an `except` block, as logging's own (the traceback is the one being
        handled). As Logger.exception, without its extra frame: on 3.9 stacklevel counts it."""
        self.logger().error(msg, *args, exc_info=True, stacklevel=2)


log = LazyLogger()
