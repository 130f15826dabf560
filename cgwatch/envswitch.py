"""Internal. The one spelling of on and off for every `CGWATCH_*` environment switch.

`CGWATCH_PSUTIL`, `CGWATCH_DEEPSPEED` (and each adapter's variable in `integrations/_autoload.py`'s
table) and the core's `CGWATCH_THREAD` all read their value here, so `=0` and `=off` mean the
same everywhere. A value is, after `strip().lower()`:

- unset or empty: not given, the variable's own default applies (off for the integration
  switches, on for `CGWATCH_THREAD`);
- `0`, `false`, `no` or `off`: off;
- anything else (`1`, `yes`, `on`, `true`, ...): on.

Imports nothing: the core imports it under `import cgwatch` (tests/test_startup.py), and the
.pth line's boot code loads it by path at interpreter start, before `integrations/_autoload.py`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Optional

OFF_SPELLINGS = ("0", "false", "no", "off")
# What the .pth line's own test embeds (switches.pth_line): not given counts as off there.
NOT_ON = ("", *OFF_SPELLINGS)


def parse_switch(value: Optional[str]) -> Optional[bool]:
    """True (on), False (off), or None when not given (unset or empty)."""
    if value is None:
        return None
    word = value.strip().lower()
    if not word:
        return None
    return word not in OFF_SPELLINGS


def switch_on(name: str, environ: Mapping[str, str]) -> bool:
    """True when `environ[name]` says on (a switch whose default is off)."""
    return parse_switch(environ.get(name)) is True


def switch_off(name: str, environ: Mapping[str, str]) -> bool:
    """True when `environ[name]` says off (a switch whose default is on, as `CGWATCH_THREAD`)."""
    return parse_switch(environ.get(name)) is False
