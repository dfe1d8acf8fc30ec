"""JSON that people write (a `.json` schedule file, the CLI's `--args`, `--kwargs`,
`--options`), read strictly and refused in one line.

`json.loads` keeps the last of a key given twice, silently (TOML refuses it), reads `NaN`,
`Infinity` and a number too large for a float (`1e400`, infinite) although JSON has no such
value, and raises Python's own `ValueError` for an integer of more digits than
`sys.get_int_max_str_digits()`, with a hint about the interpreter's settings: here each is a
`JsonInputError` that says what is wrong with the text.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

__all__ = ["JsonInputError", "number_error", "read_json", "unique_keys"]


class JsonInputError(ValueError):
    """The JSON text cannot be read; the message says why, in one line."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object (`object_pairs_hook`), refused when it gives a key twice."""
    out = dict(pairs)
    if len(out) != len(pairs):  # the rare case: find the key to name it
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonInputError(f"the key {key!r} is given twice in one object")
            seen.add(key)
    return out


_DIGITS = re.compile(r"value has (\d+) digits")


def number_error(exc: ValueError) -> str:
    """Return the reason to show for a parser's `ValueError`: Python's refusal of a long
    integer said plainly (`int()` of more than `sys.get_int_max_str_digits()` digits), any
    other as it is."""
    message = str(exc)
    if "integer string conversion" not in message:
        return message
    found = _DIGITS.search(message)
    digits = f"{found.group(1)} digits" if found else "too many digits"
    return f"an integer has {digits}; the limit is {sys.get_int_max_str_digits()}"


_NO_NAN = "JSON has no NaN or infinite numbers"
# A number's text shown in a refusal: its first characters (an exponent may run long).
_SHOWN_DIGITS = 40


def _no_constant(name: str) -> Any:
    """`parse_constant`: `json.loads` calls it for `NaN`, `Infinity` and `-Infinity`."""
    raise JsonInputError(f"{name}: {_NO_NAN}")


def _finite_float(text: str) -> float:
    """`parse_float`: a number with a fraction or an exponent, refused if it reads as an
    infinite float (`1e400`: past the largest, about 1.8e308)."""
    value = float(text)
    if math.isinf(value):
        shown = text if len(text) <= _SHOWN_DIGITS else f"{text[:_SHOWN_DIGITS]}…"
        raise JsonInputError(
            f"the number {shown} is too large for a float (it would be read as infinite: {_NO_NAN})"
        )
    return value


def read_json(text: str | bytes, *, finite: bool = True) -> Any:
    """Return the value of the JSON `text` (bytes in UTF-8, -16 or -32, as `json.loads`).

    Raises `JsonInputError` for malformed JSON, a key given twice in one object, an integer
    too long to read, bytes that are not text, and (unless `finite` is False) `NaN`,
    `Infinity`, `-Infinity` or a number too large for a float, which JSON has not;
    `RecursionError` for nesting deeper than the stack (callers report that in their own
    terms).
    """
    try:
        if finite:
            return json.loads(
                text,
                object_pairs_hook=unique_keys,
                parse_float=_finite_float,
                parse_constant=_no_constant,
            )
        return json.loads(text, object_pairs_hook=unique_keys)
    except JsonInputError:
        raise
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a too-long integer
        raise JsonInputError(number_error(exc)) from exc
