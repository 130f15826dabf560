"""Internal. The environment switches (`CGWATCH_PSUTIL`, `CGWATCH_DEEPSPEED`: one per row of
the hook table in `_autoload.py`): the .pth file that arms them, and `python -m
cgwatch.integrations` (install-pth, uninstall-pth, status, check).

`install-pth` writes `cgwatch-autoload.pth` into site-packages, once per environment. Python
runs its one line at every start (site.py executes .pth lines that begin with `import`):

- every variable unset, empty or off (`0`, `false`, `no`, `off`: `cgwatch/envswitch.py`): one
  environ lookup per hook, two today;
- one on: it finds where the `cgwatch` package lies (asking the import system's finders,
  which also handles editable installs) and loads `cgwatch/envswitch.py` and
  `cgwatch/integrations/_autoload.py` by path, without importing the `cgwatch` package, then
  arms the hooks whose switch is on (see `_autoload.py`). cgwatch, psutil and DeepSpeed are
  imported only when the program imports psutil / DeepSpeed (and, for psutil, first calls
  `virtual_memory()`).

The .pth line names the variables of the table it was written from: after an upgrade that adds
a hook, `status` shows `"pth_current": false` until `install-pth` is run again.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sysconfig
from collections.abc import Sequence
from typing import Any, Optional

from cgwatch.envswitch import NOT_ON, switch_on
from cgwatch.integrations import _autoload

__all__ = ["PTH_NAME", "OLD_PTH_NAMES", "PSUTIL_VAR", "DEEPSPEED_VAR", "pth_line", "pth_path",
           "install_pth", "uninstall_pth", "switch_status", "main"]

PSUTIL_VAR = _autoload.HOOKS["psutil"].var
DEEPSPEED_VAR = _autoload.HOOKS["deepspeed"].var
PTH_NAME = "cgwatch-autoload.pth"
# Written by cgwatch 0.1.0 (DeepSpeed only; it imported cgwatch at start and called a
# function deepspeed.py no longer has). install-pth replaces it, uninstall-pth removes it.
OLD_PTH_NAMES = ("cgwatch-deepspeed.pth",)

# Run by the .pth line when a switch is on: loads the two stdlib-only files by path, in this
# order (_autoload imports envswitch). Only importlib.machinery (~0.4 ms, Python 3.11):
# importlib.util would pull in contextlib (~3 ms). Any failure is one line on stderr; the
# interpreter starts as if the switches were off.
_BOOT = """\
import sys
files = (("cgwatch.envswitch", "/envswitch.py"),
         ("cgwatch.integrations._autoload", "/integrations/_autoload.py"))
try:
    module = sys.modules.get(files[-1][0])  # a site dir can be processed twice (venv + lib64)
    if module is None:
        import importlib.machinery as machinery
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find("cgwatch", None) if find is not None else None
            if spec is not None:
                break
        else:
            raise ImportError("the cgwatch package is not importable")
        for name, where in files:
            if name in sys.modules:
                continue
            path = spec.submodule_search_locations[0] + where
            loader = machinery.SourceFileLoader(name, path)
            module = type(sys)(name)
            module.__file__ = path
            module.__loader__ = loader
            module.__spec__ = machinery.ModuleSpec(name, loader, origin=path)
            sys.modules[name] = module
            loader.exec_module(module)
    module.arm()
except Exception as exc:
    for name, _ in files:
        sys.modules.pop(name, None)
    sys.stderr.write(f"cgwatch: {VARS} ignored: {type(exc).__name__}: {exc}\\n")
"""


def _variables() -> tuple[str, ...]:
    return tuple(hook.var for hook in _autoload.HOOKS.values())


def pth_line() -> str:
    """The .pth file's one line."""
    boot = _BOOT.replace("{VARS}", "/".join(_variables()))
    # envswitch.switch_on, inlined: the line must cost no import while every switch is off.
    on = (f"any(os.environ.get(v, '').strip().lower() not in {NOT_ON!r} "
          f"for v in {_variables()!r})")
    return f"import os; {on} and exec({boot!r}, {{}})\n"


def pth_path(directory: Optional[str] = None) -> str:
    """Where `install_pth()` writes: `directory`, or this interpreter's site-packages."""
    return os.path.join(directory or sysconfig.get_paths()["purelib"], PTH_NAME)


def install_pth(directory: Optional[str] = None) -> str:
    """Write `cgwatch-autoload.pth` (inert while the variables are unset) and remove an older
    cgwatch .pth beside it. Returns its path. Idempotent."""
    path = pth_path(directory)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(pth_line())
    os.replace(tmp, path)
    for old in OLD_PTH_NAMES:
        try:
            os.unlink(os.path.join(os.path.dirname(path), old))
        except FileNotFoundError:
            pass
    return path


def uninstall_pth(directory: Optional[str] = None) -> bool:
    """Remove the .pth file (and an older cgwatch one). True if there was one."""
    removed = False
    path = pth_path(directory)
    for name in (PTH_NAME, *OLD_PTH_NAMES):
        try:
            os.unlink(os.path.join(os.path.dirname(path), name))
            removed = True
        except FileNotFoundError:
            pass
    return removed


def switch_status(directory: Optional[str] = None) -> dict[str, Any]:
    """Where the .pth goes, whether it is there, each variable and what its hook did."""
    path = pth_path(directory)
    return {
        "pth": path,
        "pth_installed": os.path.exists(path),
        "pth_current": _read(path) == pth_line(),
        "switches": {
            hook.var: {"value": os.environ.get(hook.var), "on": switch_on(hook.var, os.environ),
                       "hook": _autoload.status[name]}
            for name, hook in _autoload.HOOKS.items()
        },
    }


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cgwatch.integrations",
        description=f"Manage the zero-code switches: {PSUTIL_VAR}=1 makes psutil.virtual_memory()"
                    f" cgroup-aware, {DEEPSPEED_VAR}=1 gives DeepSpeed's CPU accelerator "
                    "cgroup-aware memory totals. Both need the .pth file (install-pth, once per "
                    "environment); it costs nothing while the variables are unset.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("install-pth", f"write {PTH_NAME} into site-packages (inert without the variables)"),
        ("uninstall-pth", f"remove {PTH_NAME}"),
        ("status", "show where the .pth goes, whether it is there, and the switches"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--dir", help="site directory (default: this interpreter's purelib)")
    sub.add_parser("check", help="import DeepSpeed and print its accelerator's memory answers")
    args = parser.parse_args(argv)

    if args.command == "install-pth":
        print(install_pth(args.dir))
    elif args.command == "uninstall-pth":
        path = pth_path(args.dir)
        print(f"removed {path}" if uninstall_pth(args.dir) else f"not present: {path}")
    elif args.command == "status":
        print(json.dumps(switch_status(args.dir), indent=2))
    else:
        # The adapter named by its row: the mechanism imports adapters only by name, so no
        # adapter's import of this module makes a circle (docs/design.md §13).
        adapter = _autoload.HOOKS["deepspeed"].adapter.partition(":")[0]
        check_main = importlib.import_module(adapter).check_main
        return int(check_main())
    return 0
