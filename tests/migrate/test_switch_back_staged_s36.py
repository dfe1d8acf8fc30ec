"""A staged cut-over from celery-redbeat after a switch back to it (found by a probe that
switched a live app to emq-bridge, back to redbeat, and to emq-bridge again, session 36).

The second cut-over found its registrations there from the first, active, each next run
where the stopped emq-bridge beat had left it. `import --paused` created nothing and paused
nothing ("its paused state is not changed"), so `--resume` lifted nothing and read no last
run again: the new beat fired every slot redbeat had sent since the switch back, at once
(30 of 36 entries twice). `--paused` now pauses, as the import's, the registrations that
exist and fire here, and says so; `--resume` lifts them from redbeat's last run, as it does
the registrations it created paused. A real server; redbeat's entries as it stores them.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import redis
from celery.schedules import schedule
from cli_run import Run
from redbeat.decoder import RedBeatJSONEncoder

from emq_bridge import Repeat, define

MINUTE_MS = 60_000


def store(old: tuple[redis.Redis, str], name: str, last_run: datetime, count: int) -> None:
    """One entry every minute as celery-redbeat writes it, with its last run."""
    client, key_prefix = old
    definition = {"name": name, "task": "rbt.record", "schedule": schedule(timedelta(minutes=1))}
    meta = {"last_run_at": last_run, "total_run_count": count}
    fields = {"definition": definition, "meta": meta}
    client.hset(
        key_prefix + name,
        mapping={k: json.dumps(v, cls=RedBeatJSONEncoder) for k, v in fields.items()},
    )
    client.zadd(key_prefix + ":schedule", {key_prefix + name: 0})


def test_a_second_staged_cut_over_resumes_from_redbeats_last_run(
    run: Run, repeat: Repeat, redis_url: str, old: tuple[redis.Redis, str]
) -> None:
    now = datetime.fromtimestamp(repeat.server_time_ms() / 1000, tz=timezone.utc)
    flags = ["--from", redis_url, "--prefix", old[1]]
    # The first switch: emq-bridge took it over from a run 30 minutes ago, then was stopped
    # (its next run stays where it was: long overdue by now).
    store(old, "digest", now - timedelta(minutes=30), 5)
    first = run("import", "redbeat", *flags)
    assert first.exit_code == 0, first.output
    stale = repeat.get("celery", "digest")
    assert stale is not None and stale.next_run_ms is not None
    assert stale.next_run_ms < repeat.server_time_ms()
    # Back on redbeat meanwhile: it ran the entry every minute, last 10 s ago.
    store(old, "digest", now - timedelta(seconds=10), 35)

    staged = run("import", "redbeat", *flags, "--paused")
    assert staged.exit_code == 0, staged.output
    assert "> paused celery/digest (it fired here: --resume lifts it)" in staged.stdout
    assert "1 paused for the cut-over" in staged.stderr
    held = repeat.get("celery", "digest")
    assert held is not None and held.paused and held.paused_by == "import:redbeat"

    cut = run("import", "redbeat", *flags, "--resume")
    assert cut.exit_code == 0, cut.output
    assert "> resumed celery/digest" in cut.stdout
    resumed = repeat.get("celery", "digest")
    assert resumed is not None and not resumed.paused
    # The slot redbeat fires next (a minute after its last run), not the stale overdue one.
    redbeat_next_ms = int((now - timedelta(seconds=10)).timestamp() * 1000) + MINUTE_MS
    assert resumed.next_run_ms is not None
    assert resumed.next_run_ms >= redbeat_next_ms - 1_000
    assert resumed.next_run_ms > repeat.server_time_ms()


def test_paused_dry_run_says_what_it_would_pause_and_writes_nothing(
    run: Run, repeat: Repeat, redis_url: str, old: tuple[redis.Redis, str]
) -> None:
    now = datetime.fromtimestamp(repeat.server_time_ms() / 1000, tz=timezone.utc)
    flags = ["--from", redis_url, "--prefix", old[1]]
    store(old, "digest", now - timedelta(minutes=30), 5)
    assert run("import", "redbeat", *flags).exit_code == 0
    dry = run("import", "redbeat", *flags, "--paused", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "> paused celery/digest" in dry.stdout
    found = repeat.get("celery", "digest")
    assert found is not None and not found.paused


def test_paused_leaves_another_sources_registration_alone(
    run: Run, repeat: Repeat, redis_url: str, old: tuple[redis.Redis, str]
) -> None:
    # The review of session 36: `_stage` paused a registration of the same name that another
    # source owns, which the import says it leaves alone (`!`); `--resume` then wrote
    # redbeat's run count into it.
    now = datetime.fromtimestamp(repeat.server_time_ms() / 1000, tz=timezone.utc)
    repeat.upsert_many(
        [("celery", "digest", define(every="1h", template={"task": "app.other"}))], source="deploy"
    )
    store(old, "digest", now - timedelta(seconds=10), 3)
    staged = run("import", "redbeat", "--from", redis_url, "--prefix", old[1], "--paused")
    assert staged.exit_code == 0, staged.output
    assert "owned by the source 'deploy': left alone" in staged.stdout
    assert "> paused" not in staged.stdout
    found = repeat.get("celery", "digest")
    assert found is not None and not found.paused and found.source == "deploy"
    assert found.fired == 0
