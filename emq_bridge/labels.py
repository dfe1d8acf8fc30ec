"""Labels: a registration's `str -> str` tags (team, tier, ...), as Kubernetes has them.

Labels describe a registration; they never change when it fires. They are part of its
definition (a changed label is an update a sync logs) but not of its cadence digest, so a
label edit never moves the next run. Stored as one record field, `labels`: canonical JSON
(sorted keys, no spaces), absent when there are none, so that a definition without labels
keeps the digest it had before labels existed.

Rules: at most `MAX_LABELS` labels; a key is 1 to `MAX_KEY_CHARS` characters with no
whitespace, no control character and no `=` (the CLI's `KEY=VALUE` splits at the first one);
a value is at most `MAX_VALUE_CHARS` characters (it may be empty) with no control character.
Both must be valid UTF-8 (no lone surrogate, what invalid UTF-8 on a command line becomes).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Mapping

from .errors import ScheduleError
from .utf8 import check_utf8, is_utf8

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_LABELS",
    "MAX_VALUE_CHARS",
    "Labels",
    "check_labels",
    "decode_labels",
    "encode_labels",
    "matches",
    "parse_filter",
    "parse_selector",
]

MAX_LABELS = 32
MAX_KEY_CHARS = 63
MAX_VALUE_CHARS = 256

Labels = Mapping[str, str]


def _control(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


def check_labels(labels: object) -> dict[str, str]:
    """Return `labels` as a plain dict sorted by key; `ScheduleError` if one breaks the rules."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise ScheduleError(
            f"labels must be a mapping of strings to strings, got {type(labels).__name__}"
        )
    if len(labels) > MAX_LABELS:
        raise ScheduleError(f"labels: {len(labels)} given; the limit is {MAX_LABELS}")
    out: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str):
            raise ScheduleError(f"label keys must be strings, got {type(key).__name__}")
        if not key:
            raise ScheduleError("a label key must not be empty")
        if len(key) > MAX_KEY_CHARS:
            raise ScheduleError(
                f"label key {key[:20]!r}... is {len(key)} characters; the limit is {MAX_KEY_CHARS}"
            )
        check_utf8(key, "label key")
        if _control(key) or any(c.isspace() for c in key) or "=" in key:
            raise ScheduleError(
                f"label key {key!r} must not hold whitespace, control characters or '='"
            )
        if not isinstance(value, str):
            raise ScheduleError(
                f"label {key!r} must have a string value, got {type(value).__name__}"
            )
        if len(value) > MAX_VALUE_CHARS:
            raise ScheduleError(
                f"label {key!r} has a value of {len(value)} characters; "
                f"the limit is {MAX_VALUE_CHARS}"
            )
        if _control(value):
            raise ScheduleError(f"label {key!r} has a value with a control character")
        if not is_utf8(value):
            raise ScheduleError(f"label {key!r} has a value that is not valid UTF-8")
        out[key] = value
    return dict(sorted(out.items()))


def encode_labels(labels: Labels) -> str:
    """Return the record field of checked `labels`: canonical JSON ('' for none)."""
    if not labels:
        return ""
    return json.dumps(dict(sorted(labels.items())), separators=(",", ":"), ensure_ascii=False)


def decode_labels(raw: str | None) -> dict[str, str]:
    """Return the labels of a record field; `ScheduleError` on a corrupt one."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ScheduleError(f"labels must be a JSON object, got {raw[:40]!r}") from None
    return check_labels(value)


def parse_selector(items: Iterable[str], what: str = "label") -> dict[str, str]:
    """Return `KEY=VALUE` strings (the CLI's and the web view's) as labels.

    `ScheduleError` on an item without `=` or a key given twice with different values.
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ScheduleError(f"{what} {item!r} must be KEY=VALUE")
        if out.get(key, value) != value:
            raise ScheduleError(f"{what} {key!r} is given twice with different values")
        out[key] = value
    if len(out) > MAX_LABELS:  # a selector is bounded like the labels it matches
        raise ScheduleError(f"{what}: {len(out)} given; the limit is {MAX_LABELS}")
    return out


def parse_filter(items: Iterable[str], what: str = "label") -> dict[str, str]:
    """`parse_selector`, its pairs held to the rules of labels too (`check_labels`): a filter
    naming a key no schedule can have (empty, with whitespace) is a mistake, not a filter
    that matches nothing. `ScheduleError` saying which rule it breaks."""
    return check_labels(parse_selector(items, what))


def matches(labels: Labels, selector: Labels) -> bool:
    """True when `labels` holds every `KEY=VALUE` of `selector` (all must match)."""
    return all(labels.get(key) == value for key, value in selector.items())
