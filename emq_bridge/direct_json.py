"""`direct_encoder`: a `json.JSONEncoder`'s `encode`, with the C encoder called directly.

`JSONEncoder.encode` runs a few Python frames and builds the C encoder on every call: for a
value of about 100 bytes (a template, a task's body) that costs more than the encoding.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from typing import Any

__all__ = ["direct_encoder"]

# Values the direct encoder must write exactly as `reference.encode` does before it is used.
_PROBES: tuple[Any, ...] = (
    {"b": [1, 2.5, None, True], "a": {"z": 'a\u00e9"\n', "y": {}}, "c": []},
    ([1, 'a\u00e9"', 2.5, None, True], {"k": [{}]}, {"c": None}),
    ((), {}, {}),
)


def direct_encoder(
    reference: json.JSONEncoder, *, check_circular: bool = True
) -> Callable[[Any], str]:
    """Return what writes `reference.encode(value)` for a dict, list or tuple `value`,
    calling the C encoder directly; `reference.encode` itself where there is no C encoder,
    an indent, or a probe written otherwise (another Python's json module).

    With `check_circular` the C encoder is built per call (its cycle check is per
    encoding: a cycle raises ValueError, as `reference.encode` does); without it, once, and
    a cycle raises RecursionError (for values decoded from JSON, which have none)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or reference.indent is not None:
        return reference.encode
    quote = (
        json.encoder.encode_basestring_ascii
        if reference.ensure_ascii
        else json.encoder.encode_basestring
    )
    settings = (
        reference.default,
        quote,
        None,
        reference.key_separator,
        reference.item_separator,
        reference.sort_keys,
        reference.skipkeys,
        reference.allow_nan,
    )
    if check_circular:

        def encode(value: Any) -> str:
            return "".join(make({}, *settings)(value, 0))

    else:
        once = make(None, *settings)

        def encode(value: Any) -> str:
            return "".join(once(value, 0))

    try:
        if all(encode(probe) == reference.encode(probe) for probe in _PROBES):
            return encode
    except Exception:  # another signature than the one this was written for
        pass
    return reference.encode
