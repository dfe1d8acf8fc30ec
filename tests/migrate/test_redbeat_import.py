"""celery-redbeat -> emq-bridge: entries made through redbeat's own API, imported by the
command, start at the slot redbeat would fire next (held against redbeat's own `is_due`),
and a real `celery beat -S emq` then fires them there; a second import writes nothing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.schedules import crontab, schedule
from cli_run import Run
from quiet import quiet_hour
from redbeat import RedBeatSchedulerEntry
from redbeat.schedules import rrule
from registry_state import snapshot

from emq_bridge import Repeat

ZONE = "Europe/Paris"
# Hours of the day about twelve hours from now, in ZONE (the app's) and in UTC.
QUIET_HOUR, QUIET_HOUR_UTC = quiet_hour(ZONE), quiet_hour()


@pytest.fixture
def redbeat_app(redis_url: str) -> Iterator[Celery]:
    app = Celery("rbt", broker=redis_url, set_as_current=False)
    app.conf.update(
        redbeat_redis_url=redis_url,
        redbeat_key_prefix=f"rb{uuid.uuid4().hex[:8]}:",
        timezone=ZONE,
    )
    yield app


def save(app: Celery, name: str, value: Any, **options: Any) -> RedBeatSchedulerEntry:
    return RedBeatSchedulerEntry(name, "rbt.record", value, app=app, **options).save()


def redbeat_next_ms(app: Celery, name: str) -> tuple[bool, int]:
    """Return (due now, when redbeat's own is_due says the entry fires next, epoch ms)."""
    entry = RedBeatSchedulerEntry.from_key(app.redbeat_conf.key_prefix + name, app=app)
    checked = time.time()
    due, next_s = entry.is_due()
    return bool(due), round((checked + (0 if due else next_s)) * 1000)


def make_entries(app: Celery) -> datetime:
    now = datetime.now(timezone.utc)
    grid = now.replace(microsecond=0) - timedelta(seconds=20)
    save(app, "every-5s", schedule(timedelta(seconds=5)), last_run_at=now - timedelta(seconds=1))
    # The crontabs' and the daily rrule's hours are far from now: a slot passing while a test
    # runs would make one due (or fire it twice).
    quarterly = crontab(minute="*/15", hour=QUIET_HOUR)
    save(app, "quarterly", quarterly, last_run_at=now)
    save(app, "nightly", crontab(minute=0, hour=QUIET_HOUR), last_run_at=now - timedelta(days=3))
    weekdays = crontab(minute=30, hour=QUIET_HOUR, day_of_week="mon-fri")
    save(app, "weekdays", weekdays, last_run_at=now)
    # A 5-second rrule that started 20 s ago and last ran on its latest slot.
    last_slot = grid + timedelta(seconds=20)
    save(app, "rrule-5s", rrule("SECONDLY", interval=5, dtstart=grid), last_run_at=last_slot)
    save(
        app,
        "rrule-daily",
        rrule(
            "DAILY",
            byhour=QUIET_HOUR_UTC,
            byminute=45,
            dtstart=datetime(2026, 1, 1, QUIET_HOUR_UTC, 45, tzinfo=timezone.utc),
        ),
        last_run_at=now,
    )
    save(app, "paused", schedule(timedelta(seconds=2)), enabled=False, last_run_at=now)
    return now


CARRIED = ("every-5s", "quarterly", "nightly", "weekdays", "rrule-5s", "rrule-daily", "paused")


def test_redbeat_entries_are_imported_at_the_slot_redbeat_fires_next_and_again_changes_nothing(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    make_entries(redbeat_app)
    save(redbeat_app, "bounded", rrule("DAILY", count=3))
    save(redbeat_app, "relative", schedule(timedelta(minutes=1), relative=True))
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix, "--timezone", ZONE)

    before = repeat.server_time_ms()
    result = run(*args)
    after = repeat.server_time_ms()
    assert result.exit_code == 0, result.output
    assert "8 created, 0 updated, 0 unchanged, 1 refused" in result.stderr
    refused = [line for line in result.stdout.splitlines() if line.startswith("! ")]
    assert len(refused) == 1
    assert f"{key_prefix}relative: " in refused[0] and "beat_schedule" in refused[0]
    bounded = repeat.get("celery", "bounded")
    assert bounded is not None  # count=3: it ends at its third slot, two days on
    dtstart = RedBeatSchedulerEntry.from_key(key_prefix + "bounded", app=redbeat_app).schedule
    last_slot = round((dtstart.dtstart + timedelta(days=2)).timestamp() * 1000)
    assert bounded.definition.bounds.limit is None
    assert abs(bounded.definition.bounds.end_ms - last_slot) <= 1

    for name in CARRIED:
        registration = repeat.get("celery", name)
        assert registration is not None, name
        assert registration.source == "import:redbeat"
        if name == "paused":  # redbeat's is_due says "not due, ask again in 5 s" while disabled
            assert registration.paused
            assert registration.next_run_ms == registration.last_fired_ms + 2000  # kept for resume
            continue
        due_now, expected = redbeat_next_ms(redbeat_app, name)
        assert not registration.paused
        if due_now:  # overdue for redbeat: it fires at once, and so does the import
            assert name == "nightly"
            assert before <= registration.next_run_ms <= after
        else:
            assert registration.next_run_ms == pytest.approx(expected, abs=50), name
    assert repeat.get("celery", "weekdays").definition.cadence.describe() == (
        f"cron 30 {QUIET_HOUR} * * 1,2,3,4,5 ({ZONE})"
    )
    assert repeat.get("celery", "rrule-daily").definition.cadence.describe() == (
        f"cron 45 {QUIET_HOUR_UTC} * * * (UTC)"
    )
    assert repeat.get("celery", "every-5s").last_fired_ms is not None

    state = snapshot(repeat)
    again = run(*args)
    assert again.exit_code == 0, again.output
    assert "0 created, 0 updated, 8 unchanged, 1 refused" in again.stderr
    assert snapshot(repeat) == state  # not one byte written


def test_a_dry_run_writes_nothing_and_strict_refuses_the_whole_import(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    save(redbeat_app, "ok", schedule(timedelta(minutes=1)))
    save(redbeat_app, "relative", schedule(timedelta(minutes=1), relative=True))
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)

    dry = run(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "1 created, 0 updated, 0 unchanged, 1 refused (dry run: nothing written)" in dry.stderr
    strict = run(*args, "--strict")
    assert strict.exit_code == 1
    assert "1 schedule(s) cannot be imported" in strict.stderr
    assert snapshot(repeat) == {}


APP = textwrap.dedent("""
    import os
    from celery import Celery

    env = os.environ
    app = Celery("emqmig", broker=env["EMQT_REDIS"])
    app.conf.update(
        emq_bridge_redis_url=env["EMQT_REDIS"],
        emq_bridge_prefix=env["EMQT_PREFIX"],
        task_default_queue=env["EMQT_QUEUE"],
        timezone="Europe/Paris",
        result_backend=None,
        result_expires=None,
        broker_connection_retry_on_startup=True,
        beat_schedule={},
    )
""")


def sent(client: redis.Redis, queue: str) -> dict[str, list[dict[str, Any]]]:
    """Return the messages the beat put on the Redis broker's queue, by registration name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for raw in reversed(client.lrange(queue, 0, -1)):
        headers = json.loads(raw)["headers"]
        out.setdefault(headers["emq_schedule"].split("/", 1)[1], []).append(headers)
    return out


@pytest.mark.slow
def test_a_celery_beat_fires_the_imported_entries_at_the_slots_redbeat_would_fire(
    run: Run, repeat: Repeat, redis_url: str, prefix: str, redbeat_app: Celery, tmp_path: Path
) -> None:
    queue = f"{prefix}-q"
    (tmp_path / "emqmig.py").write_text(APP)
    log = tmp_path / "beat.log"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "EMQT_REDIS": redis_url}
    env.update(EMQT_PREFIX=prefix, EMQT_QUEUE=queue)
    with log.open("wb") as out:  # the beat runs first: the import reaches it as a wake-up
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "emqmig", "beat", "-S", "emq", "-l", "info"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    client = redis.Redis.from_url(redis_url)
    try:
        started = time.monotonic() + 60
        while "emq-bridge beat: " not in log.read_text(errors="replace"):
            assert time.monotonic() < started and beat.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        make_entries(redbeat_app)
        key_prefix = redbeat_app.redbeat_conf.key_prefix
        expected = {name: redbeat_next_ms(redbeat_app, name) for name in CARRIED}
        imported_at = repeat.server_time_ms()
        result = run(
            *("import", "redbeat", "--from", redis_url, "--prefix", key_prefix),
            *("--timezone", ZONE, "--queue", queue),
        )
        assert result.exit_code == 0, result.output
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            fired = sent(client, queue)
            if all(name in fired for name in ("every-5s", "nightly", "rrule-5s")):
                break
            time.sleep(0.2)
    finally:
        beat.terminate()
        beat.wait(timeout=20)
        client.close()
    with redis.Redis.from_url(redis_url) as after:
        fired = sent(after, queue)
    text = log.read_text(errors="replace")
    for name in ("every-5s", "rrule-5s"):
        assert name in fired, text[-3000:]
        first = fired[name][0]
        # The slot redbeat's is_due named (to its float's precision), released no earlier.
        assert first["emq_due_ms"] == pytest.approx(expected[name][1], abs=50), name
        assert first["emq_released_ms"] >= first["emq_due_ms"]
        slots = [h["emq_due_ms"] for h in fired[name]]
        assert slots == [first["emq_due_ms"] + 5000 * i for i in range(len(slots))]  # its grid
    assert expected["nightly"][0]  # redbeat: due at once, as overdue
    assert [h["emq_due_ms"] >= imported_at for h in fired["nightly"]] == [True]
    for name in ("quarterly", "weekdays", "rrule-daily", "paused"):
        assert name not in fired, name  # not due before their slot; paused never
    assert math.isclose(
        repeat.get(queue, "quarterly").next_run_ms, expected["quarterly"][1], abs_tol=50
    )


def test_a_cut_over_imports_paused_then_resumes_only_what_redbeat_runs(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    now = datetime.now(timezone.utc)
    save(redbeat_app, "hourly", schedule(timedelta(hours=1)), last_run_at=now)
    save(redbeat_app, "fast", schedule(timedelta(seconds=1)), last_run_at=now)
    save(redbeat_app, "off", schedule(timedelta(minutes=1)), enabled=False, last_run_at=now)
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)

    staged = run(*args, "--paused")  # redbeat still runs them: nothing fires on this side
    assert staged.exit_code == 0, staged.output
    assert all(repeat.get("celery", n).paused for n in ("hourly", "fast", "off"))
    hourly_next = repeat.get("celery", "hourly").next_run_ms
    # The slot "fast" had staged passed; redbeat stores a run before it sends it, and its
    # stored last run did not move: it never sent that slot (its beat stopped).
    time.sleep(1.2)

    cut = run(*args, "--resume")  # redbeat's beat is stopped now
    assert cut.exit_code == 0, cut.output
    assert "0 created, 0 updated, 3 unchanged, 0 refused, 2 resumed" in cut.stderr
    now_ms = repeat.server_time_ms()
    hourly, fast, off = (repeat.get("celery", n) for n in ("hourly", "fast", "off"))
    assert not hourly.paused and hourly.next_run_ms == hourly_next  # still ahead: kept
    # An overdue slot redbeat never sent fires at once (session 36; was: not fired, lost).
    assert not fast.paused and fast.next_run_ms <= now_ms
    assert off.paused  # disabled in redbeat: stays paused
    state = snapshot(repeat)
    again = run(*args, "--resume")
    assert again.stderr.strip().endswith("0 created, 0 updated, 3 unchanged, 0 refused")
    assert snapshot(repeat) == state


def test_a_cut_over_resumes_where_redbeat_would_fire_next_after_its_runs_meanwhile(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    # Staged 50 minutes after its last run, an hourly entry is paused at its slot 10 minutes
    # on. redbeat's beat, still running, then sends it (a restart caught it up, say): at the
    # cut-over it is resumed at redbeat's next slot, an hour on, not 10 minutes after a run.
    now = datetime.now(timezone.utc)
    save(
        redbeat_app, "hourly", schedule(timedelta(hours=1)), last_run_at=now - timedelta(minutes=50)
    )
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    assert run(*args, "--paused").exit_code == 0
    staged = repeat.get("celery", "hourly")
    assert staged.paused and staged.fired == 0
    entry = RedBeatSchedulerEntry.from_key(key_prefix + "hourly", app=redbeat_app)
    sent = next(entry)  # what redbeat's scheduler does as it sends the task
    due, redbeat_next = redbeat_next_ms(redbeat_app, "hourly")
    assert not due

    cut = run(*args, "--resume")
    assert cut.exit_code == 0, cut.output
    assert "1 resumed" in cut.stderr, cut.stderr
    hourly = repeat.get("celery", "hourly")
    assert not hourly.paused
    assert hourly.next_run_ms is not None and staged.next_run_ms is not None
    assert math.isclose(hourly.next_run_ms, redbeat_next, abs_tol=1000)
    assert hourly.next_run_ms > staged.next_run_ms + 45 * 60_000
    # Its run count and last run are redbeat's now.
    assert hourly.fired == 1
    assert hourly.last_fired_ms is not None
    assert abs(hourly.last_fired_ms - sent.last_run_at.timestamp() * 1000) < 1


def test_an_unreachable_redbeat_is_named_in_one_line_and_nothing_is_written(
    run: Run, repeat: Repeat
) -> None:
    result = run("import", "redbeat", "--from", "redis://127.0.0.1:1/0")
    assert result.exit_code == 3
    assert result.stderr.startswith("Error: cannot read celery-redbeat at redis://127.0.0.1:1/0")
    assert len(result.stderr.strip().splitlines()) == 1
    assert snapshot(repeat) == {}


@pytest.mark.parametrize("queue", ["a{b", "", "two words"])
def test_a_bad_default_queue_is_a_usage_error_and_nothing_is_written(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery, queue: str
) -> None:
    # An entry naming its own queue would have been written, the others refused, exit 0.
    save(redbeat_app, "routed", schedule(timedelta(hours=1)), options={"queue": "special"})
    save(redbeat_app, "plain", schedule(timedelta(hours=1)))
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    result = run("import", "redbeat", "--from", redis_url, "--prefix", key_prefix, "--queue", queue)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--queue'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert snapshot(repeat) == {}


def test_an_import_that_finds_no_schedule_says_so(run: Run, repeat: Repeat, redis_url: str) -> None:
    # Before: "0 created ... 0 refused" and exit 0, as if a typo'd database were a migration.
    result = run("import", "redbeat", "--from", redis_url, "--redbeat-prefix", "nothing-here:")
    assert result.exit_code == 0, result.output
    assert "note: the old scheduler holds no schedule here" in result.stderr
    assert snapshot(repeat) == {}


def test_a_cut_over_leaves_a_pause_an_operator_set_by_hand(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    # Migration probe, session 40: `--resume` lifted any pause on the import's
    # registrations, an operator's too ("do not run until INC-42 is fixed").
    now = datetime.now(timezone.utc)
    save(redbeat_app, "nightly", schedule(timedelta(hours=1)), last_run_at=now)
    save(redbeat_app, "staged", schedule(timedelta(hours=1)), last_run_at=now)
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    assert run(*args).exit_code == 0
    held = run("pause", "celery", "nightly", "--note", "INC-42", "--by", "alice")
    assert held.exit_code == 0, held.output
    assert run(*args, "--paused").exit_code == 0  # stages "staged" only: "nightly" is held
    cut = run(*args, "--resume")
    assert cut.exit_code == 0, cut.output
    assert "> resumed celery/nightly" not in cut.output
    nightly = repeat.get("celery", "nightly")
    assert nightly is not None and nightly.paused and nightly.paused_by == "alice"


def test_an_import_run_again_names_what_it_left_behind_with_the_command_to_remove_it(
    run: Run, repeat: Repeat, redis_url: str, redbeat_app: Celery
) -> None:
    # Migration probe, session 40: an entry moved to another queue in redbeat fired under
    # both queues, and a deleted one kept firing, and the import said nothing of either.
    now = datetime.now(timezone.utc)
    save(redbeat_app, "report", schedule(timedelta(hours=1)), last_run_at=now)
    gone = save(redbeat_app, "gone", schedule(timedelta(hours=1)), last_run_at=now)
    key_prefix = redbeat_app.redbeat_conf.key_prefix
    args = ("import", "redbeat", "--from", redis_url, "--prefix", key_prefix)
    first = run(*args)
    assert first.exit_code == 0, first.output
    assert "was not read by this import" not in first.stderr
    save(
        redbeat_app,
        "report",
        schedule(timedelta(hours=1)),
        last_run_at=now,
        options={"queue": "fastlane"},
    )
    gone.delete()
    again = run(*args)
    assert again.exit_code == 0, again.output
    assert repeat.get("fastlane", "report") is not None
    assert (
        "note: celery/report of import:redbeat was not read by this import: its entry is in "
        "queue 'fastlane' now, where it fires too; it still fires here unless removed: "
        "emq-bridge remove celery report"
    ) in again.stderr
    assert "note: celery/gone of import:redbeat was not read" in again.stderr
    assert "emq-bridge remove celery gone" in again.stderr
    assert again.stderr.strip().splitlines()[-1].startswith("import import:redbeat:")


def test_what_an_import_left_behind_is_named_twenty_at_most_then_counted(repeat: Repeat) -> None:
    from emq_bridge.migrate.plan import LEFT_BEHIND_SHOWN, ImportPlan, left_behind_notes

    for i in range(LEFT_BEHIND_SHOWN + 2):
        repeat.upsert(
            "celery", f"old{i:02d}", every="1h", template={"task": "t"}, source="import:redbeat"
        )
    repeat.upsert("celery", "mine", every="1h", template={"task": "t"}, source="app")
    lines = left_behind_notes(repeat, ImportPlan(source="import:redbeat"))
    assert len(lines) == LEFT_BEHIND_SHOWN + 1
    assert all("was not read by this import" in line for line in lines[:-1])
    assert not any("celery/mine" in line for line in lines)
    assert lines[-1] == (
        "note: 2 more registration(s) of import:redbeat were not read by this import either "
        f"(the first {LEFT_BEHIND_SHOWN} are named above)"
    )
