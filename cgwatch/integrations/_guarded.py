"""Internal. What the adapters share. The memory guard's framework callbacks
(`transformers.py`, `lightning.py`): their guard (given, or made from keyword arguments at
first use), the verdict they acted on, the exit after the framework has returned. Every
adapter (those two and `deepspeed.py`'s accelerator): the class built on top of the
framework's base only when first asked for (`LazyClass`: importing an adapter imports no
framework, and this module imports no guard until one is made). The callbacks also say,
under `cgwatch run`, that this rank started and that it saved after its guard's stop
(`cgwatch/saves.py`: how `run` exits 75 when the launcher cannot say it)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from cgwatch.guard import Guard
    from cgwatch.policy import Verdict


class GuardUser:
    """Mixed into a framework's callback class (before the framework's base)."""

    guard: Optional[Guard]
    stopped: Optional[Verdict]  # the verdict acted on; None: the guard never stopped the run
    _guard_kwargs: dict[str, Any]

    def _use_guard(self, guard: Optional[Guard], guard_kwargs: dict[str, Any]) -> None:
        self.guard = guard
        self.stopped = None
        self._guard_kwargs = guard_kwargs
        self._rank: Optional[tuple[int, int]] = None  # (global rank, ranks on this node)

    def _record_start(self, rank: int, local_world_size: int) -> None:
        """This rank's trainer started (for `cgwatch run`, saves.py; nothing elsewhere)."""
        from cgwatch import saves

        self._rank = (rank, local_world_size)
        saves.record_start(rank, local_world_size)

    def _record_save(self, step: Optional[int], checkpoint: Optional[str]) -> None:
        """This rank's part of the guard's save is done (saves.py)."""
        if self._rank is not None:
            from cgwatch import saves

            saves.record_save(*self._rank, step, checkpoint)

    def _the_guard(self) -> Guard:
        if self.guard is None:
            from cgwatch.guard import Guard  # here: LazyClass's users need no guard

            self.guard = Guard(**self._guard_kwargs)
        return self.guard

    def exit_if_stopped(self) -> None:
        """If the guard stopped training: print its verdict and exit with
        `cgwatch.GUARD_EXIT_STATUS` (75). Otherwise return."""
        if self.stopped is not None:
            self._the_guard().exit(self.stopped)


class LazyClass:
    """A class built once, at the first `get()`, by `build()` (which imports the framework)."""

    def __init__(self, build: Callable[[], type]) -> None:
        self._build = build
        # Reentrant: the framework's import inside build() can run an import hook that asks
        # for the class again on this thread (DeepSpeed's accelerator: the autoload hook
        # fires while `import deepspeed` runs), which must not deadlock.
        self._lock = threading.RLock()
        self._class: Optional[type] = None

    def get(self) -> type:
        """The class (built by the first call)."""
        with self._lock:
            if self._class is None:
                built = self._build()
                if self._class is None:  # else a get() inside the build built it: keep that
                    self._class = built
            return self._class

    def built(self) -> Optional[type]:
        """The class if a `get()` has built it, else None (never builds)."""
        return self._class

    def module_getattr(self, name: str, module: str) -> Callable[[str], Any]:
        """A module `__getattr__` that answers `name` with the class, built then."""

        def __getattr__(attribute: str) -> Any:
            if attribute == name:
                return self.get()
            raise AttributeError(f"module {module!r} has no attribute {attribute!r}")

        return __getattr__
