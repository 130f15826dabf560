"""DeepSpeed's CPU accelerator with cgroup-aware memory totals.

DeepSpeed's `CPU_Accelerator.total_memory()` / `available_memory()` return
`psutil.virtual_memory().total` / `.available`: the host's RAM, not what the process's cgroup
allows. ZeRO 1/2 (flattening in `stage_1_and_2.py`), the autotuner, the inference v2 KV cache
and the DeepCompile passes plan from those two numbers. `CgwatchCPUAccelerator` is DeepSpeed's
own `CPU_Accelerator` (same name `cpu`, same backend, same ops) whose two memory answers come
from cgwatch, and whose `export_envs()` adds the `CGWATCH` prefix so DeepSpeed's multi-node
launcher forwards `CGWATCH_*` variables to the other nodes.

Three ways in, in the order DeepSpeed binds things (see docs/integrations.md):

1. Environment switch, no code change: once per environment run
   `python -m cgwatch.integrations install-pth` (writes `cgwatch-autoload.pth` into
   site-packages, see `switches.py`), then start anything with `CGWATCH_DEEPSPEED=1`. At
   interpreter start the .pth line arms this adapter's row of the hook table (`_autoload.py`,
   without importing cgwatch); the moment DeepSpeed's `real_accelerator` module has run,
   before any other DeepSpeed module asks for the accelerator, the hook calls `on_import`,
   which installs ours if DeepSpeed would have chosen its CPU accelerator. Without the
   variable the line does nothing but read it. DeepSpeed itself has no plugin or entry-point
   hook for accelerators.
2. `enable_autoload()` in your own code or `sitecustomize.py`, before `import deepspeed`:
   the same hook, armed by name.
3. `install()` after `import deepspeed` and before `deepspeed.initialize()`: what the engine
   and ZeRO ask at run time is then ours. Only `deepspeed.runtime.utils.torch_memory_reserved`
   / `torch_max_memory_reserved` (bound at import) keep pointing at the replaced accelerator;
   they report RSS, which both accelerators compute the same way.

What it exports (`__all__`) is what users call: `CgwatchCPUAccelerator` (built on first
access, on top of DeepSpeed's class: `integrations/_guarded.LazyClass`, as the guard's
callbacks are), `accelerator_class()`, `install()` / `uninstall()`, `enable_autoload()` /
`disable_autoload()` / `autoload_status()`, and `ENV_VAR`. Two more functions are called by
name, not by users: `on_import` (the hook table's row) and `check_main` (`python -m
cgwatch.integrations check`). The .pth file is `cgwatch.integrations.switches`'s.

Importing this module imports neither torch nor DeepSpeed.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, Optional

from cgwatch.integrations import _autoload
from cgwatch.integrations._guarded import LazyClass

if TYPE_CHECKING:
    from cgwatch.psutil_view import MemorySource

    CgwatchCPUAccelerator: type  # built on first access (module __getattr__)

__all__ = [
    "CgwatchCPUAccelerator",
    "ENV_VAR",
    "accelerator_class",
    "install",
    "uninstall",
    "enable_autoload",
    "disable_autoload",
    "autoload_status",
]

log = logging.getLogger(__name__)

HOOK = "deepspeed"  # this adapter's row in the hook table (_autoload.HOOKS)
ENV_VAR = _autoload.HOOKS[HOOK].var  # CGWATCH_DEEPSPEED
# export_envs() gains it: DeepSpeed's multi-node launcher forwards variables by prefix
_ENV_PREFIX = "CGWATCH"

_REAL_ACCELERATOR = _autoload.HOOKS[HOOK].trigger
_CPU_ACCELERATOR = "deepspeed.accelerator.cpu_accelerator"

_lock = threading.RLock()  # install / uninstall / arming, which may run inside an import
_previous: Any = None  # the accelerator that install() replaced, for uninstall()


def _build() -> type:
    base: Any = importlib.import_module(_CPU_ACCELERATOR).CPU_Accelerator

    class CgwatchCPUAccelerator(base):  # type: ignore[misc]
        """DeepSpeed's CPU accelerator; `total_memory()` / `available_memory()` answer for
        the process's memory cgroup (cgwatch) instead of the host (psutil)."""

        def __init__(self, monitor: Optional[MemorySource] = None) -> None:
            super().__init__()
            self._cgwatch_monitor = monitor

        def total_memory(self, device_index: Any = None) -> int:
            monitor = self._cgwatch_monitor
            if monitor is not None:
                return monitor.total_memory()
            from .. import default

            return default.total_memory()

        def available_memory(self, device_index: Any = None) -> int:
            monitor = self._cgwatch_monitor
            if monitor is not None:
                return monitor.available_memory()
            from .. import default

            return default.available_memory()

        def export_envs(self) -> list[str]:
            envs = list(super().export_envs())
            if _ENV_PREFIX not in envs:
                envs.append(_ENV_PREFIX)
            return envs

    CgwatchCPUAccelerator.__module__ = __name__
    CgwatchCPUAccelerator.__qualname__ = "CgwatchCPUAccelerator"
    return CgwatchCPUAccelerator


_accelerator = LazyClass(_build)
# `CgwatchCPUAccelerator`, built at the first call on top of DeepSpeed's `CPU_Accelerator`
# (imports DeepSpeed, hence torch)
accelerator_class = _accelerator.get
# `from cgwatch.integrations.deepspeed import CgwatchCPUAccelerator` (imports DeepSpeed)
__getattr__ = _accelerator.module_getattr("CgwatchCPUAccelerator", __name__)


def _install_into(ra: ModuleType, monitor: Optional[MemorySource], force: bool) -> Any:
    """Install into DeepSpeed's `real_accelerator` module `ra` (possibly still mid-import)."""
    global _previous
    cls = accelerator_class()
    cpu_cls = importlib.import_module(_CPU_ACCELERATOR).CPU_Accelerator
    current = ra.get_accelerator()  # DeepSpeed's own choice (DS_ACCELERATOR or detection)
    if isinstance(current, cls) and monitor is None:
        return current
    if not force and not isinstance(current, cpu_cls):
        raise RuntimeError(
            f"DeepSpeed selected the {getattr(current, '_name', type(current).__name__)!r} "
            "accelerator; cgwatch only replaces its CPU accelerator (pass force=True to "
            "replace it anyway)"
        )
    accel = cls(monitor)
    ra.set_accelerator(accel)
    if not isinstance(current, cls):
        _previous = current
    return accel


def install(monitor: Optional[MemorySource] = None, *, force: bool = False) -> Any:
    """Make `deepspeed.accelerator.get_accelerator()` return a `CgwatchCPUAccelerator`.

    Imports DeepSpeed. Call it before `deepspeed.initialize()`. Raises RuntimeError if
    DeepSpeed selected a non-CPU accelerator (CUDA, ...), unless `force`. Idempotent; returns
    the installed accelerator. `monitor`: a `cgwatch.Monitor` to ask instead of the default.
    """
    with _lock:
        return _install_into(importlib.import_module(_REAL_ACCELERATOR), monitor, force)


def uninstall() -> bool:
    """Give DeepSpeed back the accelerator that `install()` replaced. True if it did."""
    global _previous
    with _lock:
        ra = sys.modules.get(_REAL_ACCELERATOR)
        cls = _accelerator.built()
        if ra is None or cls is None or _previous is None:
            return False
        if not isinstance(ra.ds_accelerator, cls):
            return False
        ra.set_accelerator(_previous)
        _previous = None
        return True


def on_import(ra: ModuleType) -> str:
    """The hook (`_autoload.HOOKS["deepspeed"]`): DeepSpeed's `real_accelerator` module `ra`
    has just run. Installs ours unless DeepSpeed chose another accelerator; returns the status.
    Never raises (never break `import deepspeed`)."""
    try:
        wanted = os.environ.get("DS_ACCELERATOR")
        if wanted is not None and wanted != "cpu":
            why = f"DS_ACCELERATOR={wanted}"
            log.warning("cgwatch: %s=1 ignored, %s", ENV_VAR, why)
            return f"{_autoload.SKIPPED}{why}"
        _install_into(ra, None, force=False)
        log.info("cgwatch: DeepSpeed CPU accelerator memory now comes from the cgroup")
        return _autoload.INSTALLED
    except Exception as exc:
        log.warning("cgwatch: %s=1 ignored: %s", ENV_VAR, exc)
        return f"{_autoload.SKIPPED}{exc}"


def enable_autoload() -> str:
    """Arm the hook that installs `CgwatchCPUAccelerator` as DeepSpeed starts.

    Before `import deepspeed`: installs it right after DeepSpeed's `real_accelerator` module
    loads, before any DeepSpeed module asks for the accelerator, unless `DS_ACCELERATOR` names
    another accelerator or DeepSpeed detects a non-CPU one (then it logs why and leaves
    DeepSpeed's choice). After `import deepspeed`: installs now (as `install()`).
    Never raises. Returns `autoload_status()`.
    """
    with _lock:
        return _autoload.arm_hook(HOOK)


def disable_autoload() -> None:
    """Disarm the hook if DeepSpeed has not been imported yet (does not uninstall)."""
    with _lock:
        _autoload.disarm_hook(HOOK)


def autoload_status() -> str:
    """`not armed`, `armed`, `installed`, or `skipped: <why>` (armed by `enable_autoload()` or
    by the .pth switch: one hook, one status)."""
    return _autoload.status[HOOK]


def _check() -> dict[str, Any]:
    """Import DeepSpeed and report what its accelerator answers (for `check`)."""
    from .. import default

    accel = importlib.import_module("deepspeed.accelerator").get_accelerator()
    return {
        "env": {ENV_VAR: os.environ.get(ENV_VAR)},
        "autoload": autoload_status(),
        "accelerator": f"{type(accel).__module__}.{type(accel).__qualname__}",
        "total_memory": accel.total_memory(),
        "available_memory": accel.available_memory(),
        "export_envs": accel.export_envs(),
        "cgwatch_total_memory": default.total_memory(),
        "cgwatch_available_memory": default.available_memory(),
    }


def check_main() -> int:
    """`python -m cgwatch.integrations check` (switches.py calls it by the hook's row): one
    JSON report, or one line if DeepSpeed cannot be imported here."""
    try:
        report = _check()
    except ImportError as exc:
        print(f"cgwatch: cannot check DeepSpeed: {exc} (pip install 'cgwatch[deepspeed]' after "
              "a torch build)", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2))
    return 0
