"""The Celery side of the lifecycle, in process: policies declared on entries and decorators,
the headers each occurrence carries (both send paths), and the signal receivers' reports.

Real servers: the registry and the broker are the test Redis. Tasks run in process through
Celery's own `apply` (its signals fire as in a worker); `tests/celery/test_celery_lifecycle.py`
runs the same receivers in real prefork workers.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
import redis
from celery import Celery
from celery.app.task import Context
from celery.exceptions import Ignore, Reject

from emq_bridge import Occurrence, Repeat, ScheduleError, occurrence_id
from emq_bridge.celery import (
    CeleryDispatcher,
    PipelinedCeleryDispatcher,
    app_schedule,
    last_success_time,
    previous_nominal_time,
    recurring,
    reporter_for,
)
from emq_bridge.celery.dispatch import occurrence_headers
from emq_bridge.celery.reporting import occurrence_of, started_report
from emq_bridge.errors import ConfigError
from emq_bridge.keys import MAX_NAME_BYTES
from emq_bridge.lifecycle import report_of

T0 = 1_900_000_000_000


def noop() -> None:
    return None


@pytest.fixture
def make_app(redis_url: str, prefix: str) -> Iterator[Any]:
    apps: list[Celery] = []

    def build(beat_schedule: dict[str, Any] | None = None, **conf: Any) -> Celery:
        app = Celery(f"lc-{prefix}-{len(apps)}", broker=redis_url, set_as_current=False)
        app.conf.update(
            task_default_queue=f"{prefix}-q",
            emq_bridge_prefix=prefix,
            beat_schedule=beat_schedule or {},
            result_backend=None,
            result_expires=None,
        )
        app.conf.update(conf)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def occurrence(prefix: str, queue: str, name: str, due_ms: int = T0, **fields: Any) -> Occurrence:
    triggered = bool(fields.get("triggered"))
    return Occurrence(
        queue=queue,
        name=name,
        due_ms=due_ms,
        id=occurrence_id(prefix, queue, name, due_ms, triggered=triggered),
        template=fields.pop("template", {"task": "lc.noop"}),
        released_ms=fields.pop("released_ms", due_ms + 7),
        **fields,
    )


def broker_messages(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """Every task message waiting in a Redis-broker queue, oldest first; consumed."""
    found = [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]
    client.delete(queue)
    return found


# -- policies: beat_schedule keys and @recurring ------------------------------------------


def test_a_beat_schedule_entry_carries_its_overlap_and_pause_policies(make_app: Any) -> None:
    app = make_app(
        {
            "guarded": {
                "task": "lc.noop",
                "schedule": 60.0,
                "overlap": "skip",
                "pause_after_failures": 3,
            },
            "plain": {"task": "lc.noop", "schedule": 60.0},
        }
    )
    app.task(name="lc.noop", shared=False)(noop)
    found = {d.name: d.definition for d in app_schedule(app).declarations}
    assert (found["guarded"].overlap, found["guarded"].pause_after_failures) == ("skip", 3)
    assert (found["plain"].overlap, found["plain"].pause_after_failures) == ("allow", None)
    assert "overlap" not in found["guarded"].template.get("options", {})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"overlap": "sometimes"}, r"beat_schedule\['x'\]: overlap must be one of"),
        ({"overlap": None}, r"overlap must be one of .*got None"),
        ({"pause_after_failures": 0}, r"beat_schedule\['x'\]: pause_after_failures must be"),
        ({"pause_after_failures": "3"}, r"pause_after_failures must be a whole number"),
        ({"pause_after_failures": True}, r"pause_after_failures must be a whole number"),
        ({"options": {"overlap": "skip"}}, r"'overlap' is a policy of the schedule, not a"),
        ({"options": {"pause_after_failures": 2}}, r"move it out of options"),
    ],
)
def test_a_bad_policy_in_an_entry_is_a_config_error_naming_the_entry(
    make_app: Any, extra: dict[str, Any], message: str
) -> None:
    app = make_app({"x": {"task": "lc.noop", "schedule": 60.0, **extra}})
    app.task(name="lc.noop", shared=False)(noop)
    with pytest.raises(ConfigError, match=message):
        app_schedule(app)


def test_recurring_declares_the_overlap_and_pause_policies(make_app: Any, prefix: str) -> None:
    app = make_app()

    @recurring(every="1m", overlap="replace", pause_after_failures=5)
    @app.task(name=f"lc.{prefix}.sync", shared=False)
    def sync_inventory() -> None:
        return None

    (declaration,) = app_schedule(app).declarations
    assert declaration.definition.overlap == "replace"
    assert declaration.definition.pause_after_failures == 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"overlap": "never"}, "overlap must be one of"),
        ({"pause_after_failures": -1}, "pause_after_failures must be a whole number"),
    ],
)
def test_recurring_refuses_a_bad_policy_when_it_decorates(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ScheduleError, match=message):
        recurring(every="1m", **options)


# -- the headers of each occurrence ---------------------------------------------------------


def test_each_task_carries_the_previous_run_context_in_its_headers(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    app = make_app()
    queue = f"{prefix}-q"
    first = occurrence(prefix, queue, "report")
    later = occurrence(
        prefix,
        queue,
        "report",
        T0 + 60_000,
        redelivered=True,
        previous_due_ms=T0,
        last_success_ms=T0 + 1234,
    )
    CeleryDispatcher(app).dispatch_batch([first, later])
    sent = [m["headers"] for m in broker_messages(client, queue)]
    assert [h["id"] for h in sent] == [first.id, later.id]
    expected = [
        (T0, f"{queue}/report", T0 + 7, False, False, None, None),
        (T0 + 60_000, f"{queue}/report", T0 + 60_007, True, False, T0, T0 + 1234),
    ]
    keys = (
        "emq_due_ms",
        "emq_schedule",
        "emq_released_ms",
        "emq_redelivered",
        "emq_triggered",
        "emq_previous_due_ms",
        "emq_last_success_ms",
    )
    assert [tuple(h[k] for k in keys) for h in sent] == expected
    assert all(h["celery_beat_task"] is True for h in sent)


def without_tag(payload: bytes) -> dict[str, Any]:
    message = json.loads(payload)
    message["properties"].pop("delivery_tag")
    return dict(message)


def test_the_pipelined_path_writes_each_occurrences_own_values_as_apply_async_does(
    make_app: Any, client: redis.Redis, prefix: str
) -> None:
    app = make_app()
    queue = f"{prefix}-q"
    template = {"task": "lc.noop", "args": [1], "options": {"headers": {"mine": "kept"}}}
    batch = [
        occurrence(prefix, queue, "a", T0, template=template),
        occurrence(
            prefix,
            queue,
            "a",
            T0 + 1000,
            template=template,
            released_ms=T0 + 5000,
            redelivered=True,
            previous_due_ms=T0,
            last_success_ms=T0 + 900,
        ),
        occurrence(prefix, queue, "a", T0 + 2500, template=template, triggered=True),
    ]
    fast = PipelinedCeleryDispatcher(app)
    try:
        assert fast.dispatch_batch(batch) == [None, None, None]  # one plan for all three
        pipelined = [without_tag(json.dumps(m).encode()) for m in broker_messages(client, queue)]
    finally:
        fast.close()
    for occ in batch:
        CeleryDispatcher(app).dispatch(occ)
    normal = [without_tag(json.dumps(m).encode()) for m in broker_messages(client, queue)]
    assert pipelined == normal
    headers = [m["headers"] for m in pipelined]
    assert [h["emq_released_ms"] for h in headers] == [T0 + 7, T0 + 5000, T0 + 2507]
    assert [h["emq_redelivered"] for h in headers] == [False, True, False]
    assert [h["emq_triggered"] for h in headers] == [False, False, True]
    assert [h["emq_previous_due_ms"] for h in headers] == [None, T0, None]
    assert [h["emq_last_success_ms"] for h in headers] == [None, T0 + 900, None]
    assert all(h["mine"] == "kept" for h in headers)


def test_a_task_reads_the_previous_slot_and_the_last_success_from_its_request() -> None:
    request = Context(
        {"id": "x", "emq_previous_due_ms": T0, "emq_last_success_ms": T0 + 250, "retries": 0}
    )
    assert previous_nominal_time(request) == datetime.fromtimestamp(T0 / 1000, timezone.utc)
    assert last_success_time(request) == datetime.fromtimestamp((T0 + 250) / 1000, timezone.utc)
    eager = Context({"id": "y", "headers": {"emq_previous_due_ms": T0}})
    assert previous_nominal_time(eager) is not None
    assert last_success_time(eager) is None
    first_run = Context({"id": "z", "emq_previous_due_ms": None})
    assert previous_nominal_time(first_run) is None


def test_a_schedule_header_whose_names_hold_a_slash_is_cut_where_the_id_matches(
    make_app: Any, prefix: str
) -> None:
    app = make_app()
    for queue, name in (("a/b", "c"), ("a", "b/c"), ("plain", "x")):
        ident = occurrence_id(prefix, queue, name, T0)
        request = Context({"id": ident, "emq_due_ms": T0, "emq_schedule": f"{queue}/{name}"})
        found = occurrence_of(request, app)
        assert found is not None
        assert (found["queue"], found["name"]) == (queue, name)
    assert occurrence_of(Context({"id": "t", "emq_due_ms": T0}), app) is None


def test_a_schedule_header_longer_than_a_queue_and_a_name_is_refused_before_any_cut(
    make_app: Any, prefix: str
) -> None:
    """Each '/' of a schedule header is a cut to try, at an id computed over the whole header:
    a message of a megabyte of '/' (another service's, a forged one) held a worker's main
    process for minutes (a probe: 200,000 took 36 s). Only a header a queue and a name can
    make is cut (each at most MAX_NAME_BYTES)."""
    app = make_app()
    hostile = Context({"id": "x", "emq_due_ms": T0, "emq_schedule": "q/" + "/" * 1_000_000})
    with pytest.raises(ValueError, match="1000002 characters long"):
        occurrence_of(hostile, app)
    with pytest.raises(ValueError, match="characters long"):
        started_report(hostile, app, 1)
    longest = ("q/" + "a" * (MAX_NAME_BYTES - 2), "n/" + "b" * (MAX_NAME_BYTES - 2))
    ident = occurrence_id(prefix, *longest, T0)
    request = Context({"id": ident, "emq_due_ms": T0, "emq_schedule": "/".join(longest)})
    found = occurrence_of(request, app)
    assert found is not None and (found["queue"], found["name"]) == longest


def test_a_started_report_read_straight_from_the_request_is_the_one_report_of_makes(
    make_app: Any, prefix: str
) -> None:
    """A worker's second task of a registration takes the fast path (`_CUTS`): the same
    report, field for field, as `report_of(occurrence_of(...))`, and the same errors."""
    app = make_app()
    cases = [
        ("fast-q", "nightly", {"emq_released_ms": T0 + 7}),
        ("fast-q", "nightly", {"emq_released_ms": "", "emq_redelivered": True}),
        ("fast-q", "nightly", {"emq_triggered": True}),
        ("a/b", "c", {}),  # two '/': cut by the id, never cached
        ("a", "b/c", {}),
    ]
    for _ in range(2):  # the first round fills the cache, the second reads from it
        for queue, name, extra in cases:
            triggered = bool(extra.get("emq_triggered"))
            ident = occurrence_id(prefix, queue, name, T0, triggered=triggered)
            fields = {"id": ident, "emq_due_ms": T0, "emq_schedule": f"{queue}/{name}", **extra}
            request = Context(fields)
            found = started_report(request, app, 2)
            occurrence = occurrence_of(request, app)
            assert found is not None and occurrence is not None
            expected = report_of("started", occurrence, attempt=2, at_ms=found.at_ms)
            assert found == expected
    garbled = Context({"id": "x", "emq_due_ms": "soon", "emq_schedule": "fast-q/nightly"})
    with pytest.raises(ValueError):
        started_report(garbled, app, 1)
    assert started_report(Context({"id": "t", "emq_schedule": "fast-q/nightly"}), app, 1) is None
    assert started_report(Context({"id": "t"}), app, 1) is None


# -- the receivers, through Celery's own apply ---------------------------------------------


@pytest.fixture
def reporting_app(make_app: Any, repeat: Repeat, prefix: str) -> tuple[Celery, Repeat, str]:
    app = make_app(emq_bridge_heartbeat_s=0.2, emq_bridge_history_size=5)
    queue = f"{prefix}-q"
    for name in ("ok", "fail", "ignored", "rejected", "plain"):
        repeat.register(queue, name, every="1h", template={"task": f"lc.{name}"})

    @app.task(name="lc.ok", shared=False)
    def ok() -> str:
        return "fine"

    @app.task(name="lc.fail", shared=False)
    def fail() -> None:
        raise KeyError("missing")

    @app.task(name="lc.ignored", shared=False)
    def ignored() -> None:
        raise Ignore("nothing to do")

    @app.task(name="lc.rejected", shared=False)
    def rejected() -> None:
        raise Reject("bad input", requeue=False)

    return app, repeat, queue


def run(app: Celery, prefix: str, queue: str, name: str, *, with_headers: bool = True) -> str:
    occ = occurrence(prefix, queue, name, T0 + uuid.uuid4().int % 1000)
    headers = occurrence_headers(occ) if with_headers else {}
    app.tasks[f"lc.{name}"].apply(task_id=occ.id, headers=headers)
    return occ.id


def test_in_process_runs_report_succeeded_failed_skipped_with_their_errors(
    reporting_app: tuple[Celery, Repeat, str], prefix: str
) -> None:
    app, repeat, queue = reporting_app
    ids = {name: run(app, prefix, queue, name) for name in ("ok", "fail", "ignored", "rejected")}
    reporter = reporter_for(app)
    assert reporter is not None and reporter.flush(10)
    outcome = {}
    for name, ident in ids.items():
        (entry,) = repeat.history(queue, name)
        assert entry.id == ident
        outcome[name] = (entry.status, entry.attempt, entry.error)
    assert outcome == {
        "ok": ("succeeded", 1, None),
        "fail": ("failed", 1, "KeyError: 'missing'"),
        "ignored": ("skipped", 1, "Ignore: nothing to do"),
        "rejected": ("failed", 1, "Reject: bad input"),
    }
    assert repeat.get(queue, "fail").failures == 1  # type: ignore[union-attr]


def test_a_task_emq_bridge_did_not_send_is_not_reported(
    reporting_app: tuple[Celery, Repeat, str], prefix: str
) -> None:
    app, repeat, queue = reporting_app
    run(app, prefix, queue, "ok", with_headers=False)
    reporter = reporter_for(app)
    assert reporter is not None and reporter.flush(10)
    assert repeat.history(queue, "ok") == []


def test_reports_off_send_nothing(make_app: Any, repeat: Repeat, prefix: str) -> None:
    app = make_app(emq_bridge_report=False)
    app.task(name="lc.ok", shared=False)(noop)
    queue = f"{prefix}-q"
    repeat.register(queue, "ok", every="1h", template={"task": "lc.ok"})
    run(app, prefix, queue, "ok")
    assert reporter_for(app) is None
    assert repeat.history(queue, "ok") == []


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"emq_bridge_report": "maybe"}, "emq_bridge_report must be True or False"),
        ({"emq_bridge_history_size": 0}, "emq_bridge_history_size: history_size must be"),
        ({"emq_bridge_history_size": 2.5}, "emq_bridge_history_size must be a whole number"),
        ({"emq_bridge_heartbeat_s": 0}, "emq_bridge_heartbeat_s must be a positive number"),
        ({"emq_bridge_redis_url": None, "broker_url": "memory://"}, "needs a Redis"),
    ],
)
def test_a_bad_reporting_setting_turns_reports_off_with_one_error_line(
    make_app: Any, caplog: pytest.LogCaptureFixture, conf: dict[str, Any], message: str
) -> None:
    app = make_app(**conf)
    with caplog.at_level(logging.ERROR, logger="emq_bridge.celery"):
        assert reporter_for(app) is None
        assert reporter_for(app) is None  # decided once
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "occurrence reports are OFF" in errors[0] and message in errors[0]


def test_the_reporter_follows_the_app_settings(make_app: Any) -> None:
    app = make_app(emq_bridge_heartbeat_s=0.75, emq_bridge_history_size=7)
    reporter = reporter_for(app)
    assert reporter is not None and reporter is reporter_for(app)
    assert (reporter.heartbeat_s, reporter.history_size, reporter.heartbeat_ttl_ms) == (
        0.75,
        7,
        2250,
    )
