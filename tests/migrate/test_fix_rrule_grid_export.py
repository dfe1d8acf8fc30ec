"""A fixed-length celery-redbeat rrule is imported as an interval on its own grid (`offset`
= its dtstart modulo the interval), not only with its phase in the seeded next run: so
`export` writes the grid, and a fresh `sync` of the file fires on the rrule's slots, not on
the phase of the sync's time."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from itertools import islice
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from cli_run import Run
from redbeat import RedBeatSchedulerEntry
from redbeat.schedules import rrule

from emq_bridge import Repeat
from emq_bridge.cadence import Every
from emq_bridge.celery.importers.redbeat import importer_app
from emq_bridge.celery.importers.schedules import carry, epoch_ms

UTC = timezone.utc
PLUS_2 = timezone(timedelta(hours=2))
UNTIL = datetime(2035, 1, 1, tzinfo=UTC)


def recent(every: timedelta, phase: timedelta, tz: timezone = UTC) -> datetime:
    """A dtstart a few hundred slots ago, `phase` past the epoch's grid of `every` (dateutil
    walks an rrule from its dtstart: an old one of short steps takes long to read)."""
    step = int(every.total_seconds())
    now_s = int(datetime.now(UTC).timestamp())
    start = now_s - now_s % step - 300 * step
    return datetime.fromtimestamp(start, tz=tz) + phase


RRULES: dict[str, Any] = {
    # The tester's: every 3 h from 01:07 UTC, so 10:07, 13:07 ... (never the sync's phase).
    "three-hourly": lambda: rrule(
        "HOURLY", interval=3, dtstart=datetime(2025, 1, 1, 1, 7, tzinfo=UTC), until=UNTIL
    ),
    # Seconds in the phase, in a fixed offset (what redbeat stores for any zone).
    "seven-minutes": lambda: rrule(
        "MINUTELY",
        interval=7,
        dtstart=recent(timedelta(minutes=7), timedelta(minutes=3, seconds=17), PLUS_2),
    ),
    "fortnightly": lambda: rrule(
        "WEEKLY", interval=2, dtstart=datetime(2025, 3, 4, 18, 45, tzinfo=PLUS_2)
    ),
    "every-5-days": lambda: rrule(
        "DAILY", interval=5, dtstart=datetime(2024, 2, 29, 23, 59, 59, tzinfo=UTC)
    ),
}


def slots_after(value: Any, after_ms: int, n: int) -> list[int]:
    """The rrule's own next `n` slots after `after_ms` (dateutil), epoch ms."""
    after = datetime.fromtimestamp(after_ms / 1000, tz=UTC)
    return [epoch_ms(d) for d in islice(value.rrule.xafter(after), n)]


def load(text: str) -> dict[str, Any]:
    import tomllib

    return dict(tomllib.loads(text))


def test_an_exported_rrule_synced_afresh_keeps_the_rrules_slots(
    run: Run,
    repeat: Repeat,
    client: redis.Redis,
    redis_url: str,
    prefix: str,
    redbeat_app: Celery,
    tmp_path: Path,
) -> None:
    now_ms = repeat.server_time_ms()
    for name, make in RRULES.items():
        value = make()
        last = value.rrule.before(datetime.fromtimestamp(now_ms / 1000, tz=UTC))
        RedBeatSchedulerEntry(name, "app.t", value, app=redbeat_app, last_run_at=last).save()
    key_prefix = redbeat_app.redbeat_conf.key_prefix

    imported = run("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    assert imported.exit_code == 0, imported.output
    assert f"{len(RRULES)} created, 0 updated, 0 unchanged, 0 refused" in imported.stderr
    for name, make in RRULES.items():
        registration = repeat.get("celery", name)
        assert registration is not None and registration.next_run_ms is not None, name
        # Not overdue: the rrule's next slot after its last run, then the rrule's slots.
        expected = slots_after(make(), now_ms, 6)
        assert registration.upcoming(6) == expected, name
        cadence = registration.definition.cadence
        assert isinstance(cadence, Every) and cadence.anchor == "grid", cadence
        assert cadence.offset_ms == expected[0] % cadence.every_ms
    assert repeat.get("celery", "three-hourly").definition.bounds.end_ms == epoch_ms(UNTIL)

    path = tmp_path / "rrules.toml"
    exported = run("export", "--source", "import:redbeat", "-o", str(path))
    assert exported.exit_code == 0, exported.output
    assert f"exported {len(RRULES)} schedule(s), 0 left out" in exported.stderr
    entries = {e["name"]: e for e in load(path.read_text(encoding="utf-8"))["schedule"]}
    three = entries["three-hourly"]
    assert (three["every_ms"], three["anchor"], three["offset"]) == (
        10_800_000,
        "grid",
        f"{(epoch_ms(datetime(2025, 1, 1, 1, 7, tzinfo=UTC))) % 10_800_000}ms",  # 1 h 7 min
    )
    assert three["offset"] == "4020000ms" and three["end_at"] == "2035-01-01T00:00:00.000Z"

    fresh = Repeat(client, f"{prefix}x")
    synced_at = fresh.server_time_ms()
    synced = run("--prefix", f"{prefix}x", "sync", str(path))
    assert synced.exit_code == 0, synced.output
    assert f"{len(RRULES)} created" in synced.stderr
    for name, make in RRULES.items():
        registration = fresh.get("celery", name)
        assert registration is not None, name
        # A fresh registration starts at the rrule's next slot after the sync, whatever the
        # sync's own phase, and goes on on the rrule's slots.
        assert registration.upcoming(6) == slots_after(make(), synced_at, 6), name
        assert registration.definition.to_fields() == (
            repeat.get("celery", name).definition.to_fields()  # type: ignore[union-attr]
        )


def test_a_fixed_length_rrule_is_a_grid_interval_whatever_its_dtstarts_microseconds() -> None:
    # dateutil drops dtstart's microseconds: the grid does too.
    start = recent(timedelta(seconds=45), timedelta(seconds=17, microseconds=654_321), PLUS_2)
    value = rrule("SECONDLY", interval=45, dtstart=start)
    now = start + timedelta(hours=1, seconds=10)
    carried = carry(value, importer_app(), "r", last_run_ms=None, now_ms=epoch_ms(now))
    assert carried.cadence.describe() == "every 45s offset 17s"
    assert carried.cadence.next_after(carried.first_run_ms) - carried.first_run_ms == 45_000
    assert slots_after(value, epoch_ms(now), 4) == [
        carried.cadence.next_after(epoch_ms(now)),
        *(carried.cadence.next_after(s) for s in slots_after(value, epoch_ms(now), 3)),
    ]
