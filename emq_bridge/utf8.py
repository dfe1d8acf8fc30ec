"""Text that must reach Redis as UTF-8: refused up front when it cannot.

A lone surrogate is what Python makes of invalid UTF-8 on a command line (`$'\\xff'` becomes
`'\\udcff'`) and of a JSON `"\\udfff"` escape. Redis stores bytes, so such a string fails only
when the command is encoded, as a `UnicodeEncodeError` after earlier writes of the same move:
these checks refuse it before anything is written, as `validate_name` does for names.
"""

from __future__ import annotations

import os

from .errors import ScheduleError
from .shown import clipped

__all__ = ["check_pause_texts", "check_utf8", "from_command_line", "is_utf8"]


def is_utf8(value: str) -> bool:
    """True when `value` encodes to UTF-8 (it holds no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def from_command_line(value: str) -> str:
    """Return an argument or environment variable as the text its bytes spell in UTF-8.

    In a locale whose encoding cannot decode them (`LC_ALL=C` without Python's UTF-8 mode:
    ASCII), Python keeps each byte past ASCII as a lone surrogate (`é` is `'\\udcc3\\udca9'`),
    which `check_utf8` would refuse. Its bytes (`os.fsencode`, the encoding that decoded it)
    are recovered and read as UTF-8; `value` is returned as is when they are not valid
    UTF-8, for the checks to refuse, or when it holds no surrogate.
    """
    if is_utf8(value):
        return value
    try:
        return os.fsencode(value).decode("utf-8")
    except UnicodeError:  # not the bytes of UTF-8 text (`$'\\xff'`), or not from the locale
        return value


def check_utf8(value: str, what: str) -> str:
    """Return `value`; `ScheduleError` naming `what` if it is not valid UTF-8 (a lone
    surrogate)."""
    if not is_utf8(value):
        raise ScheduleError(f"{what} {clipped(value)} is not valid UTF-8")
    return value


def check_pause_texts(note: object, by: object) -> None:
    """Raise `ScheduleError` if a pause's `note` or `by` is a string that is not valid UTF-8.

    What `Repeat.pause` and `emq-bridge pause` check before any write (the registry checks
    their type and length).
    """
    for value, what in ((note, "pause note"), (by, "pause by")):
        if isinstance(value, str):
            check_utf8(value, what)
