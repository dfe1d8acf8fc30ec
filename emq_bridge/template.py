"""The task template: what an occurrence sends, as JSON, and the rules it obeys.

A template is a JSON object. The adapters, the schedule file and the CLI all write it as
`{"task": ..., "args": [...], "kwargs": {...}, "options": {...}}`: `TaskTemplate` is that
value, with one builder (`TaskTemplate.to_dict`) and one reader (`TaskTemplate.read`).
It is stored as compact JSON whose objects in `args`, `kwargs` and `options` keep their keys
in the order given (`encode_template`): what the task receives is what the user declared,
dict order included.

Every walk over a template here is iterative, so no nesting depth can exhaust the stack;
the depth is bounded anyway (`MAX_TEMPLATE_DEPTH`), where a template is accepted.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .direct_json import direct_encoder
from .errors import ScheduleError
from .shown import clipped, shown
from .utf8 import check_utf8

__all__ = [
    "MAX_TEMPLATE_BYTES",
    "MAX_TEMPLATE_DEPTH",
    "FrozenDict",
    "FrozenList",
    "TaskTemplate",
    "check_structure",
    "check_task_name",
    "decode_frozen",
    "decode_template",
    "encode_template",
    "freeze",
    "is_control",
    "thaw",
]

# Templates are JSON objects of at most 64 KiB: a recurring task's arguments are small, and
# the registry is loaded by every pump tick that claims the registration.
MAX_TEMPLATE_BYTES = 64 * 1024
# Objects and arrays nested at most this deep, the template itself counting as 1: deep
# enough for any task's arguments, far from what a JSON codec or a stack could choke on.
MAX_TEMPLATE_DEPTH = 32
# The one encoding of a template: compact JSON, every object's keys in the order they were
# given (built once: `json.dumps` with options builds an encoder per call, a cost a sync of
# many schedules pays per schedule). Never sorted: the task gets its `args` and `kwargs`
# with the dicts in them in the order the user wrote them, as Celery's own beat sends them
# (Python dicts keep insertion order, pickle and JSON carry it), and `options` likewise.
_COMPACT = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
# `_COMPACT.encode` with the C encoder called directly (its Python frames cost more than the
# encoding of a 100-byte template), the cycle check kept.
_compact = direct_encoder(_COMPACT)


def encode_template(template: object) -> str:
    """Return `template` as compact JSON; raise `ScheduleError` if it breaks a rule.

    Every object in `args`, `kwargs` and `options` (at any depth) keeps its keys in the
    order given: that is what the task receives. The template's own keys (`task`, `args`,
    `kwargs`, `options`: what no task receives as a dict) are written in the order of their
    names, so a template and the schedule file it is exported to read back as one text, and
    a template stored by an earlier release (which sorted the keys at every depth) whose
    objects were declared in sorted order is stored as before. The text is what the
    definition digest covers: a reorder of a sent object's keys is another definition (an
    upsert rewrites the template), and one declaration gives one text in every process.

    The rules: a JSON object with string keys, no NaN or Infinity, valid UTF-8, at most
    `MAX_TEMPLATE_BYTES` once encoded and `MAX_TEMPLATE_DEPTH` levels deep.
    """
    if type(template) is not dict and not isinstance(template, Mapping):
        raise ScheduleError(
            f"template must be a JSON object (a dict), got {type(template).__name__}"
        )
    # Another Mapping is refused by the encoder, as before. Most templates are built by
    # `TaskTemplate.to_dict` (or as it builds them): in order already, told in one compare.
    if isinstance(template, dict) and list(template) != _ENVELOPE:
        template = _in_name_order(template)
    try:
        text = _compact(template)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"template is not JSON-serialisable: {exc}") from exc
    except RecursionError as exc:
        raise ScheduleError(
            f"template is nested more than {MAX_TEMPLATE_DEPTH} levels deep"
        ) from exc
    try:
        encoded: bytes | None = text.encode("utf-8")
    except UnicodeEncodeError:
        encoded = None  # refused below, once the size and the structure are checked
    size = len(encoded if encoded is not None else text.encode("utf-8", "surrogatepass"))
    if size > MAX_TEMPLATE_BYTES:
        raise ScheduleError(f"template is {size} bytes of JSON; the limit is {MAX_TEMPLATE_BYTES}")
    # After the encoding (which refuses cycles) and the size check (which bounds this walk).
    if not _shallow(template):
        check_structure(template)
    if encoded is None:
        raise ScheduleError("template holds a string that is not valid UTF-8")
    return text


# The template's own keys as `TaskTemplate.to_dict` writes them: in the order of their names.
_ENVELOPE = ["args", "kwargs", "options", "task"]


def _in_name_order(template: dict[Any, Any]) -> dict[Any, Any]:
    """Return `template` with its own keys in the order of their names (its values as they
    are): itself when they are; `ScheduleError` for keys that cannot be ordered (not all
    strings)."""
    keys = list(template)
    try:
        order = sorted(keys)
    except TypeError as exc:  # keys of several types: not all strings
        check_structure(template)  # raises, naming the key
        raise ScheduleError(f"template is not JSON-serialisable: {exc}") from exc
    if keys == order:
        return template
    return {key: template[key] for key in order}


def check_structure(template: Mapping[Any, Any]) -> None:
    """Raise `ScheduleError` for a non-string key or a container nested too deeply.

    `json.dumps` would turn `{1: ...}` into `{"1": ...}`: the task would get other kwargs
    than the ones registered.
    """
    # Depth first, visiting containers only: a scalar can break neither rule, and most of a
    # template's values are scalars.
    stack: list[tuple[Any, int]] = [(template, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_TEMPLATE_DEPTH:
            raise ScheduleError(f"template is nested more than {MAX_TEMPLATE_DEPTH} levels deep")
        # `type(...) is` first: the abstract Mapping check costs more than the rest.
        if type(item) is dict or isinstance(item, Mapping):
            for key in item:
                if type(key) is not str and not isinstance(key, str):
                    raise ScheduleError(f"template keys must be strings, got {key!r}")
            children: Any = item.values()
        else:
            children = item
        for child in children:
            kind = type(child)
            if kind not in _SCALARS and (
                kind in _CONTAINERS or isinstance(child, Mapping | list | tuple)
            ):
                stack.append((child, depth + 1))


_SCALARS = frozenset({str, int, float, bool, type(None)})
_CONTAINERS = frozenset({dict, list, tuple})
_STR = frozenset({str})


def _shallow(template: object) -> bool:
    """True for a dict with string keys whose values are scalars, or lists (tuples) of
    scalars, or dicts of scalars with string keys: what most templates are (`{"task": ...,
    "args": [...], "kwargs": {...}, "options": {...}}`), and what `check_structure`
    passes. The type checks run in C (`issuperset` over `map`); False sends any other
    template to `check_structure`."""
    if type(template) is not dict or not _STR.issuperset(map(type, template)):
        return False
    for value in template.values():
        kind = type(value)
        if kind in _SCALARS:
            continue
        if kind is dict:
            if not (
                _STR.issuperset(map(type, value)) and _SCALARS.issuperset(map(type, value.values()))
            ):
                return False
        elif kind is list or kind is tuple:
            if not _SCALARS.issuperset(map(type, value)):
                return False
        else:
            return False
    return True


def _is_sequence(value: object) -> bool:
    return type(value) is tuple or isinstance(value, Sequence)


def _finite(value: Any) -> Any:
    # json.loads calls this with the name of the constant: "NaN", "Infinity", "-Infinity".
    raise ValueError(f"{value} is not JSON")


def _check_stored_utf8(raw: str) -> None:
    """Raise `ScheduleError` if the stored template `raw` held bytes that are not UTF-8
    (edited by hand): its record fields keep them as lone surrogates
    (`replies.record_text`), so the record is corrupt, not sent with U+FFFD in their place."""
    if not raw.isascii():
        try:
            raw.encode("utf-8")
        except UnicodeEncodeError:
            raise ScheduleError("record template holds bytes that are not valid UTF-8") from None


def decode_template(raw: str | None) -> dict[str, Any]:
    """Decode a record's template: a JSON object; raise `ScheduleError` on anything else."""
    if raw is None:
        raise ScheduleError("record has no template")
    _check_stored_utf8(raw)
    try:
        template = json.loads(raw, parse_constant=_finite)
    except (ValueError, RecursionError) as exc:
        raise ScheduleError(f"record template is not JSON: {exc}") from exc
    if not isinstance(template, dict):
        raise ScheduleError(f"record template is a JSON {type(template).__name__}, not an object")
    return template


def decode_frozen(raw: str | None) -> FrozenDict:
    """Decode a record's template straight into read-only containers; raise `ScheduleError`
    on anything but a JSON object nested at most `MAX_TEMPLATE_DEPTH` deep.

    What the pump runs for every registration it fires. A template with no more brackets
    than `MAX_TEMPLATE_DEPTH` cannot be nested deeper: its objects are frozen as the C
    decoder builds them (`_FROZEN_DECODER`), then its arrays. Any other is decoded, then
    frozen in one pass that checks the depth (its keys are strings by construction),
    recursing at most `MAX_TEMPLATE_DEPTH` levels; a deeper record is refused at that level.
    """
    if (
        raw is not None
        and raw.count("{") + raw.count("[") <= MAX_TEMPLATE_DEPTH
        and not raw.startswith("\ufeff")  # json.loads refuses a BOM with its own message
    ):
        _check_stored_utf8(raw)
        try:
            template = _FROZEN_DECODER.decode(raw)
        except (ValueError, RecursionError) as exc:
            raise ScheduleError(f"record template is not JSON: {exc}") from exc
        if type(template) is not FrozenDict:  # every object the decoder builds is one
            kind = type(template).__name__
            raise ScheduleError(f"record template is a JSON {kind}, not an object")
        return _frozen_arrays(template)
    frozen: FrozenDict = _frozen_json(decode_template(raw), 1)
    return frozen


def _frozen_arrays(value: FrozenDict) -> FrozenDict:
    """Freeze the arrays in `value`, whose objects the decoder made `FrozenDict`s."""
    for key, item in value.items():
        kind = type(item)
        if kind is list:
            dict.__setitem__(value, key, _frozen_array(item))  # its own, not yet shared
        elif kind is FrozenDict:
            _frozen_arrays(item)
    return value


def _frozen_array(items: list[Any]) -> FrozenList:
    return FrozenList(
        [
            item
            if type(item) in _SCALARS
            else _frozen_array(item)
            if type(item) is list
            else _frozen_arrays(item)
            for item in items
        ]
    )


def _frozen_json(value: Any, depth: int) -> Any:
    if depth > MAX_TEMPLATE_DEPTH:
        raise ScheduleError(f"template is nested more than {MAX_TEMPLATE_DEPTH} levels deep")
    if type(value) is dict:
        return FrozenDict(
            {
                key: item if type(item) in _SCALARS else _frozen_json(item, depth + 1)
                for key, item in value.items()
            }
        )
    return FrozenList(
        [item if type(item) in _SCALARS else _frozen_json(item, depth + 1) for item in value]
    )


class FrozenDict(dict[str, Any]):
    """A template object that refuses changes: the pump shares one between occurrences.

    It is a `dict` for everything that reads (`json.dumps`, `isinstance`, `dict(t)`).
    `copy.deepcopy(t)` gives a plain copy changeable all the way down; `dict(t)` and
    `t.copy()` are shallow: their top level changes, but the objects and arrays inside
    (`kwargs`, `args`) are the shared read-only ones.
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


# Decodes a template's objects straight into `FrozenDict`s (`decode_frozen`).
_FROZEN_DECODER = json.JSONDecoder(object_pairs_hook=FrozenDict, parse_constant=_finite)

READ_ONLY = (
    "an occurrence's template is shared by the occurrences of its registration and is "
    "read-only; change a copy: copy.deepcopy(template) (dict(template) copies the top "
    "level only, its nested objects and arrays stay read-only)"
)


@dataclass(slots=True)
class _Frame:
    """A container being frozen: its items so far, what is left, the key awaiting a child."""

    source: dict[str, Any] | list[Any]
    items: list[Any] = field(default_factory=list)
    rest: Iterator[Any] = field(init=False)
    key: str | None = None

    def __post_init__(self) -> None:
        self.rest = iter(self.source.items() if isinstance(self.source, dict) else self.source)

    def add(self, value: Any) -> None:
        self.items.append((self.key, value) if isinstance(self.source, dict) else value)

    def frozen(self) -> FrozenDict | FrozenList:
        if isinstance(self.source, dict):
            return FrozenDict(self.items)
        return FrozenList(self.items)


def thaw(value: Any) -> Any:
    """Return template data (read-only, `freeze`'s) as plain dicts and lists at every depth,
    for code that may change what it is given (a task's own `apply_async`): as
    `copy.deepcopy` does, without its memo. Recursive: an accepted template is at most
    `MAX_TEMPLATE_DEPTH` deep."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list):
        return [thaw(item) for item in value]
    return value


def freeze(value: Any) -> Any:
    """Return JSON data with every object and array made read-only (`FrozenDict`/`FrozenList`).

    Iterative: a hand-edited record nested arbitrarily deep cannot exhaust the stack.
    """
    if not isinstance(value, dict | list):
        return value
    stack = [_Frame(value)]
    while True:
        frame = stack[-1]
        for item in frame.rest:
            key, child = item if isinstance(frame.source, dict) else (None, item)
            if isinstance(child, dict | list):
                frame.key = key
                stack.append(_Frame(child))
                break
            frame.key = key
            frame.add(child)
        else:
            done = stack.pop().frozen()
            if not stack:
                return done
            stack[-1].add(done)


# Longer than any dotted path a framework names a task by; a name past it is garbage (it
# would otherwise be refused as an oversized template, naming args, kwargs and options).
MAX_TASK_CHARS = 1_000


def check_task_name(task: object) -> str:
    """Return `task`, a task or actor name as a schedule declares it; `ScheduleError` unless
    it is a non-empty string of valid UTF-8 with no control character or line break (no
    framework names a task so, and such a name could not be written back to a file), of at
    most `MAX_TASK_CHARS` characters."""
    if not isinstance(task, str) or not task.strip():
        raise ScheduleError(f"must be a non-empty string, got {shown(task)}")
    if len(task) > MAX_TASK_CHARS:
        raise ScheduleError(
            f"task name is {len(task):,} characters; the limit is {MAX_TASK_CHARS:,}"
        )
    if not task.isascii():
        check_utf8(task, "task")
    if not task.isprintable() and any(map(is_control, task)):  # isprintable: the fast path
        raise ScheduleError(f"task {clipped(task)} must not contain control characters")
    return task


def is_control(char: str) -> bool:
    """A control or format character, or a line break: what names refuse, less spaces."""
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp")


@dataclass(frozen=True, slots=True)
class TaskTemplate:
    """The template every adapter sends: a task (Celery task or Dramatiq actor) and its call.

    `options` are the framework's sending options (Celery `apply_async` options, Dramatiq
    message options). Build the stored JSON object with `to_dict`, read one with `read`.
    """

    task: str
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not self.task.strip():
            raise ScheduleError(
                f"template 'task' must be a non-empty string (the task or actor name), "
                f"got {self.task!r}"
            )
        args = self.args
        if type(args) is not list and (isinstance(args, str | bytes) or not _is_sequence(args)):
            raise ScheduleError(f"args must be a list or tuple, got {type(args).__name__}")
        for what, value in (("kwargs", self.kwargs), ("options", self.options)):
            if type(value) is not dict and not isinstance(value, Mapping):
                raise ScheduleError(f"{what} must be a dict, got {type(value).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON object stored as a registration's `template`.

        Its own keys come in the order of their names, the order `encode_template` stores
        them in (so it writes this dict without building another). The objects in `args`,
        `kwargs` and `options` keep the order they were given in.
        """
        return {
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
            "options": dict(self.options),
            "task": self.task,
        }

    @classmethod
    def read(cls, template: Mapping[str, Any]) -> TaskTemplate:
        """Return the task template a stored template holds; `ScheduleError` if it has none.

        Missing `args`, `kwargs` or `options` are empty. Nothing is copied: a read-only
        template gives read-only parts.
        """
        return cls(
            template.get("task"),  # type: ignore[arg-type]  # checked by __post_init__
            template.get("args") or (),
            template.get("kwargs") or {},
            template.get("options") or {},
        )
