"""Internal. The one door through which the tests see internals.

Go's tests see a package's internals through one file, `export_linux_test.go`
(`var ParseV1Number = parseV1Number`); this module is that file. What a test needs of a
module's private state is exported here once, by a name that says what it is for, so the
tests never read or write `obj._private` (tests/test_testdoor.py fails on any that does) and
a module can rename its privates by changing one line here. Nothing in `cgwatch` imports it,
and it imports psutil only when a psutil-view door is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Optional

from cgwatch import inotify, watchhub
from cgwatch.integrations import _autoload, _guarded

if TYPE_CHECKING:
    from cgwatch.psutil_view import _FastPath

# --- the integration mechanism (integrations/_autoload.py): what an adapter calls -----------

register_hook = _autoload.register
arm_hooks = _autoload.arm
arm_hook = _autoload.arm_hook
hook_status = _autoload.status  # the live dict: hook name -> status


# --- watchhub: the process's one inotify instance -------------------------------------------


def forget_inotify_refusals() -> None:
    """Forget the back-off after a refused creation (watchhub.Hub.start): the refusal a test
    injected (EMFILE from a patched inotify_init) must not keep the next test's monitors
    polling for the 0.5-1.5 s the back-off lasts (the fork test failed so, by timing)."""
    hub = watchhub.HUB
    with hub.lock:
        hub._refusals = 0
        hub._next_try = 0.0
        hub._refusal = None


# --- psutil_view: its process-wide state ----------------------------------------------------


def psutil_replaced() -> Optional[Callable[[], Any]]:
    """The `psutil.virtual_memory` that the installed patch replaced (None while unpatched)."""
    from cgwatch import psutil_view

    return psutil_view._host_virtual_memory


def psutil_host() -> Any:
    """psutil's own answer for the host, the one the view's fallback uses."""
    from cgwatch import psutil_view

    return psutil_view._host()


def psutil_fast_path() -> _FastPath:
    """The view's fast construction (its `usable` flag says whether it answers)."""
    from cgwatch import psutil_view

    return psutil_view._fast


def new_psutil_fast_path() -> None:
    """Close the fast construction's descriptor and start a fresh one (after a test moved
    `psutil.PROCFS_PATH`, or turned it off)."""
    from cgwatch import psutil_view

    psutil_view._fast.close()
    psutil_view._fast = psutil_view._FastPath()


def reset_psutil_view(original: Callable[[], Any]) -> None:
    """Forget every patch, also one left in a chain someone else wrapped (which
    `unpatch_psutil()` rightly refuses to remove), and give psutil `original` back."""
    import psutil

    from cgwatch import psutil_view

    with psutil_view._lock:
        psutil.virtual_memory = original
        psutil_view._installed = None
        psutil_view._host_virtual_memory = None
    new_psutil_fast_path()


# --- inotify: the ctypes binding ------------------------------------------------------------


@contextmanager
def bound_libc(libc: Optional[inotify.Libc]) -> Iterator[None]:
    """Inside the block, watchers use `libc` (None: bind again at the next use)."""
    saved = inotify._libc
    inotify._libc = libc
    try:
        yield
    finally:
        inotify._libc = saved


# --- the framework adapters (integrations/_guarded.py, transformers.py, lightning.py) --------

# What a checkpoint holds, as the adapters count it for the guard: the pure count and when
# they give it (tests/test_checkpoint_size.py).
state_bytes = _guarded.state_bytes
has_state = _guarded.has_state
CheckpointSize = _guarded.CheckpointSize
CHECKPOINT_EXTRAS_BYTES = _guarded.EXTRAS_BYTES



def build_callback_class(adapter: str) -> type:
    """The adapter's callback class built afresh (`_build()`), on the base the framework's
    module in sys.modules has now (a test's fake): not the cached class `callback_class()`
    keeps, which a fake base must not become for the rest of the process. `adapter`:
    "transformers" or "lightning"."""
    import importlib

    module = importlib.import_module(f"cgwatch.integrations.{adapter}")
    built: type = module._build()
    return built
