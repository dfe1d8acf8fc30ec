"""A registration's definition: cadence, template and misfire policy, as an inert value.

The digest of a definition is what `upsert` compares: an unchanged digest means no write.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

from .cadence import (
    MISFIRES,
    Anchor,
    Cadence,
    Cron,
    Every,
    Misfire,
    cadence_from_fields,
    parse_every_ms,
)
from .errors import ScheduleError

__all__ = ["MAX_TEMPLATE_BYTES", "Definition", "define", "encode_template"]

# Templates are JSON objects of at most 64 KiB: a recurring task's arguments are small, and
# the registry is loaded by every pump tick that claims the registration.
MAX_TEMPLATE_BYTES = 64 * 1024

# Record fields a definition owns. upsert deletes the ones a new definition leaves out.
DEFINITION_FIELDS = ("every_ms", "anchor", "cron", "tz", "day_and", "misfire", "template")


def encode_template(template: object) -> str:
    """Return `template` as compact canonical JSON; raise `ScheduleError` if it is not JSON."""
    if not isinstance(template, Mapping):
        raise ScheduleError(
            f"template must be a JSON object (a dict), got {type(template).__name__}"
        )
    try:
        text = json.dumps(
            template, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False
        )
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"template is not JSON-serialisable: {exc}") from exc
    except RecursionError as exc:
        raise ScheduleError("template is nested too deeply to serialise") from exc
    _check_keys(template)  # after dumps, which refuses cycles
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_TEMPLATE_BYTES:
        raise ScheduleError(f"template is {size} bytes of JSON; the limit is {MAX_TEMPLATE_BYTES}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ScheduleError("template holds a string that is not valid UTF-8") from exc
    return text


def _check_keys(template: Mapping[Any, Any]) -> None:
    """Raise `ScheduleError` if a mapping in `template` has a key that is not a string.

    `json.dumps` would turn `{1: ...}` into `{"1": ...}`: the task would get other kwargs
    than the ones registered.
    """
    stack: list[Any] = [template]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ScheduleError(f"template keys must be strings, got {key!r}")
                stack.append(item)
        elif isinstance(value, list | tuple):
            stack.extend(value)


def _finite(value: Any) -> Any:
    # json.loads calls this with the name of the constant: "NaN", "Infinity", "-Infinity".
    raise ValueError(f"{value} is not JSON")


@dataclass(frozen=True, slots=True)
class Definition:
    """What a registration does and when: a cadence, a JSON template, a misfire policy.

    The template is validated and encoded once, at construction, with the digests: a sync of
    many definitions computes each once.
    """

    cadence: Cadence
    template: Mapping[str, Any] = field(default_factory=dict)
    misfire: Misfire = "coalesce"
    template_json: str = field(init=False, repr=False, compare=False)
    digest: str = field(init=False, repr=False, compare=False)
    cadence_digest: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.misfire not in MISFIRES:
            raise ScheduleError(f"misfire must be one of {MISFIRES}, got {self.misfire!r}")
        # A frozen dataclass sets its derived fields through object.__setattr__.
        object.__setattr__(self, "template_json", encode_template(self.template))
        object.__setattr__(self, "digest", _digest(self.to_fields()))
        object.__setattr__(self, "cadence_digest", _digest(self.cadence.to_fields()))

    def to_fields(self) -> dict[str, str]:
        """Return the record fields of this definition (EchoMQ's `every_ms` and `template`)."""
        fields = dict(self.cadence.to_fields())
        fields["template"] = self.template_json
        fields["misfire"] = self.misfire
        return fields

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Definition:
        """Rebuild a definition from a record; raise `ScheduleError` on a corrupt record."""
        cadence = cadence_from_fields(dict(fields))
        return cls(cadence, decode_template(fields.get("template")), misfire_from_fields(fields))


class FrozenDict(dict[str, Any]):
    """A template object that refuses changes: the pump shares one between occurrences.

    It is a `dict` for everything that reads (`json.dumps`, `isinstance`, `dict(t)`);
    `dict(t)`, `t.copy()` and `copy.deepcopy(t)` give plain, changeable copies.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(READ_ONLY)

    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


class FrozenList(list[Any]):
    """A template array that refuses changes; see `FrozenDict`."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(READ_ONLY)

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


READ_ONLY = (
    "an occurrence's template is shared by the occurrences of its registration and is "
    "read-only; change a copy (dict(template), copy.deepcopy(template))"
)


def freeze(value: Any) -> Any:
    """Return JSON data with every object and array made read-only (`FrozenDict`/`FrozenList`)."""
    if isinstance(value, dict):
        return FrozenDict({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list):
        return FrozenList(freeze(item) for item in value)
    return value


def decode_template(raw: str | None) -> dict[str, Any]:
    """Decode a record's template: a JSON object; raise `ScheduleError` on anything else."""
    if raw is None:
        raise ScheduleError("record has no template")
    try:
        template = json.loads(raw, parse_constant=_finite)
    except (ValueError, RecursionError) as exc:
        raise ScheduleError(f"record template is not JSON: {exc}") from exc
    if not isinstance(template, dict):
        raise ScheduleError(f"record template is a JSON {type(template).__name__}, not an object")
    return template


def misfire_from_fields(fields: Mapping[str, str]) -> Misfire:
    """Return a record's misfire policy (default `coalesce`); raise `ScheduleError` if unknown."""
    misfire = fields.get("misfire") or "coalesce"
    if misfire not in MISFIRES:
        raise ScheduleError(f"misfire must be one of {MISFIRES}, got {misfire!r}")
    return misfire


def _digest(fields: Mapping[str, str]) -> str:
    canonical = json.dumps(dict(sorted(fields.items())), separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def define(
    *,
    every: int | timedelta | str | None = None,
    every_ms: int | None = None,
    cron: str | None = None,
    tz: str | None = None,
    anchor: Anchor = "schedule",
    misfire: Misfire = "coalesce",
    template: Mapping[str, Any] | None = None,
    day_and: bool = False,
) -> Definition:
    """Build a `Definition` from keyword arguments; exactly one of `every`/`every_ms`/`cron`."""
    given = [
        k for k, v in (("every", every), ("every_ms", every_ms), ("cron", cron)) if v is not None
    ]
    if len(given) != 1:
        raise ScheduleError(
            "give exactly one cadence: every= (e.g. '15m'), every_ms=, or cron= "
            f"(got {', '.join(given) or 'none'})"
        )
    cadence: Cadence
    if cron is not None:
        cadence = Cron(cron, tz or "UTC", day_and)
    else:
        if tz is not None:
            raise ScheduleError("tz applies to cron schedules only; an interval has no time zone")
        raw = every if every is not None else every_ms
        assert raw is not None
        cadence = Every(parse_every_ms(raw), anchor)
    return Definition(cadence, template if template is not None else {}, misfire)
