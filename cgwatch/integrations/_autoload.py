"""Internal. The import hook behind the environment switches, armed by the cgwatch .pth line.

At interpreter start, when `CGWATCH_PSUTIL` or `CGWATCH_DEEPSPEED` is set, the line in
`cgwatch-autoload.pth` (written by `python -m cgwatch.integrations install-pth`, see
`switches.py`) loads this file by path and calls `arm()`. This file is loaded without the
`cgwatch` package: `cgwatch/__init__.py` imports the monitor, ~25 ms that a process that never
imports psutil or DeepSpeed must not pay. So it imports nothing but `sys` and `os`, and defers
everything else to the moment the watched module has been imported:

- `CGWATCH_PSUTIL=1`: right after psutil's own `__init__` has run, `psutil.virtual_memory` is
  replaced by a small forwarding function. Its first call imports `cgwatch.psutil_view` (and so
  cgwatch), which adopts it as the installed patch; every call answers the cgroup-aware view.
  `import psutil` alone stays as cheap as without the switch.
- `CGWATCH_DEEPSPEED=1`: right after DeepSpeed's `real_accelerator` module has run, before any
  other DeepSpeed module asks for the accelerator, `cgwatch.integrations.deepspeed` installs
  its CPU accelerator (docs/integrations.md says why that moment).

A switch is on unless unset, empty, `0`, `false`, `no` or `off`. A failure inside a hook is
reported once on stderr and leaves the module as its authors made it (never break an import).
"""

from __future__ import annotations

import os
import sys

# typing and collections.abc cost ~3 ms to import at start-up; the annotations need neither.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType
    from typing import Any, Callable, Optional

PSUTIL_VAR = "CGWATCH_PSUTIL"
DEEPSPEED_VAR = "CGWATCH_DEEPSPEED"
REAL_ACCELERATOR = "deepspeed.accelerator.real_accelerator"
_OFF_VALUES = ("", "0", "false", "no", "off")

# What each switch did so far, for `python -m cgwatch.integrations status` and the tests.
status: dict[str, str] = {PSUTIL_VAR: "not armed", DEEPSPEED_VAR: "not armed"}


def switch_on(name: str, environ: Optional[Any] = None) -> bool:
    """True when the environment variable `name` asks for its switch."""
    env = os.environ if environ is None else environ
    return str(env.get(name, "")).strip().lower() not in _OFF_VALUES


def _warn(what: str, exc: BaseException) -> None:
    # No logging here: importing logging costs ~2.5 ms, and a warning at start-up that nobody
    # configured a handler for would be lost anyway.
    sys.stderr.write(f"cgwatch: {what} ignored: {type(exc).__name__}: {exc}\n")


# --- psutil --------------------------------------------------------------------------------


def _psutil_loaded(psutil: ModuleType) -> None:
    real = psutil.virtual_memory
    if getattr(real, "_cgwatch_adopt", None) is not None:
        return  # already ours (a second arm())
    view: list[Callable[[], Any]] = []

    def adopt() -> Callable[[], Any]:
        if not view:
            try:
                from cgwatch import psutil_view

                view.append(psutil_view._adopt_switch(virtual_memory, real))
                status[PSUTIL_VAR] = "installed"
            except Exception as exc:  # a broken cgwatch install: psutil's own answer
                _warn(f"{PSUTIL_VAR}=1", exc)
                status[PSUTIL_VAR] = f"skipped: {exc}"
                view.append(real)
        return view[0]

    def virtual_memory() -> Any:
        return (view[0] if view else adopt())()

    virtual_memory.__doc__ = real.__doc__
    virtual_memory.__wrapped__ = real  # type: ignore[attr-defined]
    virtual_memory._cgwatch_adopt = adopt  # type: ignore[attr-defined]
    psutil.virtual_memory = virtual_memory  # type: ignore[attr-defined]
    status[PSUTIL_VAR] = "armed: patched on first call"


# --- DeepSpeed ------------------------------------------------------------------------------


def _real_accelerator_loaded(module: ModuleType) -> None:
    try:
        from cgwatch.integrations import deepspeed

        deepspeed._on_real_accelerator_loaded(module)
        status[DEEPSPEED_VAR] = deepspeed.autoload_status()
    except Exception as exc:
        _warn(f"{DEEPSPEED_VAR}=1", exc)
        status[DEEPSPEED_VAR] = f"skipped: {exc}"


# --- the finder -----------------------------------------------------------------------------


class PostImportFinder:
    """A `sys.meta_path` finder that finds nothing itself: for each watched module it lets the
    other finders find it, and runs a callback right after the module's own code has run.
    Removes itself once every watched module has loaded. (Duck-typed: importlib.abc would cost
    an import at every interpreter start.)"""

    def __init__(self) -> None:
        self.watched: dict[str, Callable[[ModuleType], None]] = {}

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Any:
        # Popped while the other finders look: one that asks the whole chain again (another
        # copy of this finder, say) then gets None from us instead of a recursion.
        callback = self.watched.pop(fullname, None)
        if callback is None:
            return None
        try:
            spec = self._find_elsewhere(fullname, path, target)
        except BaseException:
            self.watched[fullname] = callback
            raise
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            self.watched[fullname] = callback  # not there (yet), or a loader we cannot wrap
            return spec
        self.unwatch(fullname)

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            callback(module)

        # The loader object is this spec's own (one per find), so patching it is local.
        loader.exec_module = exec_then_call  # type: ignore[union-attr]
        return spec

    def _find_elsewhere(self, fullname: str, path: Optional[Sequence[str]],
                        target: Optional[ModuleType]) -> Any:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is not self and find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    return spec
        return None

    def unwatch(self, fullname: str) -> None:
        self.watched.pop(fullname, None)
        if not self.watched:
            try:
                sys.meta_path.remove(self)  # atomic under the GIL; we run inside an import
            except ValueError:
                pass


finder = PostImportFinder()


def watch(fullname: str, callback: Callable[[ModuleType], None]) -> str:
    """Run `callback(module)` right after `fullname` is imported, or now if it already is."""
    module = sys.modules.get(fullname)
    if module is not None:
        callback(module)
        return "ran"
    finder.watched[fullname] = callback
    if finder not in sys.meta_path:
        sys.meta_path.insert(0, finder)
    return "armed"


def arm(environ: Optional[Any] = None) -> None:
    """Arm the hook of every switch that is on (what the .pth line calls)."""
    if switch_on(PSUTIL_VAR, environ) and watch("psutil", _psutil_loaded) == "armed":
        status[PSUTIL_VAR] = "armed: waiting for import psutil"
    if switch_on(DEEPSPEED_VAR, environ) and \
            watch(REAL_ACCELERATOR, _real_accelerator_loaded) == "armed":
        status[DEEPSPEED_VAR] = "armed: waiting for import deepspeed"
