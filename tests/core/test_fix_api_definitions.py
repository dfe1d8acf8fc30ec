"""`register`/`upsert` and `define` refuse arguments they would silently ignore.

`definition=` with `every=`, `template=`, `labels=`... used the definition and dropped the
rest; `define(cron=..., anchor="release")`, `define(every=..., day_and=True)` and
`define(at=..., anchor=...)` dropped the option a schedule file refuses. Each is now a
`ScheduleError` that names the arguments, and nothing is written.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from registry_state import snapshot

from emq_bridge import ConfigError, Repeat, Schedule, ScheduleError, define
from emq_bridge.config import load_schedule_file

HOURLY = define(every="1h", template={"task": "t"})
AT = datetime(2030, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("move", ["register", "upsert"])
@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"every": "15m"}, "every="),
        ({"cron": "0 * * * *"}, "cron="),
        ({"template": {"task": "other"}}, "template="),
        ({"labels": {"team": "data"}}, "labels="),
        ({"misfire": "skip"}, "misfire="),
        ({"overlap": "skip"}, "overlap="),
        ({"anchor": "release"}, "anchor="),
        ({"immediately": True}, "immediately="),
        ({"limit": 3}, "limit="),
        ({"every": "15m", "template": {"task": "other"}}, "every=, template="),
    ],
)
def test_a_definition_with_definition_arguments_is_refused_and_nothing_is_written(
    repeat: Repeat, move: str, extra: dict[str, Any], named: str
) -> None:
    before = snapshot(repeat)
    with pytest.raises(ScheduleError) as raised:
        getattr(repeat, move)("q", "job", definition=HOURLY, **extra)
    message = str(raised.value)
    assert "give either definition= or its arguments, not both" in message
    assert f"(got definition= and {named})" in message
    assert snapshot(repeat) == before
    assert repeat.get("q", "job") is None


@pytest.mark.parametrize("move", ["register", "upsert"])
def test_a_definition_alone_or_with_only_the_defaults_is_written(repeat: Repeat, move: str) -> None:
    getattr(repeat, move)("q", "job", definition=HOURLY, anchor="grid", misfire="coalesce")
    registration = repeat.get("q", "job")
    assert registration is not None and registration.definition.digest == HOURLY.digest


def test_a_definition_that_is_not_one_is_refused(repeat: Repeat) -> None:
    with pytest.raises(ScheduleError, match="definition must be a Definition"):
        repeat.upsert("q", "job", definition={"every": "1h"})  # type: ignore[arg-type]
    assert snapshot(repeat) == {}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"cron": "0 * * * *", "anchor": "release"},
            "anchor applies to interval schedules (every=) only; a cron is a wall-clock position",
        ),
        (
            {"cron": "0 * * * *", "anchor": "schedule"},
            "anchor applies to interval schedules (every=) only",
        ),
        (
            {"every": "1h", "day_and": True},
            "day_and applies to cron schedules only; an interval has no days",
        ),
        (
            {"every_ms": 60_000, "day_and": True},
            "day_and applies to cron schedules only; an interval has no days",
        ),
        ({"at": [AT], "anchor": "release"}, "anchor does not apply to at= (one-off instants)"),
        ({"at": AT, "day_and": True}, "day_and does not apply to at= (one-off instants)"),
    ],
)
def test_define_refuses_an_option_that_does_not_apply_to_its_cadence(
    repeat: Repeat, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ScheduleError) as raised:
        define(**arguments)
    assert message in str(raised.value)
    if "day_and" not in arguments:  # upsert takes no day_and (a cron's is in define)
        with pytest.raises(ScheduleError):  # the same through the registry: nothing written
            repeat.upsert("q", "job", template={"task": "t"}, **arguments)
    assert snapshot(repeat) == {}


@pytest.mark.parametrize(
    ("entry", "arguments", "field"),
    [
        (
            'cron = "0 * * * *"\nanchor = "release"',
            {"cron": "0 * * * *", "anchor": "release"},
            "anchor",
        ),
        ('every = "1h"\nday_and = true', {"every": "1h", "day_and": True}, "day_and"),
    ],
)
def test_define_and_a_schedule_file_refuse_the_same_option_alike(
    tmp_path: Path, entry: str, arguments: dict[str, Any], field: str
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(f'queue = "q"\n\n[[schedule]]\nname = "n"\ntask = "t"\n{entry}\n')
    with pytest.raises(ConfigError) as from_file:
        load_schedule_file(path)
    with pytest.raises(ScheduleError) as from_api:
        define(**arguments)
    # The file: "field 'anchor': applies to interval schedules only; a cron is ...";
    # the API: "anchor applies to interval schedules (every=) only; a cron is ...".
    filed = str(from_file.value).split(f"field '{field}': ", 1)[1]
    said = str(from_api.value)
    assert said.startswith(f"{field} ")
    assert said.replace(" (every=)", "") == f"{field} {filed}"


def test_the_defaults_every_cadence_is_given_still_pass() -> None:
    # What the decorators and `Schedule` pass through whatever the cadence.
    assert define(cron="0 * * * *", anchor="grid", day_and=False).cadence.kind == "cron"
    assert define(every="1h", anchor="grid", day_and=False).cadence.kind == "every"
    assert define(at=AT, anchor="grid", day_and=False).cadence.kind == "at"
    assert define(cron="0 9 1 * 1", day_and=True).cadence.kind == "cron"
    assert define(every="1h", anchor="release").cadence.kind == "every"
    Schedule(cron="0 * * * *")
    Schedule(at=AT)
    with pytest.raises(ScheduleError, match="anchor applies to interval schedules"):
        Schedule(cron="0 * * * *", anchor="release")


def test_the_decorators_pass_their_defaults_without_tripping_the_check() -> None:
    import dramatiq
    from celery import Celery
    from dramatiq.brokers.stub import StubBroker

    from emq_bridge.celery import recurring as celery_recurring
    from emq_bridge.dramatiq import recurring as dramatiq_recurring

    broker = StubBroker()

    @dramatiq_recurring(cron="0 * * * *")
    @dramatiq.actor(broker=broker, queue_name="q")
    def hourly() -> None: ...

    @dramatiq_recurring(at=AT, name="once")
    @dramatiq.actor(broker=broker, queue_name="q")
    def once() -> None: ...

    app = Celery("fix_api")

    @celery_recurring(cron="0 9 * * *", tz="Europe/Paris")
    @app.task  # type: ignore[untyped-decorator]
    def digest() -> None: ...

    with pytest.raises(ScheduleError, match="anchor applies to interval schedules"):

        @dramatiq_recurring(cron="0 * * * *", anchor="release")
        @dramatiq.actor(broker=broker, queue_name="q")
        def wrong() -> None: ...
