"""Internal. Human-readable byte sizes for the command's table."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(value: Optional[int]) -> str:
    """1536 -> '1.5 KiB'; None -> '-' (no limit, or nothing to read). Any int, however large
    (a 400-digit one is printed in PiB, computed on ints: a float would overflow)."""
    if value is None:
        return "-"
    if abs(value) < 1024:
        return f"{value} B"
    for power, unit in enumerate(_UNITS[1:], start=1):
        if abs(value) < 1024 ** (power + 1) or unit == _UNITS[-1]:
            break
    scale = 1024 ** power
    if abs(value) < (1 << 900):  # float division is exact enough and rounds as before
        return f"{value / scale:.1f} {unit}"
    tenths = (abs(value) * 10 + scale // 2) // scale
    return f"{'-' if value < 0 else ''}{tenths // 10}.{tenths % 10} {unit}"
