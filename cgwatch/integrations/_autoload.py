"""Internal. The one integration mechanism: a table of hooks by name, one post-import finder,
one status per hook.

A hook is a row of `HOOKS`: its name, its environment switch, the module whose import
triggers it, and the adapter function (`"module:function"`) to run right after that module's
own code has run. The function gets the trigger module and returns the hook's status. This
file imports an adapter only by the name in its row, when the trigger has loaded: adapters
import this file, never the other way, and never each other (docs/design.md §13).

Two ways to arm a hook, the same finder behind both:

- the environment: at interpreter start, when a hook's variable is on, the line in
  `cgwatch-autoload.pth` (written by `python -m cgwatch.integrations install-pth`, see
  `switches.py`) loads `cgwatch/envswitch.py` and this file by path and calls `arm()`. Loaded
  without the `cgwatch` package: `cgwatch/__init__.py` imports the monitor, ~25 ms that a
  process that never imports psutil or DeepSpeed must not pay. So this file imports nothing
  but `sys`, `os` and `cgwatch.envswitch` (already in `sys.modules` then);
- code: `arm_hook(name)` (DeepSpeed's `enable_autoload()`).

Today's rows:

- `psutil` (`CGWATCH_PSUTIL=1`): right after psutil's own `__init__` has run,
  `psutil.virtual_memory` is replaced by a small forwarding function (`forward_psutil`, here
  because it must not import cgwatch). Its first call imports `cgwatch.psutil_view` (and so
  cgwatch), which adopts it as the installed patch; every call answers the cgroup-aware view.
  `import psutil` alone stays as cheap as without the switch.
- `deepspeed` (`CGWATCH_DEEPSPEED=1`): right after DeepSpeed's `real_accelerator` module has
  run, before any other DeepSpeed module asks for the accelerator,
  `cgwatch.integrations.deepspeed.on_import` installs its CPU accelerator
  (docs/integrations.md says why that moment).

A status is `not armed`, `armed`, `installed` or `skipped: <why>`. A failure inside a hook is
reported once on stderr and leaves the module as its authors made it (never break an import).
"""

from __future__ import annotations

import os
import sys

from cgwatch.envswitch import switch_on

# typing and collections.abc cost ~3 ms to import at start-up; the annotations need neither.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import ModuleType
    from typing import Any, Callable, Optional

NOT_ARMED = "not armed"
ARMED = "armed"
INSTALLED = "installed"
SKIPPED = "skipped: "


class Hook:
    """One row of the table (a plain class: namedtuple and dataclasses cost imports at start)."""

    __slots__ = ("name", "var", "trigger", "adapter")

    def __init__(self, name: str, var: str, trigger: str, adapter: str) -> None:
        self.name = name
        self.var = var  # the environment switch (envswitch spells on/off)
        self.trigger = trigger  # the module whose import runs the adapter
        self.adapter = adapter  # "module:function", imported only when the trigger has run


HOOKS: dict[str, Hook] = {}
# What each hook did so far, for `python -m cgwatch.integrations status` and the adapters.
status: dict[str, str] = {}


def register(name: str, var: str, trigger: str, adapter: str) -> None:
    """Add a row to the table (an adapter's one line below). A name is taken once: a second
    row under it would silently replace the first's switch, trigger and adapter, so it raises
    ValueError and leaves the table as it was."""
    if name in HOOKS:
        raise ValueError(f"hook {name!r} is already registered "
                         f"({HOOKS[name].var}, {HOOKS[name].adapter})")
    HOOKS[name] = Hook(name, var, trigger, adapter)
    status.setdefault(name, NOT_ARMED)


register("psutil", "CGWATCH_PSUTIL", "psutil", "cgwatch.integrations._autoload:forward_psutil")
register("deepspeed", "CGWATCH_DEEPSPEED", "deepspeed.accelerator.real_accelerator",
         "cgwatch.integrations.deepspeed:on_import")


def _warn(what: str, exc: BaseException) -> None:
    # No logging here: importing logging costs ~2.5 ms, and a warning at start-up that nobody
    # configured a handler for would be lost anyway.
    sys.stderr.write(f"cgwatch: {what} ignored: {type(exc).__name__}: {exc}\n")


def _run(name: str, module: ModuleType) -> None:
    """Run hook `name`'s adapter on its freshly imported trigger `module`; record its status."""
    hook = HOOKS[name]
    try:
        adapter, _, function = hook.adapter.partition(":")
        if adapter not in sys.modules:
            __import__(adapter)  # the builtin: importlib would cost an import here
        status[name] = getattr(sys.modules[adapter], function)(module)
    except Exception as exc:
        _warn(f"{hook.var}=1", exc)
        status[name] = f"{SKIPPED}{exc}"


# --- psutil's adapter: a forwarding function, so `import psutil` imports no cgwatch ----------


def forward_psutil(psutil: ModuleType) -> str:
    real = psutil.virtual_memory
    if getattr(real, "_cgwatch_adopt", None) is not None:
        return status["psutil"]  # already ours (a second arm)
    view: list[Callable[[], Any]] = []

    def adopt() -> Callable[[], Any]:
        if not view:
            try:
                from cgwatch import psutil_view

                view.append(psutil_view.adopt_switch(virtual_memory, real))
                status["psutil"] = INSTALLED
            except Exception as exc:  # a broken cgwatch install: psutil's own answer
                _warn(f"{HOOKS['psutil'].var}=1", exc)
                status["psutil"] = f"{SKIPPED}{exc}"
                view.append(real)
        return view[0]

    def virtual_memory() -> Any:
        return (view[0] if view else adopt())()

    virtual_memory.__doc__ = real.__doc__
    virtual_memory.__wrapped__ = real  # type: ignore[attr-defined]
    virtual_memory._cgwatch_adopt = adopt  # type: ignore[attr-defined]
    psutil.virtual_memory = virtual_memory  # type: ignore[attr-defined]
    return ARMED  # until the first call adopts it


# --- the finder -----------------------------------------------------------------------------


class PostImportFinder:
    """A `sys.meta_path` finder that finds nothing itself: for each watched module it lets the
    other finders find it, and runs its hook right after the module's own code has run.
    Removes itself once every watched module has loaded. (Duck-typed: importlib.abc would cost
    an import at every interpreter start.)"""

    def __init__(self) -> None:
        self.watched: dict[str, str] = {}  # trigger module -> hook name

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Any:
        # Popped while the other finders look: one that asks the whole chain again (another
        # copy of this finder, say) then gets None from us instead of a recursion.
        name = self.watched.pop(fullname, None)
        if name is None:
            return None
        try:
            spec = self._find_elsewhere(fullname, path, target)
        except BaseException:
            self.watched[fullname] = name
            raise
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            self.watched[fullname] = name  # not there (yet), or a loader we cannot wrap
            return spec
        self.unwatch(fullname)

        def exec_then_run(module: ModuleType) -> None:
            exec_module(module)
            _run(name, module)

        # The loader object is this spec's own (one per find), so patching it is local.
        loader.exec_module = exec_then_run  # type: ignore[union-attr]
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


def arm_hook(name: str) -> str:
    """Run hook `name` right after its trigger module is imported, or now if it already is.
    Idempotent. Returns its status."""
    hook = HOOKS[name]
    module = sys.modules.get(hook.trigger)
    if module is not None:
        _run(name, module)
    elif finder.watched.get(hook.trigger) != name:
        finder.watched[hook.trigger] = name
        if finder not in sys.meta_path:
            sys.meta_path.insert(0, finder)
        status[name] = ARMED
    return status[name]


def disarm_hook(name: str) -> None:
    """Stop waiting for hook `name`'s trigger (what it installed already stays)."""
    hook = HOOKS[name]
    if finder.watched.get(hook.trigger) == name:
        finder.unwatch(hook.trigger)
        status[name] = NOT_ARMED


def arm(environ: Optional[Mapping[str, str]] = None) -> None:
    """Arm every hook whose switch is on (what the .pth line calls)."""
    env = os.environ if environ is None else environ
    for name, hook in HOOKS.items():
        if switch_on(hook.var, env):
            arm_hook(name)
