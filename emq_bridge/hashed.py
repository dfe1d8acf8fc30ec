"""Stable hashes of a registration, and Jenkins' `H` in cron fields. Pure: no I/O, no clock.

`H` stands for one value per registration name, derived from a hash of the name (the
`seed`), so many schedules written `H * * * *` spread over the hour instead of all firing
at :00, yet each keeps the same minute on every host and after every restart (Python's
`hash` is salted per process, so it is not used). Forms, in any field but a list's bounds:

* `H`: a value in the field's range (day of month 1-28, so that every month has it);
* `H(a-b)`: a value in `a..b`;
* `H/n`, `H(a-b)/n`: every `n`, from a hashed start below `a + n`.
"""

from __future__ import annotations

import hashlib
import re

from .errors import ScheduleError

__all__ = ["resolve_hashed", "stable_hash", "uses_hash"]

# The ranges H draws from, for 5 fields (minute first) or 6 (second first).
_RANGES_5 = ((0, 59), (0, 23), (1, 28), (1, 12), (0, 6))
_RANGES_6 = ((0, 59), *_RANGES_5)
_NAMES_5 = ("minute", "hour", "day of month", "month", "day of week")
_NAMES_6 = ("second", *_NAMES_5)
_TERM = re.compile(r"H(?:\((\d{1,2})-(\d{1,2})\))?(?:/(\d{1,2}))?", re.ASCII)


_USES = re.compile(r"(?:^|[\s,])[Hh]")


def uses_hash(expr: str) -> bool:
    """True when a cron expression has an `H` term (day names such as THU do not count)."""
    return _USES.search(expr) is not None


def stable_hash(seed: str, salt: str) -> int:
    """Return a 64-bit hash of (`seed`, `salt`), the same in every process and version."""
    digest = hashlib.sha256(f"{seed}\x00{salt}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def resolve_hashed(fields: list[str], seed: str) -> list[str]:
    """Return `fields` (5 or 6 cron fields) with every `H` term replaced by plain cron.

    Raises `ScheduleError` on an `H` term that is malformed or out of the field's range.
    """
    if not uses_hash(" ".join(fields)):
        return fields
    ranges, names = (_RANGES_6, _NAMES_6) if len(fields) == 6 else (_RANGES_5, _NAMES_5)
    out = []
    for index, text in enumerate(fields):
        terms = []
        for term in text.split(","):
            if not term.upper().startswith("H"):
                terms.append(term)
                continue
            terms.append(_resolve_term(term.upper(), ranges[index], names[index], seed, index))
        out.append(",".join(terms))
    return out


def _resolve_term(term: str, bounds: tuple[int, int], what: str, seed: str, index: int) -> str:
    match = _TERM.fullmatch(term)
    if match is None:
        raise ScheduleError(f"{what} field {term!r}: use H, H(a-b), H/n or H(a-b)/n")
    low, high = bounds
    if match.group(1) is not None:
        low, high = int(match.group(1)), int(match.group(2))
        if not bounds[0] <= low <= high <= bounds[1]:
            raise ScheduleError(
                f"{what} field {term!r}: the range must lie within {bounds[0]}-{bounds[1]}"
            )
    value = stable_hash(seed, f"cron-field-{index}")
    if match.group(3) is None:
        return str(low + value % (high - low + 1))
    step = int(match.group(3))
    if not 1 <= step <= high - low + 1:
        raise ScheduleError(f"{what} field {term!r}: the step must be 1 to {high - low + 1}")
    return f"{low + value % step}-{high}/{step}"
