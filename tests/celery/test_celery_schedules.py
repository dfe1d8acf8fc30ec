"""Celery schedule objects -> registry cadences, held against Celery's own schedule classes.

The differential test simulates a perfect `celery beat` over a year: each entry fires at the
instant Celery's own `remaining_estimate` names, then that instant becomes `last_run_at`
(what `Scheduler.reserve` records). emq-bridge's fire times must be the same instants,
except at the DST transitions listed in `KNOWN_DIFFERENCES`, where Celery misfires and
emq-bridge follows the DST rule of docs/design.md; docs/celery.md names the same cases.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import BaseSchedule, crontab, schedstate, schedule, solar

from emq_bridge import Cron, Every
from emq_bridge.cadence import Cadence
from emq_bridge.celery.entries import CelerySchedule, convert_entry, convert_schedule, crontab_expr
from emq_bridge.errors import ConfigError

YEAR_START = datetime(2025, 1, 1, tzinfo=timezone.utc)
YEAR_END = datetime(2026, 1, 1, tzinfo=timezone.utc)


def make_app(tz: str | None = "Europe/Paris", enable_utc: bool = True) -> Celery:
    app = Celery("differential", set_as_current=False)
    app.conf.timezone = tz
    app.conf.enable_utc = enable_utc
    app.task(name="t.noop", shared=False)(noop)
    return app


def noop() -> None:
    return None


def celery_fires(entry: Any, start: datetime, end: datetime) -> list[int]:
    """Fire times (epoch ms) of a perfect celery beat running `entry` from `start`."""
    now = [start]
    entry.nowfun = lambda: now[0]
    last = start
    fires = []
    while True:
        now[0] = last
        nxt = last + entry.remaining_estimate(last)
        assert nxt > last, f"Celery's schedule stalled at {last}"
        if nxt > end:
            return fires
        fires.append(int(nxt.timestamp() * 1000))
        last = nxt


def emq_fires(cadence: Cadence, start: datetime, end: datetime) -> list[int]:
    at, stop, fires = int(start.timestamp() * 1000), int(end.timestamp() * 1000), []
    while (at := cadence.next_after(at)) <= stop:
        fires.append(at)
    return fires


def local(ms: int, tz: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).isoformat()


# (label, factory): each factory builds a fresh schedule object.
TABLE: list[tuple[str, Any]] = [
    ("daily 02:00", lambda: crontab(minute=0, hour=2)),
    ("daily 02:30", lambda: crontab(minute=30, hour=2)),
    ("daily 01:30", lambda: crontab(minute=30, hour=1)),
    ("every 15 min within 02h", lambda: crontab(minute="*/15", hour=2)),
    ("hourly", lambda: crontab(minute=0)),
    ("every 30 min", lambda: crontab(minute="*/30")),
    ("every 2 h", lambda: crontab(minute=0, hour="*/2")),
    ("weekdays 09:00", lambda: crontab(minute=0, hour=9, day_of_week="mon-fri")),
    (
        "first Monday 09:00 (dom AND dow)",
        lambda: crontab(minute=0, hour=9, day_of_week="mon", day_of_month="1-7"),
    ),
    (
        "1st and 3rd Sunday 03:15",
        lambda: crontab(minute=15, hour=3, day_of_week=0, day_of_month="1-7,15-21"),
    ),
    (
        "last Sunday of Mar/Oct 02:00 and 03:00",
        lambda: crontab(
            minute=0, hour="2,3", day_of_month="25-31", month_of_year="3,10", day_of_week="sun"
        ),
    ),
    ("31st at midnight", lambda: crontab(minute=0, hour=0, day_of_month=31)),
    (
        "quarterly 1st 06:45",
        lambda: crontab(minute=45, hour=6, day_of_month=1, month_of_year="*/3"),
    ),
    ("Friday the 13th", lambda: crontab(minute=0, hour=12, day_of_month=13, day_of_week=5)),
    ("quarter past 1-4", lambda: crontab(minute=15, hour="1-4")),
    ("interval 1 h", lambda: schedule(timedelta(hours=1))),
    ("interval 90 min", lambda: 5400),
    ("interval 1 day", lambda: timedelta(days=1)),
    ("interval 7 h 13 s", lambda: schedule(timedelta(hours=7, seconds=13))),
]
ZONES = ["Europe/Paris", "America/New_York", "UTC", "Australia/Lord_Howe"]

# Every instant where emq-bridge deliberately differs from Celery's crontab, by zone and
# entry: (fired only by Celery, fired only by emq-bridge), as local ISO times.
KNOWN_DIFFERENCES: dict[tuple[str, str], tuple[list[str], list[str]]] = {
    # 1. A fixed time inside the spring-forward gap: Celery shifts it by the gap's length
    #    (02:30 -> 03:30); docs/design.md fires it once at the first valid instant after the gap.
    ("Europe/Paris", "daily 02:30"): (["2025-03-30T03:30:00+02:00"], ["2025-03-30T03:00:00+02:00"]),
    ("America/New_York", "daily 02:30"): (
        ["2025-03-09T03:30:00-04:00"],
        ["2025-03-09T03:00:00-04:00"],
    ),
    #    When the crontab also names the hour after the gap, Celery's shifted run is that
    #    hour's own (02:15 -> 03:15, which fires anyway): one run; emq-bridge fires the gap's
    #    slot at 03:00 and 03:15 too (the parity probe, session 38; docs/celery.md). Lord Howe's
    #    gap is half an hour: Celery's 02:15 + 30 min, emq-bridge's first valid instant.
    ("Europe/Paris", "quarter past 1-4"): ([], ["2025-03-30T03:00:00+02:00"]),
    ("America/New_York", "quarter past 1-4"): ([], ["2025-03-09T03:00:00-04:00"]),
    ("Australia/Lord_Howe", "quarter past 1-4"): (
        ["2025-10-05T02:45:00+11:00"],
        ["2025-10-05T02:30:00+11:00"],
    ),
    # 2. Every-hour crontabs at fall-back: Celery skips the repeated hour (two hours pass
    #    without a run); emq-bridge follows elapsed time and fires in it.
    ("Europe/Paris", "hourly"): ([], ["2025-10-26T02:00:00+01:00"]),
    ("Europe/Paris", "every 30 min"): (
        [],
        ["2025-10-26T02:00:00+01:00", "2025-10-26T02:30:00+01:00"],
    ),
    ("America/New_York", "hourly"): ([], ["2025-11-02T01:00:00-05:00"]),
    ("America/New_York", "every 30 min"): (
        [],
        ["2025-11-02T01:00:00-05:00", "2025-11-02T01:30:00-05:00"],
    ),
    # 3. Lord Howe moves its clocks by 30 minutes. In its spring gap (02:00 -> 02:30) Celery
    #    fires the missing 02:00 at 02:30, half an hour after 01:00... then again at 03:00;
    #    emq-bridge keeps elapsed time (01:00, 03:00). At fall-back the repeated 01:30 fires
    #    in emq-bridge only, as in case 2.
    ("Australia/Lord_Howe", "hourly"): (["2025-10-05T02:30:00+11:00"], []),
    ("Australia/Lord_Howe", "every 30 min"): ([], ["2025-04-06T01:30:00+10:30"]),
}


def cases() -> Iterator[Any]:
    for zone in ZONES:
        for label, factory in TABLE:
            yield pytest.param(zone, label, factory, id=f"{zone}:{label}")


@pytest.mark.parametrize(("zone", "label", "factory"), list(cases()))
def test_a_year_of_fire_times_equals_celerys_own_schedule_except_the_named_dst_differences(
    zone: str, label: str, factory: Any
) -> None:
    app = make_app(zone)
    cadence = convert_schedule(factory(), app, label)
    theirs = factory()
    theirs = schedule(theirs, app=app) if isinstance(theirs, (int, timedelta)) else theirs
    theirs.app = app
    start = YEAR_START
    if isinstance(cadence, Every):
        # An interval fires on the epoch grid; Celery's from the beat's start. Started on a
        # slot of that grid, a perfect Celery beat must fire at the same instants all year.
        every = timedelta(milliseconds=cadence.every_ms)
        start -= (start - datetime(1970, 1, 1, tzinfo=timezone.utc)) % every
    celery_set = set(celery_fires(theirs, start, YEAR_END))
    emq_set = set(emq_fires(cadence, start, YEAR_END))
    only_celery = sorted(local(ms, zone) for ms in celery_set - emq_set)
    only_emq = sorted(local(ms, zone) for ms in emq_set - celery_set)
    assert (only_celery, only_emq) == KNOWN_DIFFERENCES.get((zone, label), ([], []))
    assert len(emq_set) > 0 or label == "Friday the 13th"


def test_every_known_difference_is_exercised_by_the_table() -> None:
    labels = {label for label, _ in TABLE}
    assert {(z, lab) for z, lab in KNOWN_DIFFERENCES} <= {(z, lab) for z in ZONES for lab in labels}


def test_a_crontab_becomes_a_cron_in_the_app_time_zone_with_days_anded() -> None:
    app = make_app("America/New_York")
    cadence = convert_schedule(
        crontab(minute=0, hour=9, day_of_week="mon", day_of_month="1-7"), app, "x"
    )
    assert cadence == Cron("0 9 1,2,3,4,5,6,7 * 1", "America/New_York", day_and=True)


def test_only_an_every_hour_crontab_keeps_a_wildcard_hour() -> None:
    assert crontab_expr(crontab(minute="*/20")) == ("0,20,40 * * * *", False)
    assert crontab_expr(crontab(minute="*", hour="*/6")) == ("0-59 0,6,12,18 * * *", False)


def test_enable_utc_without_a_time_zone_evaluates_crontabs_in_utc() -> None:
    app = make_app(None, enable_utc=True)
    cadence = convert_schedule(crontab(minute=5, hour=4), app, "x")
    assert isinstance(cadence, Cron)
    assert cadence.tz == "UTC"


def test_a_crontab_that_carries_its_own_time_zone_is_evaluated_there() -> None:
    class TokyoCrontab(crontab):  # the documented way to give one entry its own zone
        tz = ZoneInfo("Asia/Tokyo")

    cadence = convert_schedule(TokyoCrontab(minute=0, hour=9), make_app("Europe/Paris"), "x")
    assert isinstance(cadence, Cron)
    assert cadence.tz == "Asia/Tokyo"


@pytest.mark.parametrize(
    "value", [30, 30.0, timedelta(seconds=30), schedule(timedelta(seconds=30))]
)
def test_numbers_timedeltas_and_schedules_become_a_drift_free_interval(value: Any) -> None:
    assert convert_schedule(value, make_app(), "x") == Every(30_000)


def test_a_relative_interval_is_computed_by_celerys_own_schedule_object() -> None:
    cadence = convert_schedule(schedule(timedelta(minutes=15), relative=True), make_app(), "x")
    assert isinstance(cadence, CelerySchedule)
    # Celery rounds a relative deadline down to the interval's resolution (here: the minute).
    after = datetime(2030, 1, 1, 10, 7, 42, tzinfo=timezone.utc)
    next_ms = cadence.next_after(int(after.timestamp() * 1000))
    assert datetime.fromtimestamp(next_ms / 1000, timezone.utc) == after.replace(
        minute=22, second=0
    )


class EveryOtherMinute(BaseSchedule):
    """A custom schedule class: fires on even minutes (its is_due reads its remaining_estimate)."""

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        nxt = last_run_at.replace(second=0, microsecond=0) + timedelta(minutes=1)
        if nxt.minute % 2:
            nxt += timedelta(minutes=1)
        return nxt - self.now()

    def is_due(self, last_run_at: datetime) -> schedstate:
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        return schedstate(remaining <= 0, max(remaining, 0))


def test_a_custom_schedule_class_drives_the_cadence_through_its_own_is_due() -> None:
    cadence = convert_schedule(EveryOtherMinute(), make_app(), "x")
    assert isinstance(cadence, CelerySchedule)
    assert cadence.by_is_due
    start = datetime(2030, 1, 1, 10, 0, 30, tzinfo=timezone.utc)
    fires = [
        datetime.fromtimestamp(ms / 1000, timezone.utc)
        for ms in emq_fires(cadence, start, start + timedelta(minutes=7))
    ]
    assert [f.minute for f in fires] == [2, 4, 6]
    # The placeholder a plain pump would use, and the label: an edit is a cadence change.
    assert cadence.to_fields() == {
        "every_ms": "86400000",
        "anchor": "schedule",
        "cadence_label": "<test_celery_schedules.EveryOtherMinute object>",
    }


def test_a_solar_schedule_follows_celerys_own_sun_computation() -> None:
    import ephem  # noqa: F401  (the test extra installs it; a missing one is a failure)

    sunrise = solar("sunrise", 48.85, 2.35)
    cadence = convert_schedule(sunrise, make_app(), "sunrise")
    assert isinstance(cadence, CelerySchedule)
    start = datetime(2030, 6, 1, tzinfo=timezone.utc)
    fires = emq_fires(cadence, start, start + timedelta(days=3))
    assert len(fires) == 3
    assert all(3 <= datetime.fromtimestamp(ms / 1000, timezone.utc).hour <= 5 for ms in fires)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"task": "t.nope", "schedule": 5}, "unknown task 't.nope'"),
        ({"task": "t.noop", "schedule": "every day"}, "is not a schedule"),
        ({"task": "t.noop", "schedule": 0}, "must be positive"),
        ({"task": "t.noop", "schedule": 0.0001}, "must be at least 1 ms, got 0.0001s"),
        ({"task": "t.noop", "schedule": 1e12}, r"at most 31536000000000 \(1000 years\)"),
        ({"task": "t.noop", "schedule": timedelta(days=999_999_999)}, "1000 years"),
        ({"task": "t.noop", "schedule": 1e20}, "Celery rejects this entry"),
        ({"task": "t.noop", "schedule": float("inf")}, "Celery rejects this entry"),
        ({"task": "t.noop", "schedule": float("nan")}, "Celery rejects this entry"),
        ({"task": "t.noop", "schedule": 5, "options": {"queue": 5}}, r"options\['queue'\]"),
        ({"task": "t.noop", "schedule": 5, "options": {"exchange": 1}}, "must be a name"),
        ({"task": "t.noop", "schedule": 5, "options": {"routing_key": ["k"]}}, "must be a name"),
        ({"task": "t.noop", "schedule": None}, "is not a schedule"),
        ({"task": "t.noop", "shedule": 5}, "Celery rejects this entry"),
        ({"schedule": 5}, "has no 'task'"),
        ({"task": "", "schedule": 5}, "has no 'task'"),
        # Session 38 (the beat parity probe): these were "has no 'task'", and a relative or
        # own-clock interval of no length was sent at every check, once a second.
        ({"task": 123, "schedule": 5}, "its 'task' must be a string .*, got int"),
        ({"task": ["t.noop"], "schedule": 5}, "its 'task' must be a string .*, got list"),
        (
            {"task": "t.noop", "schedule": schedule(timedelta(seconds=-1), relative=True)},
            "the interval must be positive, got -1.0s",
        ),
        (
            {"task": "t.noop", "schedule": schedule(timedelta(0), relative=True)},
            "the interval must be positive",
        ),
        (
            {"task": "t.noop", "schedule": schedule(-5, nowfun=datetime.now)},
            "the interval must be positive",
        ),
        (
            {"task": "t.noop", "schedule": 5, "options": {"eta": datetime(2030, 1, 1)}},
            "relative value",
        ),
        ({"task": "t.noop", "schedule": 5, "args": [object()]}, "not JSON-serialisable"),
        ({"task": "t.noop", "schedule": 5, "args": [datetime(2030, 1, 1)]}, "JSON-serialisable"),
        ({"task": "t.noop", "schedule": 5, "kwargs": {"n": Decimal("1.5")}}, "JSON-serialisable"),
        ({"task": "t.noop", "schedule": 5, "args": [{1, 2}]}, "not JSON-serialisable"),
        ({"task": "t.noop", "schedule": 5, "args": [b"raw"]}, "not JSON-serialisable"),
    ],
)
def test_a_bad_beat_schedule_entry_is_a_config_error_that_names_the_entry(
    entry: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        convert_entry(make_app(), "my-entry", entry)
    assert "beat_schedule['my-entry']" in str(raised.value)


def test_a_key_that_cannot_be_a_name_is_one_error_that_names_the_entry_once() -> None:
    with pytest.raises(ConfigError) as raised:
        convert_entry(make_app(), "a\u200bb", {"task": "t.noop", "schedule": 60})
    message = str(raised.value)
    assert message.count("beat_schedule[") == 1, message
    assert "must not contain whitespace or control characters" in message


def test_an_entry_key_with_spaces_becomes_a_valid_registration_name() -> None:
    declaration, _ = convert_entry(
        make_app(), "send the report", {"task": "t.noop", "schedule": 60}
    )
    assert declaration.name == "send_the_report"


def test_an_entry_carries_args_kwargs_and_json_options_into_its_template() -> None:
    from kombu import Queue

    from emq_bridge.celery.kombu_entities import entity_json

    declaration, _ = convert_entry(
        make_app(),
        "e",
        {
            "task": "t.noop",
            "schedule": 60,
            "args": (1, 2),
            "kwargs": {"a": "b"},
            "options": {
                "queue": Queue("reports"),
                "priority": 3,
                "expires": 30,
                "headers": {"h": 1},
            },
        },
    )
    assert declaration.queue == "reports"
    # A kombu Queue is kept as what Celery routes by (its description), not its name alone:
    # the name would declare a direct exchange and binding the Queue does not have.
    assert dict(declaration.definition.template) == {
        "task": "t.noop",
        "args": [1, 2],
        "kwargs": {"a": "b"},
        "options": {
            "queue": entity_json(Queue("reports")),
            "priority": 3,
            "expires": 30,
            "headers": {"h": 1},
        },
    }


def test_an_entry_without_a_queue_goes_to_the_queue_its_task_routes_to() -> None:
    app = make_app()
    app.conf.task_routes = {"t.noop": {"queue": "routed"}}
    declaration, _ = convert_entry(app, "e", {"task": "t.noop", "schedule": 60})
    assert declaration.queue == "routed"
    assert convert_entry(make_app(), "e", {"task": "t.noop", "schedule": 60})[0].queue == "celery"


def test_a_beat_schedule_that_is_no_dict_is_a_config_error_that_says_so() -> None:
    # Session 39's input probe: a list of entries said "cannot convert dictionary update
    # sequence element #0 to a sequence", naming neither beat_schedule nor what it wants.
    from emq_bridge.celery.declare import app_schedule

    app = make_app()
    app.conf.beat_schedule = [{"task": "t.noop", "schedule": 60}]
    with pytest.raises(ConfigError, match=r"^beat_schedule must be a dict of entries by name"):
        app_schedule(app)
