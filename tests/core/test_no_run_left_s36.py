"""A schedule with no run left reads `next_run_ms is None`, as docs/cron.md says (found by a
probe of the calendar's edges, session 36).

An interval excluded from tomorrow to the end of 9999 (a freeze "until further notice")
fires until the exclusion starts, then has no run. Its claim scores it `NEVER_MS` (2**53 -
1), and `Registration.next_run_ms` gave that number, as did `show --json` and `list --json`
(`"next_run_ms": 9007199254740991`, beside `"next_run": null`). It is None now, and the JSON
null; `list` still says `- (never)`.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from click.testing import CliRunner

from emq_bridge import Declaration, Pump, Repeat, define, sync
from emq_bridge.cli import cli
from emq_bridge.testing import ManualClock, RecordingDispatcher


def ms(*parts: int) -> int:
    return int(datetime(*parts, tzinfo=timezone.utc).timestamp() * 1000)


def frozen_past_its_last_run(
    client: object, prefix: str, queue: str = "frz", task: str = "t", source: str | None = None
) -> tuple[Repeat, RecordingDispatcher]:
    """An hourly schedule excluded from 2026-12-08 to the end of 9999, fired at its last slot
    (2026-12-07 23:00 UTC): it has no run left."""
    clock = ManualClock(ms(2026, 12, 7, 22, 30))
    repeat = Repeat(client, prefix, clock=clock)
    definition = define(every="1h", exclude=["2026-12-08..9999-12-31"], template={"task": task})
    repeat.upsert_many([(queue, "h", definition)], source=source)
    dispatcher = RecordingDispatcher()
    clock.set(ms(2026, 12, 7, 23, 0))
    Pump(repeat, [queue], dispatcher).run_once()
    return repeat, dispatcher


def test_an_exclusion_to_the_end_of_9999_leaves_no_next_run(
    client: object, redis_url: str, prefix: str
) -> None:
    repeat, dispatcher = frozen_past_its_last_run(client, prefix)
    assert [o.due_ms for o in dispatcher.occurrences] == [ms(2026, 12, 7, 23)]
    found = repeat.get("frz", "h")
    assert found is not None and found.completed is None
    assert found.next_run_ms is None and found.upcoming(2) == []

    runner = CliRunner()
    base = ["--redis-url", redis_url, "--prefix", prefix]
    shown = json.loads(runner.invoke(cli, [*base, "show", "frz", "h", "--json"]).stdout)
    assert shown["next_run_ms"] is None and shown["next_run_in_ms"] is None
    assert shown["next_run"] is None
    (listed,) = json.loads(runner.invoke(cli, [*base, "list", "frz", "--json"]).stdout)
    assert listed["next_run_ms"] is None
    table = runner.invoke(cli, [*base, "list", "frz"]).stdout
    assert "- (never)" in table, table


def test_a_paused_schedule_with_no_run_left_resumes_and_stays_so(
    client: object, prefix: str
) -> None:
    # The review of session 36: with `next_run_ms` None, resume took it for a schedule
    # with no parked run and computed a first run, which the exclusions refuse: exit 1.
    repeat, _ = frozen_past_its_last_run(client, prefix)
    assert repeat.pause("frz", "h")
    assert repeat.resume("frz", "h")
    found = repeat.get("frz", "h")
    assert found is not None and not found.paused and found.no_run_left


def test_an_apps_sync_beside_an_imported_schedule_with_no_run_left_keeps_it(
    client: object, prefix: str
) -> None:
    # The second review of session 36: a takeover seed read from `no_run_left` tried to
    # move such a registration to the app's queue, cancelled it, then its create was refused
    # ("would never run"): the record was gone and the sync failed. It is not taken over.
    repeat, _ = frozen_past_its_last_run(client, prefix, "celery", "app.t", "import:redbeat")
    declared = Declaration("app", "h", define(every="1h", template={"task": "app.t"}))
    sync(repeat, [declared], "beat", read_queues=("celery",))
    kept = repeat.get("celery", "h")
    assert kept is not None and kept.no_run_left and kept.source == "import:redbeat"
    created = repeat.get("app", "h")
    assert created is not None and created.source == "beat"
