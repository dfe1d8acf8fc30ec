"""What a registration is: its definition, and the declared forms that produce one.

* `Definition`: cadence, template, misfire, overlap and failure policies, as an inert
  value. Its digest is what `upsert` compares: an unchanged digest means no write.
* `Declaration`: a definition some source wants at (queue, name); what a sync applies.
* `Schedule`: a recurring schedule declared on a task (a decorator, an actor option) before
  it is bound to the task's name and queue; both adapters bind it the same way.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import json.encoder
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from .bounds import Bounds, Instant, epoch_ms, instants_ms
from .cadence import (
    MAX_CATCHUP_MAX,
    MAX_EVERY_MS,
    MISFIRES,
    Anchor,
    At,
    Cadence,
    Cron,
    Every,
    Misfire,
    misfire_policy,
    parse_every,
    parse_every_ms,
    parse_span,
)
from .calendars import Calendar, ExcludeItem, resolve_exclude
from .errors import ScheduleError
from .jitter import bound_jitter, parse_jitter, reseed, shape, shaped_from_fields
from .keys import validate_name
from .labels import Labels, check_labels, decode_labels, encode_labels
from .shown import shown
from .template import (
    MAX_TEMPLATE_BYTES,
    TaskTemplate,
    check_task_name,
    decode_frozen,
    encode_template,
    freeze,
)
from .template_pieces import PIECES_FIELD, join_template

__all__ = [
    "DEFINITION_FIELDS",
    "MAX_TEMPLATE_BYTES",
    "OVERLAPS",
    "Declaration",
    "Definition",
    "Overlap",
    "Schedule",
    "catchup_window_ms",
    "check_misfire",
    "define",
    "misfire_from_fields",
    "naming_schedule",
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
    # A template stored in pieces (template_pieces.py): their count; upsert.lua drops the
    # pieces of the template it replaces.
    PIECES_FIELD,
    "cadence_label",
    "overlap",
    "pause_after_failures",
    # Aligned intervals, bounds and one-offs (bounds.py); `remaining`, `completed` and
    # `completed_ms` are state, outside the digest.
    "offset_ms",
    "at",
    "start_ms",
    "end_ms",
    "limit",
    "immediately",
    # The misfire policy's catch-up window (ms) and `all`'s bound per catch-up (cadence.py).
    "catchup_window",
    "catchup_max",
    # Calendars (calendars.py: the rules and the names of the calendars they came from),
    # jitter (jitter.py) and the seed of jitter and a cron's H (the registration's name).
    "exclude",
    "calendars",
    "jitter_ms",
    "seed",
    # Labels (labels.py): canonical JSON of str -> str, in the digest, not the cadence digest.
    "labels",
)


@dataclass(frozen=True, slots=True)
class Definition:
    """What a registration does and when: a cadence, a JSON template, a misfire policy, an
    overlap policy, an optional pause after `pause_after_failures` consecutive failures, and
    its `bounds` (start, end, run limit, a first run at once: emq_bridge.bounds). The misfire
    policy's catch-up window (`catchup_window_ms`) and `all`'s bound (`catchup_max`) are
    stored only when given (cadence.catch_up). `labels` tag it (emq_bridge.labels): part of
    the digest, never of the cadence digest, so editing them never moves the next run.

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
    bounds: Bounds = field(default_factory=Bounds)
    catchup_window_ms: int | None = None
    catchup_max: int | None = None
    labels: Labels = field(default_factory=dict)
    template_json: str = field(init=False, repr=False, compare=False)
    digest: str = field(init=False, repr=False, compare=False)
    cadence_digest: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_misfire(self.misfire, self.catchup_window_ms, self.catchup_max)
        check_policies(self.overlap, self.pause_after_failures)
        if not isinstance(self.bounds, Bounds):
            raise ScheduleError(f"bounds must be a Bounds, got {type(self.bounds).__name__}")
        object.__setattr__(self, "cadence", bound_jitter(self.cadence, self.bounds.end_ms))
        self.bounds.check(self.cadence)
        # A frozen dataclass sets its derived fields through object.__setattr__.
        labels = _NO_LABELS if _no_labels(self.labels) else freeze(check_labels(self.labels))
        object.__setattr__(self, "labels", labels)
        template_json = encode_template(self.template)
        object.__setattr__(self, "template_json", template_json)
        object.__setattr__(self, "digest", _definition_digest(self, template_json))
        object.__setattr__(self, "cadence_digest", _cadence_digest(self.cadence, self.bounds))

    if not TYPE_CHECKING:  # to mypy, the digests are the plain str fields declared above

        def __getattr__(self, name: str) -> str:
            # Only for a slot never set: the digests of a definition from `from_fields`.
            if name == "digest":
                value = _definition_digest(self, self.template_json)
            elif name == "cadence_digest":
                value = _cadence_digest(self.cadence, self.bounds)
            else:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            object.__setattr__(self, name, value)
            return value

    def to_fields(self) -> dict[str, str]:
        """Return the record fields of this definition (EchoMQ's `every_ms` and `template`)."""
        fields = dict(self.cadence.to_fields())
        fields["template"] = self.template_json
        fields["misfire"] = self.misfire
        if self.catchup_window_ms is not None:
            fields["catchup_window"] = str(self.catchup_window_ms)
        if self.catchup_max is not None:
            fields["catchup_max"] = str(self.catchup_max)
        if self.overlap != "allow":
            fields["overlap"] = self.overlap
        if self.pause_after_failures is not None:
            fields["pause_after_failures"] = str(self.pause_after_failures)
        bounds = self.bounds
        if not (bounds.start_ms is None and bounds.end_ms is None and bounds.limit is None):
            fields.update(bounds.to_fields())
        elif bounds.immediately:
            fields["immediately"] = "1"
        if self.labels:
            fields["labels"] = encode_labels(self.labels)
        return fields

    def first_run(self, now_ms: int, *, created: bool = True) -> int:
        """Return the first run of this definition written at `now_ms` (see `Bounds`)."""
        return self.bounds.first_run(self.cadence, now_ms, created=created)

    def computed_by(self) -> str | None:
        """Return what computes this definition's runs outside the registry, or None.

        A Celery custom schedule (`solar`, `relative=True`, a class with its own `is_due`)
        is stored as a placeholder interval whose template names it (`"schedule": "celery
        <solar: ...>"`): only the app's process knows its runs."""
        text = self.template.get("schedule")
        if isinstance(text, str) and text and isinstance(self.cadence, Every):
            return text
        return None

    def describe_cadence(self) -> str:
        """Its cadence in words: `celery <label>` for a Celery custom schedule."""
        return self.computed_by() or self.cadence.describe()

    def for_name(self, name: str) -> Definition:
        """Return this definition with `name` as the seed of its H fields and jitter, where
        it has none (`define(seed=...)`); itself when it uses neither."""
        cadence = reseed(self.cadence, name)
        return self if cadence is self.cadence else replace(self, cadence=cadence)

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Definition:
        """Rebuild a definition from a record; raise `ScheduleError` on a corrupt record.

        The one decoder of records (the pump's, the reads'). The template comes back
        read-only (`FrozenDict`), since decoded definitions are shared, and is not encoded
        again: the stored text is its JSON. A record edited by hand into a template nested
        deeper than the rules allow is corrupt.
        """
        cadence = shaped_from_fields(dict(fields))
        misfire, window, most = misfire_from_fields(fields)
        overlap, pause_after = policies_from_fields(fields)
        bounds = Bounds.from_fields(fields)
        cadence = bound_jitter(cadence, bounds.end_ms)
        bounds.check(cadence)
        raw = join_template(fields)
        template = decode_frozen(raw)
        definition = object.__new__(cls)
        # A frozen dataclass sets its fields through object.__setattr__.
        object.__setattr__(definition, "cadence", cadence)
        object.__setattr__(definition, "template", template)
        object.__setattr__(definition, "misfire", misfire)
        object.__setattr__(definition, "overlap", overlap)
        object.__setattr__(definition, "pause_after_failures", pause_after)
        object.__setattr__(definition, "bounds", bounds)
        object.__setattr__(definition, "catchup_window_ms", window)
        object.__setattr__(definition, "catchup_max", most)
        raw_labels = fields.get("labels")
        labels = freeze(decode_labels(raw_labels)) if raw_labels else _NO_LABELS
        object.__setattr__(definition, "labels", labels)
        object.__setattr__(definition, "template_json", raw)
        # `digest` and `cadence_digest` are computed when first read (`__getattr__`): the
        # pump decodes every record it fires and never reads them.
        return definition


# What a decoded record without labels holds (shared: the pump decodes every record it fires).
_NO_LABELS = freeze({})


def _no_labels(labels: object) -> bool:
    """True for no labels (most definitions): nothing to check or freeze."""
    return labels is None or labels is _NO_LABELS or (type(labels) is dict and not labels)


Offset = float | timedelta | str | datetime
"""An interval's grid offset: a duration as `every` takes it, or a datetime on the grid."""


def misfire_from_fields(fields: Mapping[str, str]) -> tuple[Misfire, int | None, int | None]:
    """Return a record's misfire policy (default `coalesce`, i.e. `latest`), catch-up window
    (ms) and `all`'s bound; raise `ScheduleError` if one is unusable."""
    misfire = fields.get("misfire") or "coalesce"
    if not (fields.get("catchup_window") or fields.get("catchup_max")):  # most records
        check_misfire(misfire, None, None)
        return misfire, None, None  # type: ignore[return-value]  # checked just above
    numbers: list[int | None] = []
    for key in ("catchup_window", "catchup_max"):
        raw = fields.get(key) or None
        try:
            numbers.append(None if raw is None else int(raw))
        except ValueError:
            raise ScheduleError(f"{key} must be a whole number, got {shown(raw)}") from None
    window, most = numbers
    check_misfire(misfire, window, most)
    return misfire, window, most  # type: ignore[return-value]  # checked just above


def check_misfire(misfire: object, window_ms: object, most: object) -> None:
    """Raise `ScheduleError` unless the misfire policy, window (ms) and `all`'s bound fit."""
    if misfire not in MISFIRES:
        raise ScheduleError(f"misfire must be one of {MISFIRES}, got {shown(misfire)}")
    if window_ms is not None and (
        isinstance(window_ms, bool)
        or not isinstance(window_ms, int)
        or not 1 <= window_ms <= MAX_EVERY_MS
    ):
        raise ScheduleError(
            "catchup_window must be a positive duration of at most 1000 years, "
            f"got {shown(window_ms)}"
        )
    if most is None:
        return
    if misfire_policy(misfire) != "all":
        raise ScheduleError(f"catchup_max applies to misfire='all' only, not {shown(misfire)}")
    if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= MAX_CATCHUP_MAX:
        raise ScheduleError(
            f"catchup_max must be a whole number from 1 to {MAX_CATCHUP_MAX}, got {shown(most)}"
        )


def catchup_window_ms(window: float | timedelta | str | None) -> int | None:
    """Return a catch-up window in ms from seconds, a `timedelta` or a string like `"10m"`."""
    if window is None:
        return None
    try:
        return parse_every(window)
    except ScheduleError as exc:
        raise ScheduleError(str(exc).replace("every", "catchup_window", 1)) from None


def check_policies(overlap: object, pause_after_failures: object) -> None:
    """Raise `ScheduleError` unless `overlap` and `pause_after_failures` are usable."""
    if overlap not in OVERLAPS:
        raise ScheduleError(f"overlap must be one of {OVERLAPS}, got {shown(overlap)}")
    if pause_after_failures is None:
        return
    if (
        isinstance(pause_after_failures, bool)
        or not isinstance(pause_after_failures, int)
        or not 1 <= pause_after_failures <= MAX_PAUSE_AFTER
    ):
        raise ScheduleError(
            f"pause_after_failures must be a whole number from 1 to {MAX_PAUSE_AFTER}, "
            f"got {shown(pause_after_failures)}"
        )


def policies_from_fields(fields: Mapping[str, str]) -> tuple[Overlap, int | None]:
    """Return a record's overlap policy and failure pause; `ScheduleError` if corrupt."""
    overlap = fields.get("overlap") or "allow"
    raw = fields.get("pause_after_failures") or None
    try:
        pause_after = None if raw is None else int(raw)
    except ValueError:
        raise ScheduleError(
            f"pause_after_failures must be a whole number, got {shown(raw)}"
        ) from None
    check_policies(overlap, pause_after)
    return overlap, pause_after  # type: ignore[return-value]  # checked just above


def _cadence_digest(cadence: Cadence, bounds: Bounds) -> str:
    """The digest of what places the slots: the cadence, and the start and end bounds."""
    try:
        return _cached_cadence_digest(cadence, bounds)  # type: ignore[arg-type]  # most are
    except TypeError:  # an unhashable cadence (a custom one): computed each time
        return _cadence_digest_of(cadence, bounds)


def _cadence_digest_of(cadence: Cadence, bounds: Bounds) -> str:
    return _digest({**cadence.to_fields(), **bounds.when_fields()})


# Many registrations share a cadence (a `beat_schedule` of 100,000 entries may hold a few
# dozen): a cadence and its bounds are frozen values, so their digest is computed once.
_cached_cadence_digest = functools.lru_cache(maxsize=4096)(_cadence_digest_of)
# The digest's canonical JSON, as `json.dumps(dict(sorted(fields.items())), separators=(",",
# ":"))` writes it (one encoder, built once: `json.dumps` with options builds one per call;
# the encoder sorts the keys itself).
_CANONICAL = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def _digest(fields: Mapping[str, str]) -> str:
    canonical = _CANONICAL.encode(fields)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


# The definition digest is `_digest(definition.to_fields())`. Its canonical JSON is the same
# text around the template's for every definition that differs only in its template (most
# of a sync's): per such group, the text before and after the template's JSON string, so a
# digest escapes the template and hashes, instead of encoding every field again.
_FRAMES: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
_MAX_FRAMES = 4096
# The cadences whose equality means equal record fields: frozen values whose `to_fields`
# depends on their fields alone, which are checked ints and strings (`At`, whose instants
# are mostly one registration's own, would only fill the cache).
_FRAMED_CADENCES = frozenset({Every, Cron})
_escape = json.encoder.encode_basestring_ascii  # what `_CANONICAL` writes a string with


def shape_key(definition: Definition) -> tuple[Any, ...] | None:
    """Return a key equal for definitions whose record fields differ in their template alone
    (and whose next runs are the same), or None when no such key is known: a cadence whose
    fields may depend on more than its equality, or labels."""
    if type(definition.cadence) not in _FRAMED_CADENCES or definition.labels:
        return None
    return (
        definition.cadence,
        definition.misfire,
        definition.overlap,
        definition.pause_after_failures,
        definition.bounds,
        definition.catchup_window_ms,
        definition.catchup_max,
    )


def _definition_digest(definition: Definition, template_json: str) -> str:
    """Return `_digest(definition.to_fields())`, from the cached frame of its group."""
    key = shape_key(definition)
    if key is None:
        return _digest(definition.to_fields())
    try:
        frame = _FRAMES.get(key)
    except TypeError:  # an unhashable part (a time zone given as an object)
        return _digest(definition.to_fields())
    if frame is None:
        frame = _frame(definition.to_fields())
        if frame is None:
            return _digest(definition.to_fields())
        if len(_FRAMES) < _MAX_FRAMES:
            _FRAMES[key] = frame
    head, tail = frame
    return hashlib.sha256(head + _escape(template_json).encode("ascii") + tail).hexdigest()[:32]


def _frame(fields: Mapping[str, str]) -> tuple[bytes, bytes] | None:
    """Return the canonical JSON of `fields` before and after the template's string; None
    unless every key and value is a string (what `_CANONICAL` writes as `_escape` does)."""
    if not all(type(k) is str and type(v) is str for k, v in fields.items()):
        return None
    items = [_escape(k) + ":" + _escape(fields[k]) for k in sorted(fields) if k != "template"]
    before = sum(1 for k in fields if k < "template")
    head = "{" + "".join(item + "," for item in items[:before]) + '"template":'
    tail = "".join("," + item for item in items[before:]) + "}"
    return head.encode("ascii"), tail.encode("ascii")


def define(
    *,
    every: float | timedelta | str | None = None,
    every_ms: int | None = None,
    cron: str | None = None,
    tz: str | None = None,
    anchor: Anchor = "grid",
    misfire: Misfire = "coalesce",
    template: Mapping[str, Any] | None = None,
    day_and: bool = False,
    overlap: Overlap = "allow",
    pause_after_failures: int | None = None,
    offset: Offset | None = None,
    at: Instant | Sequence[Instant] | None = None,
    start_at: Instant | None = None,
    end_at: Instant | None = None,
    limit: int | None = None,
    immediately: bool = False,
    catchup_window: float | timedelta | str | None = None,
    catchup_max: int | None = None,
    jitter: float | timedelta | str | None = None,
    exclude: Iterable[ExcludeItem] | ExcludeItem | None = None,
    calendars: Mapping[str, Calendar] | None = None,
    seed: str | None = None,
    labels: Labels | None = None,
) -> Definition:
    """Build a `Definition` from keyword arguments; exactly one of `every`/`every_ms`/`cron`/`at`.

    `offset` shifts an interval's grid (seconds, a `timedelta`, a string like `"5m"`, or a
    datetime the grid passes through); `at` is one instant or a list (aware datetimes or ISO
    8601 strings with an offset); `start_at`/`end_at` bound the slots (inclusive); `limit`
    caps the runs; `immediately` fires once at registration. See `emq_bridge.bounds`.
    `misfire`, `catchup_window` (seconds, a `timedelta` or `"10m"`) and `catchup_max` say
    what fires for slots that passed while no pump ran (`emq_bridge.cadence.catch_up`).
    `labels` (str -> str, emq_bridge.labels) tag the registration without changing when it runs.
    """
    given = [
        k
        for k, v in (("every", every), ("every_ms", every_ms), ("cron", cron), ("at", at))
        if v is not None
    ]
    if len(given) != 1:
        raise ScheduleError(
            "give exactly one cadence: every= (e.g. '15m'), every_ms=, cron= or at= "
            f"(got {', '.join(given) or 'none'})"
        )
    if offset is not None and every is None and every_ms is None:
        raise ScheduleError("offset applies to interval schedules (every=) only")
    # Refused as a schedule file refuses them (config.py). The defaults (`grid`, False) are
    # what a decorator or a `Schedule` passes through for any cadence: only another value
    # that does not apply is an error.
    if anchor != "grid" and every is None and every_ms is None:
        raise ScheduleError(
            "anchor does not apply to at= (one-off instants)"
            if at is not None
            else "anchor applies to interval schedules (every=) only; "
            "a cron is a wall-clock position"
        )
    if day_and is not False and cron is None:
        raise ScheduleError(
            "day_and does not apply to at= (one-off instants)"
            if at is not None
            else "day_and applies to cron schedules only; an interval has no days"
        )
    cadence: Cadence
    if cron is not None:
        cadence = Cron(cron, tz or "UTC", day_and, seed)
    elif at is not None:
        if tz is not None:
            raise ScheduleError("tz applies to cron schedules only; give at= as aware datetimes")
        cadence = At(instants_ms(at))
    else:
        if tz is not None:
            raise ScheduleError("tz applies to cron schedules only; an interval has no time zone")
        # A bare number is seconds for `every` (as in Celery), milliseconds for `every_ms`.
        if every is not None:
            every_in_ms = parse_every(every)
        else:
            assert every_ms is not None  # exactly one cadence was given
            every_in_ms = parse_every_ms(every_ms)
        cadence = Every(every_in_ms, anchor, offset_ms(offset, every_in_ms))
    # Calendars and jitter (calendars.py, jitter.py): `exclude` in the cron's zone (UTC for
    # an interval), jitter hashed from `seed`, the registration's name by default.
    rules, names = resolve_exclude(exclude, calendars)
    cadence = shape(
        cadence,
        tz=tz or "UTC",
        exclude=rules,
        calendars=names,
        jitter_ms=parse_jitter(jitter),
        seed=seed,
    )
    bounds = Bounds(
        None if start_at is None else epoch_ms(start_at, "start_at", ceil=True),
        None if end_at is None else epoch_ms(end_at, "end_at"),
        limit,
        immediately,
    )
    task = template.get("task") if isinstance(template, Mapping) else None
    if isinstance(task, str):  # as a file, the CLI and a beat_schedule check it
        try:
            check_task_name(task)
        except ScheduleError as exc:
            raise ScheduleError(f"template's task: {exc}") from None
    return Definition(
        cadence,
        template if template is not None else {},
        misfire,
        overlap,
        pause_after_failures,
        bounds,
        catchup_window_ms(catchup_window),
        catchup_max,
        labels if labels is not None else {},
    )


def definition_or_define(definition: Definition | None, **options: Any) -> Definition:
    """Return `definition`, or `define(**options)` when it is None: what `register` and
    `upsert` take. A definition given with any option other than `define`'s default is
    refused (`ScheduleError` naming them): the options would be silently ignored."""
    if definition is None:
        return define(**options)
    if not isinstance(definition, Definition):
        raise ScheduleError(
            f"definition must be a Definition (define(...)), got {type(definition).__name__}"
        )
    mixed = [
        name
        for name, value in options.items()
        if value is not _DEFINE_DEFAULTS[name] and value != _DEFINE_DEFAULTS[name]
    ]
    if mixed:
        raise ScheduleError(
            f"give either definition= or its arguments, not both (got definition= and "
            f"{', '.join(f'{name}=' for name in mixed)}); put them in define(...)"
        )
    return definition


# `define`'s defaults: an option holding one was not given.
_DEFINE_DEFAULTS: dict[str, Any] = {
    name: parameter.default for name, parameter in inspect.signature(define).parameters.items()
}


def offset_ms(offset: Offset | None, every_ms: int) -> int:
    """Return an interval's grid offset in ms: a duration (as `every` takes it), or a datetime
    the grid passes through (its epoch ms modulo the interval)."""
    if offset is None:
        return 0
    # An ISO 8601 instant as text too: what a JSON file or the command line can hold of the
    # datetime a TOML file or Python gives (a span never starts with a date).
    if isinstance(offset, datetime) or (
        isinstance(offset, str) and _DATE_FIRST.match(offset.strip())
    ):
        return epoch_ms(offset, "offset") % every_ms
    return parse_span(offset, "offset")


_DATE_FIRST = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]")


@dataclass(frozen=True, slots=True)
class Declaration:
    """A schedule some source wants in the registry: a definition at (queue, name)."""

    queue: str
    name: str
    definition: Definition

    def __post_init__(self) -> None:
        validate_name(self.queue, "queue")
        validate_name(self.name, "registration name")
        # A cron's H and jitter hash the registration's name unless given a seed.
        object.__setattr__(self, "definition", self.definition.for_name(self.name))


@contextmanager
def naming_schedule(name: object) -> Iterator[None]:
    """Say which schedule a `ScheduleError` raised inside is about, when it has a `name`
    (`schedule 'name': ...`): a decorator (`@recurring`) checks its values before the task
    or actor it decorates is known. A name that is not valid is refused as it is."""
    if name is not None:
        validate_name(name, "schedule name")
    try:
        yield
    except ScheduleError as exc:
        if name is None:
            raise
        raise type(exc)(f"schedule {name!r}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring schedule declared on a task, before it is bound to the task.

    Exactly one of `every` (seconds, a `timedelta` or a string like `"15m"`), `cron` (5 fields,
    evaluated in `tz`, default UTC or the adapter's default zone) or `at` (one-off instants).
    `offset`, `start_at`, `end_at`, `limit` and `immediately` are as for `define`.
    `args`/`kwargs` are passed to the task, `options` are the framework's sending options.
    `name` defaults to the task name; a task with several schedules needs a distinct `name`
    for each. `overlap` and `pause_after_failures` are the registration's policies
    (`Definition`). The cadence, the arguments (JSON) and the name are checked at construction.
    """

    every: float | timedelta | str | None = None
    cron: str | None = None
    tz: str | None = None
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] | None = None
    options: Mapping[str, Any] | None = None
    name: str | None = None
    anchor: Anchor = "grid"
    misfire: Misfire = "coalesce"
    overlap: Overlap = "allow"
    pause_after_failures: int | None = None
    # When (bounds.py): the grid's offset, one-off instants, start/end, a run limit.
    offset: Offset | None = None
    at: Instant | Sequence[Instant] | None = None
    start_at: Instant | None = None
    end_at: Instant | None = None
    limit: int | None = None
    immediately: bool = False
    # Missed slots (cadence.catch_up): the window, and `all`'s bound per catch-up.
    catchup_window: float | timedelta | str | None = None
    catchup_max: int | None = None
    # Jitter and calendars (jitter.py, calendars.py), as for `define`.
    jitter: float | timedelta | str | None = None
    exclude: Sequence[ExcludeItem] | None = None
    # Tags of the registration (labels.py), as for `define`.
    labels: Labels | None = None

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
            offset=self.offset,
            at=self.at,
            start_at=self.start_at,
            end_at=self.end_at,
            limit=self.limit,
            immediately=self.immediately,
            catchup_window=self.catchup_window,
            catchup_max=self.catchup_max,
            jitter=self.jitter,
            exclude=self.exclude,
            labels=self.labels,
        )
        return Declaration(queue, self.name or task, definition)
