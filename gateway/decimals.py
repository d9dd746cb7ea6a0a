"""Decimal numbers read off the wire (query parameters, headers, XML fields): ASCII digits only,
bounded before they are converted.

`int()` is the wrong parser for them: it takes ' +1_0 ' and Unicode digits such as '٣', and
raises ValueError past 4,300 digits; `str.isdigit()` also admits '²', which int() refuses.
"""

from __future__ import annotations

INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1


def parse(text: str, max_value: int) -> int | None:
    """The value of `text` when it is one or more ASCII digits (leading zeros allowed) and at
    most `max_value`; None for anything else, including surrounding whitespace and signs."""
    if not (text.isascii() and text.isdigit()):
        return None
    significant = text.lstrip("0")
    if len(significant) > len(str(max_value)):  # bounds int()'s work on a hostile string
        return None
    value = int(significant or "0")
    return value if value <= max_value else None
