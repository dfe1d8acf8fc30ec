"""Read celery-redbeat's entries into an `ImportPlan`.

Celery side. celery-redbeat keeps each entry in a hash `<prefix><name>` (default prefix
`redbeat:`) with two JSON fields, `definition` (name, task, args, kwargs, options, schedule,
enabled) and `meta` (last_run_at, total_run_count), and indexes them in the sorted set
`<prefix>:schedule`. Both are decoded with celery-redbeat's own decoder (its encodings of
intervals, crontabs and rrules), so celery-redbeat must be installed where this runs.
A redbeat crontab has no zone of its own: it follows the app's `timezone` (`--timezone`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from celery import Celery
from redis.exceptions import ResponseError

from ...definition import Declaration, Definition
from ...errors import ConfigError, EmqError, ScheduleError
from ...keys import validate_name
from ...migrate.plan import Imported, ImportPlan, Refusal
from ...registry import Seed
from ...replies import text
from ...template import TaskTemplate, check_task_name
from ...utf8 import check_utf8
from ..entries import json_options, registry_name, resolve_queue
from .schedules import Unrepresentable, carry, epoch_ms

__all__ = ["DEFAULT_KEY_PREFIX", "DEFAULT_SOURCE", "importer_app", "read_redbeat"]

DEFAULT_KEY_PREFIX = "redbeat:"
DEFAULT_SOURCE = "import:redbeat"
_SCAN_COUNT = 1000


def importer_app(timezone: str = "UTC", queue: str = "celery") -> Celery:
    """Return the bare Celery app an import converts with: its zone is the crontabs' zone,
    its default queue the queue of entries whose options name none (`InvalidName` unless
    it is a valid queue name: else every entry naming none is refused, the rest written)."""
    validate_name(queue, "queue")
    app = Celery("emq-import", set_as_current=False)
    app.conf.update(timezone=timezone, enable_utc=True, task_default_queue=queue)
    return app


def _decoder() -> Any:
    try:
        from redbeat.decoder import RedBeatJSONDecoder  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ConfigError(
            "importing from celery-redbeat needs it installed: pip install celery-redbeat"
        ) from exc
    return RedBeatJSONDecoder


def _keys(client: Any, key_prefix: str) -> Iterator[str]:
    """Yield the entry keys: the members of `<prefix>:schedule`, then any entry hash the
    index lost (redbeat drops an entry from it when it fails to load)."""
    index = key_prefix + ":schedule"
    seen: set[str] = set()
    for member in client.zrange(index, 0, -1):
        seen.add(key := text(member))
        yield key
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in key_prefix) + "*"
    for raw in client.scan_iter(match=pattern, count=_SCAN_COUNT, _type="hash"):
        key = text(raw)
        if key not in seen and not key.startswith(key_prefix + ":"):
            seen.add(key)
            yield key


def read_redbeat(
    client: Any,
    *,
    app: Celery,
    now_ms: int,
    key_prefix: str = DEFAULT_KEY_PREFIX,
    source: str = DEFAULT_SOURCE,
) -> ImportPlan:
    """Read every celery-redbeat entry under `key_prefix` on `client` into a plan.

    Nothing is written. `now_ms` is the instant the next slots are computed from (the
    registry server's clock). An entry that cannot be read or carried is refused, with why.
    A `key_prefix` that is not valid UTF-8 raises `ScheduleError` before anything is read.
    """
    check_utf8(key_prefix, "celery-redbeat key prefix")  # else redis-py fails to encode it
    decoder = _decoder()
    # redbeat stores an entry's `last_run_at` before it sends the task (its scheduler's
    # `reserve`): a slot after it was never sent, and the cut-over may fire it.
    plan = ImportPlan(source, records_before_send=True)
    for key in _keys(client, key_prefix):
        origin = f"redbeat {key}"
        try:
            raw_definition, raw_meta = client.hmget(key, "definition", "meta")
        except ResponseError as exc:  # a key of another type in redbeat's index (WRONGTYPE)
            reason = "not a hash" if str(exc).startswith("WRONGTYPE") else f"unreadable ({exc})"
            plan.refused.append(Refusal(origin, f"{reason}: not a redbeat entry"))
            continue
        if raw_definition is None:
            plan.refused.append(Refusal(origin, "no 'definition' field: not a redbeat entry"))
            continue
        try:
            definition = json.loads(text(raw_definition), cls=decoder)
            meta = json.loads(text(raw_meta), cls=decoder) if raw_meta else {}
        except RecursionError:
            plan.refused.append(Refusal(origin, "celery-redbeat cannot decode it: nested too deep"))
            continue
        except (ValueError, TypeError, KeyError, AssertionError, OverflowError) as exc:
            # OverflowError: a number no timedelta or datetime holds (`"every": 1e300`).
            plan.refused.append(Refusal(origin, f"celery-redbeat cannot decode it: {exc!r}"))
            continue
        if not isinstance(definition, dict) or not isinstance(meta, dict):
            field = "definition" if not isinstance(definition, dict) else "meta"
            plan.refused.append(
                Refusal(origin, f"its {field!r} is not a JSON object, as celery-redbeat writes")
            )
            continue
        try:
            plan.entries.append(_entry(app, key, key_prefix, definition, meta, now_ms, source))
        except (Unrepresentable, EmqError) as exc:
            plan.refused.append(Refusal(origin, str(exc)))
    return plan


def _entry(
    app: Celery,
    key: str,
    key_prefix: str,
    definition: dict[str, Any],
    meta: dict[str, Any],
    now_ms: int,
    source: str,
) -> Imported:
    name = str(definition.get("name") or key[len(key_prefix) :])
    label = f"redbeat entry {name!r}"
    task = definition.get("task")
    if not isinstance(task, str) or not task:
        raise Unrepresentable("it names no task")
    try:
        check_task_name(task)
    except ScheduleError as exc:
        raise Unrepresentable(f"its task: {exc}") from None
    args = definition.get("args") or []
    kwargs = definition.get("kwargs") or {}
    options = definition.get("options") or {}
    for field, value, kind in (
        ("args", args, list),
        ("kwargs", kwargs, dict),
        ("options", options, dict),
    ):
        if not isinstance(value, kind):
            raise Unrepresentable(
                f"its {field} is not a JSON {'array' if kind is list else 'object'}"
            )
    options = json_options(options, label)
    last_run = meta.get("last_run_at")
    last_run_ms = epoch_ms(last_run) if isinstance(last_run, datetime) else None
    carried = carry(definition.get("schedule"), app, label, last_run_ms=last_run_ms, now_ms=now_ms)
    template = TaskTemplate(task, args, kwargs, options).to_dict()
    declaration = Declaration(
        resolve_queue(app, task, options, args, kwargs),
        registry_name(name, "its name"),
        Definition(carried.cadence, template, bounds=carried.bounds()),
    )
    fired = meta.get("total_run_count")
    seed = Seed(
        carried.first_run_ms,
        paused=definition.get("enabled", True) is False,
        fired=fired if isinstance(fired, int) and fired > 0 else 0,
        last_fired_ms=last_run_ms,
        rhythm_ms=carried.rhythm_ms,
    )
    return Imported(f"redbeat {key}", declaration, seed)
