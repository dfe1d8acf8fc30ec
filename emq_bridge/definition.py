"""What a registration is: its definition, and the declared forms that produce one.

* `Definition`: cadence, template, misfire, overlap and failure policies, as an inert
  value. Its digest is what `upsert` compares: an unchanged digest means no write.
* `Declaration`: a definition some source wants at (queue, name); what a sync applies.
* `Schedule`: a recurring schedule declared on a task (a decorator, an actor option) before
  it is bound to the task's name and queue; both adapters bind it the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from .cadence import (
    MISFIRES,
    Anchor,
    Cadence,
    Cron,
    Every,
    Misfire,
    cadence_from_fields,
    parse_every,
    parse_every_ms,
)
from .errors import ScheduleError
from .keys import validate_name
from .template import (
    MAX_TEMPLATE_BYTES,
    TaskTemplate,
    check_structure,
    decode_template,
    encode_template,
    freeze,
)

__all__ = [
    "DEFINITION_FIELDS",
    "MAX_TEMPLATE_BYTES",
    "OVERLAPS",
    "Declaration",
    "Definition",
    "Overlap",
    "Schedule",
    "define",
    "misfire_from_fields",
]

# What a slot does while an occurrence of the same registration is in flight (claim.lua):
# `allow` sends it anyway; `skip` counts it as skipped; `buffer_one` keeps one to send when
# the running one finishes; `replace` sends it and revokes the running one (Celery).
Overlap = Literal["allow", "skip", "buffer_one", "replace"]
OVERLAPS: tuple[Overlap, ...] = ("allow", "skip", "buffer_one", "replace")
# The bound of `pause_after_failures`: a streak longer than this is a typo.
MAX_PAUSE_AFTER = 1_000_000

# Record fields a definition owns. upsert deletes the ones a new definition leaves out.
# `cadence_label` names a cadence computed outside the registry (a Celery schedule object),
# so that editing it changes the definition; upsert deletes it once a cadence has none.
DEFINITION_FIELDS = (
    "every_ms",
    "anchor",
    "cron",
    "tz",
    "day_and",
    "misfire",
    "template",
    "cadence_label",
    "overlap",
    "pause_after_failures",
)


@dataclass(frozen=True, slots=True)
class Definition:
    """What a registration does and when: a cadence, a JSON template, a misfire policy, an
    overlap policy and an optional pause after `pause_after_failures` consecutive failures.

    The defaults (`allow`, no pause) add no record field, so their digest is the one of a
    definition written before these policies existed. The template is validated and encoded
    once, at construction, with the digests: a sync of
    many definitions computes each once.
    """

    cadence: Cadence
    template: Mapping[str, Any] = field(default_factory=dict)
    misfire: Misfire = "coalesce"
    overlap: Overlap = "allow"
    pause_after_failures: int | None = None
    template_json: str = field(init=False, repr=False, compare=False)
    digest: str = field(init=False, repr=False, compare=False)
    cadence_digest: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.misfire not in MISFIRES:
            raise ScheduleError(f"misfire must be one of {MISFIRES}, got {self.misfire!r}")
        check_policies(self.overlap, self.pause_after_failures)
        # A frozen dataclass sets its derived fields through object.__setattr__.
        object.__setattr__(self, "template_json", encode_template(self.template))
        object.__setattr__(self, "digest", _digest(self.to_fields()))
        object.__setattr__(self, "cadence_digest", _digest(self.cadence.to_fields()))

    def to_fields(self) -> dict[str, str]:
        """Return the record fields of this definition (EchoMQ's `every_ms` and `template`)."""
        fields = dict(self.cadence.to_fields())
        fields["template"] = self.template_json
        fields["misfire"] = self.misfire
        if self.overlap != "allow":
            fields["overlap"] = self.overlap
        if self.pause_after_failures is not None:
            fields["pause_after_failures"] = str(self.pause_after_failures)
        return fields

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Definition:
        """Rebuild a definition from a record; raise `ScheduleError` on a corrupt record.

        The one decoder of records (the pump's, the reads'). The template comes back
        read-only (`FrozenDict`), since decoded definitions are shared, and is not encoded
        again: the stored text is its JSON. A record edited by hand into a template nested
        deeper than the rules allow is corrupt.
        """
        cadence = cadence_from_fields(dict(fields))
        misfire = misfire_from_fields(fields)
        overlap, pause_after = policies_from_fields(fields)
        raw = fields.get("template")
        template = decode_template(raw)
        check_structure(template)
        definition = object.__new__(cls)
        # A frozen dataclass sets its fields through object.__setattr__.
        object.__setattr__(definition, "cadence", cadence)
        object.__setattr__(definition, "template", freeze(template))
        object.__setattr__(definition, "misfire", misfire)
        object.__setattr__(definition, "overlap", overlap)
        object.__setattr__(definition, "pause_after_failures", pause_after)
        object.__setattr__(definition, "template_json", raw)
        object.__setattr__(definition, "digest", _digest(definition.to_fields()))
        object.__setattr__(definition, "cadence_digest", _digest(cadence.to_fields()))
        return definition


def misfire_from_fields(fields: Mapping[str, str]) -> Misfire:
    """Return a record's misfire policy (default `coalesce`); raise `ScheduleError` if unknown."""
    misfire = fields.get("misfire") or "coalesce"
    if misfire not in MISFIRES:
        raise ScheduleError(f"misfire must be one of {MISFIRES}, got {misfire!r}")
    return misfire


def check_policies(overlap: object, pause_after_failures: object) -> None:
    """Raise `ScheduleError` unless `overlap` and `pause_after_failures` are usable."""
    if overlap not in OVERLAPS:
        raise ScheduleError(f"overlap must be one of {OVERLAPS}, got {overlap!r}")
    if pause_after_failures is None:
        return
    if (
        isinstance(pause_after_failures, bool)
        or not isinstance(pause_after_failures, int)
        or not 1 <= pause_after_failures <= MAX_PAUSE_AFTER
    ):
        raise ScheduleError(
            f"pause_after_failures must be a whole number from 1 to {MAX_PAUSE_AFTER}, "
            f"got {pause_after_failures!r}"
        )


def policies_from_fields(fields: Mapping[str, str]) -> tuple[Overlap, int | None]:
    """Return a record's overlap policy and failure pause; `ScheduleError` if corrupt."""
    overlap = fields.get("overlap") or "allow"
    raw = fields.get("pause_after_failures") or None
    try:
        pause_after = None if raw is None else int(raw)
    except ValueError:
        raise ScheduleError(f"pause_after_failures must be a whole number, got {raw!r}") from None
    check_policies(overlap, pause_after)
    return overlap, pause_after  # type: ignore[return-value]  # checked just above


def _digest(fields: Mapping[str, str]) -> str:
    canonical = json.dumps(dict(sorted(fields.items())), separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def define(
    *,
    every: float | timedelta | str | None = None,
    every_ms: int | None = None,
    cron: str | None = None,
    tz: str | None = None,
    anchor: Anchor = "schedule",
    misfire: Misfire = "coalesce",
    template: Mapping[str, Any] | None = None,
    day_and: bool = False,
    overlap: Overlap = "allow",
    pause_after_failures: int | None = None,
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
        # A bare number is seconds for `every` (as in Celery), milliseconds for `every_ms`.
        if every is not None:
            every_in_ms = parse_every(every)
        else:
            assert every_ms is not None  # exactly one cadence was given
            every_in_ms = parse_every_ms(every_ms)
        cadence = Every(every_in_ms, anchor)
    return Definition(
        cadence,
        template if template is not None else {},
        misfire,
        overlap,
        pause_after_failures,
    )


@dataclass(frozen=True, slots=True)
class Declaration:
    """A schedule some source wants in the registry: a definition at (queue, name)."""

    queue: str
    name: str
    definition: Definition

    def __post_init__(self) -> None:
        validate_name(self.queue, "queue")
        validate_name(self.name, "registration name")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring schedule declared on a task, before it is bound to the task.

    Exactly one of `every` (seconds, a `timedelta` or a string like `"15m"`) or `cron` (5 fields,
    evaluated in `tz`, default UTC or the adapter's default zone). `args`/`kwargs` are
    passed to the task, `options` are the framework's sending options. `name` defaults to
    the task name; a task with several schedules needs a distinct `name` for each.
    `overlap` and `pause_after_failures` are the registration's policies (`Definition`). The
    cadence, the arguments (JSON) and the name are checked at construction.
    """

    every: float | timedelta | str | None = None
    cron: str | None = None
    tz: str | None = None
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] | None = None
    options: Mapping[str, Any] | None = None
    name: str | None = None
    anchor: Anchor = "schedule"
    misfire: Misfire = "coalesce"
    overlap: Overlap = "allow"
    pause_after_failures: int | None = None

    def __post_init__(self) -> None:
        if self.name is not None:
            validate_name(self.name, "schedule name")
        self.bind("task", "queue")  # checks the cadence and that the arguments are JSON

    def template(self, task: str) -> TaskTemplate:
        """Return the task template this schedule sends to `task`."""
        return TaskTemplate(task, self.args, self.kwargs or {}, self.options or {})

    def bind(self, task: str, queue: str, *, default_tz: str | None = None) -> Declaration:
        """Return this schedule as a declaration of `task` on `queue`.

        `default_tz` is the zone of a cron without `tz` (Celery's app time zone), else UTC.
        """
        definition = define(
            every=self.every,
            cron=self.cron,
            tz=self.tz or (default_tz if self.cron is not None else None),
            anchor=self.anchor,
            misfire=self.misfire,
            template=self.template(task).to_dict(),
            overlap=self.overlap,
            pause_after_failures=self.pause_after_failures,
        )
        return Declaration(queue, self.name or task, definition)
