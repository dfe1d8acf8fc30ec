"""The schedules of `python -m bench.realistic`: distinct arguments per registration.

Real `beat_schedule`s and per-tenant schedules differ in their args/kwargs, so every
registration `i` here carries its own: `args=[i, 2]`, `kwargs={"report": "daily",
"tenant": "t<i>", "limit": 100}` (about 100 bytes of JSON with the task name). The
identical-template workload of `python -m bench` (every registration `args=[1, 2]` and the
same kwargs) is kept as a secondary, labelled row: `identical=True`.

The same schedules are declared the three ways users declare them: a Celery
`beat_schedule`, `@recurring` decorators, and a TOML schedule file; and as prebuilt
`Declaration`s for `emq_bridge.sync.sync`.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from emq_bridge.definition import Declaration, define

from .brokers import celery_app, db_url
from .common import DB_REGISTRY, EVERY_S, QUEUE, TASK, name_of
from .systems import REDBEAT_PREFIX

SOURCE = "bench-realistic"


def args_of(i: int, identical: bool = False) -> list[Any]:
    return [1, 2] if identical else [i, 2]


def kwargs_of(i: int, identical: bool = False) -> dict[str, Any]:
    return {"report": "daily", "tenant": "t0000000" if identical else f"t{i:07d}", "limit": 100}


def template_of(i: int, identical: bool = False, queue: str | None = None) -> dict[str, Any]:
    """The task template of registration `i` (what a Dramatiq or file schedule stores)."""
    template: dict[str, Any] = {
        "task": TASK,
        "args": args_of(i, identical),
        "kwargs": kwargs_of(i, identical),
    }
    if queue is not None:
        template["options"] = {"queue": queue}
    return template


def template_bytes(i: int) -> int:
    """Compact JSON size of registration i's template (the memory figure's "100 bytes")."""
    return len(json.dumps(template_of(i), separators=(",", ":")))


def declarations(
    n: int,
    identical: bool = False,
    every_ms: int = EVERY_S * 1000,
    queue: str = QUEUE,
    spread: bool = False,
    anchor: str = "grid",
) -> list[Declaration]:
    """N prebuilt declarations, one definition each (distinct templates are distinct
    definitions). `spread`: phase i at `i * every_ms / n` (the grid's offset), so N
    registrations of one interval fire evenly over it."""
    out = []
    for i in range(n):
        offset = timedelta(milliseconds=i * every_ms // n) if spread else None
        definition = define(
            every_ms=every_ms,
            template=template_of(i, identical),
            offset=offset,
            anchor=anchor,  # type: ignore[arg-type]
        )
        out.append(Declaration(queue, name_of(i), definition))
    return out


def beat_schedule(n: int, identical: bool = False) -> dict[str, dict[str, Any]]:
    """Celery's `beat_schedule` of n hourly entries, as a user writes one."""
    return {
        name_of(i): {
            "task": TASK,
            "schedule": timedelta(seconds=EVERY_S),
            "args": args_of(i, identical),
            "kwargs": kwargs_of(i, identical),
        }
        for i in range(n)
    }


def emq_app(
    url: str,
    n: int,
    identical: bool = False,
    pipelined: bool = False,
    report: bool = True,
    schedule: bool = True,
) -> Any:
    """A Celery app for `celery beat -S emq`: the registry in DB_REGISTRY, the broker beside."""
    return celery_app(
        url,
        beat_schedule=beat_schedule(n, identical) if schedule else {},
        beat_scheduler="emq_bridge.celery:RepeatScheduler",
        emq_bridge_redis_url=db_url(url, DB_REGISTRY),
        emq_bridge_source=SOURCE,
        emq_bridge_pipelined=pipelined,
        emq_bridge_report=report,
    )


def redbeat_app(url: str, n: int, identical: bool = False) -> Any:
    """A Celery app for celery-redbeat with the same `beat_schedule`."""
    return celery_app(
        url,
        redbeat_redis_url=db_url(url, DB_REGISTRY),
        redbeat_key_prefix=REDBEAT_PREFIX,
        beat_schedule=beat_schedule(n, identical),
    )


def decorate(app: Any, n: int) -> None:
    """Declare n schedules with `@recurring` on the bench task (one per name), as a module of
    decorated tasks does. `@recurring` keeps its declarations in a process-wide list: call
    this in a child process (the boot scenario does)."""
    from emq_bridge.celery import recurring

    task = app.tasks[TASK]
    for i in range(n):
        recurring(every=EVERY_S, args=args_of(i), kwargs=kwargs_of(i), name=name_of(i))(task)


def write_toml(path: Path, n: int, source: str = "bench-file") -> None:
    """A TOML schedule file (emq_bridge.config) of n hourly entries."""
    lines = [f'source = "{source}"', f'queue = "{QUEUE}"', ""]
    for i in range(n):
        kwargs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in kwargs_of(i).items())
        lines += [
            "[[schedule]]",
            f'name = "{name_of(i)}"',
            f'task = "{TASK}"',
            f"every = {EVERY_S}",
            f"args = {json.dumps(args_of(i))}",
            f"kwargs = {{ {kwargs} }}",
            "",
        ]
    path.write_text("\n".join(lines))


def write_json(path: Path, n: int, source: str = "bench-file") -> None:
    """The same schedule file as `write_toml`'s, as the JSON document `emq-bridge sync`
    also reads (a `.json` file: what `emq-bridge export --format json` writes)."""
    entries = [
        {
            "name": name_of(i),
            "task": TASK,
            "every": EVERY_S,
            "args": args_of(i),
            "kwargs": kwargs_of(i),
        }
        for i in range(n)
    ]
    path.write_text(json.dumps({"source": source, "queue": QUEUE, "schedule": entries}))
