"""Values quoted in error messages, bounded: an error stays one short line, whatever was given."""

from __future__ import annotations

from datetime import timedelta

__all__ = ["clipped", "printable", "shown"]

# How much of a string an error quotes: enough to recognise it, short enough for one line.
QUOTED_CHARS = 80


# Control characters (C0, DEL, C1) as escapes: a text from outside (a pause note, a task's
# error, a name in a file) printed to a terminal must not move its cursor, change its
# colours, or start a line of its own that reads as another field.
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
# And the bidirectional controls as `\\uNNNN`: a right-to-left override in a note would
# reorder what the terminal shows of the rest of its line.
_CONTROLS.update(
    {code: f"\\u{code:04x}" for code in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F))}
)
_CONTROLS.update({code: f"\\u{code:04x}" for code in range(0x2066, 0x206A)})


def printable(text: str) -> str:
    """Return `text` with its control characters written as `\\xNN` escapes, and its
    bidirectional controls as `\\uNNNN`."""
    return text if text.isprintable() else text.translate(_CONTROLS)


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
