"""Human-readable byte sizes for the command's table."""

from __future__ import annotations

from typing import Optional

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(value: Optional[int]) -> str:
    """1536 -> '1.5 KiB'; None -> '-' (no limit, or nothing to read)."""
    if value is None:
        return "-"
    size = float(value)
    for unit in _UNITS:
        if abs(size) < 1024 or unit == _UNITS[-1]:
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
