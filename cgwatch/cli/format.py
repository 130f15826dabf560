"""Internal. The text line of one event or headroom alert, as `cgwatch watch` prints it and
`cgwatch run -v` passes it to stderr."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

from .. import counters
from ..alerts import HeadroomAlert

if TYPE_CHECKING:
    from ..events import Item


def format_item(item: Item, wall: Optional[float] = None) -> str:
    """One line: local time, severity, message."""
    stamp = time.strftime("%H:%M:%S", time.localtime(wall if wall is not None else time.time()))
    if isinstance(item, HeadroomAlert):
        return f"{stamp} {'WARNING' if item.below else 'INFO':7} {item.message()}"
    return (f"{stamp} {counters.severity(item.counter).upper():7} "
            f"{item.message()}")
