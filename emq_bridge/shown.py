"""Values quoted in error messages, bounded: an error stays one short line, whatever was given."""

from __future__ import annotations

from datetime import timedelta

__all__ = ["clipped", "shown"]

# How much of a string an error quotes: enough to recognise it, short enough for one line.
QUOTED_CHARS = 80


def clipped(text: str, limit: int = QUOTED_CHARS) -> str:
    """Return `text` quoted (`repr`), cut to `limit` characters with '…' when longer."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}… ({len(text)} characters)"


def shown(value: object) -> str:
    """Quote a string (clipped) or a plain number; name the type of anything else, which may
    be big or deeply nested (its `repr` may be huge, or recurse past the stack)."""
    if isinstance(value, str):
        return clipped(value)
    if isinstance(value, bool | float | timedelta):
        return repr(value)
    if isinstance(value, int):  # a huge int has no str (sys.get_int_max_str_digits)
        return repr(value) if value.bit_length() <= 128 else f"a {value.bit_length()}-bit integer"
    return type(value).__name__
