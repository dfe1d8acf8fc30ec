"""Sentry Crons on Dramatiq: a real worker with `RecurringMiddleware` and `SentryCrons` sends
an `in_progress` check-in when it starts an occurrence and `ok`/`error` when it ends, with
the schedule's monitor config, the check-in id being the occurrence id."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from quiet import quiet_hour, quiet_offset
from test_sentry_crons import check_ins

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 45


def test_a_dramatiq_worker_sends_a_check_in_pair_per_occurrence_with_its_schedule(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    hour = quiet_hour("Europe/Paris")  # the quarter hours of an hour far from now
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE),
        "SENTRY_BROKER": redis_url,
        "SENTRY_QUEUE": f"{prefix}-q",
        "SENTRY_PREFIX": prefix,
        "SENTRY_ENVELOPES": str(tmp_path / "worker.jsonl"),
        "SENTRY_QUIET_HOUR": str(hour),
        "SENTRY_QUIET_OFFSET": quiet_offset("2h"),
    }
    seeded = subprocess.run(
        [sys.executable, "-c", "import dramatiq_crons_app as a; a.seed()"],
        cwd=tmp_path, env={**env, "SENTRY_ENVELOPES": str(tmp_path / "seed.jsonl")},
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert seeded.returncode == 0, seeded.stderr
    log = tmp_path / "worker.log"
    with log.open("ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "dramatiq_crons_app", "-p", "1", "-t", "2"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while len(check_ins(tmp_path / "worker.jsonl")) < 4:
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(TIMEOUT_S)
    found = check_ins(tmp_path / "worker.jsonl")
    by_slug: dict[str, list[str]] = {}
    for check_in in found:
        by_slug.setdefault(check_in["monitor_slug"], []).append(check_in["status"])
    assert by_slug == {
        "quarterly-digest": ["in_progress", "ok"],
        "two-hourly-sync": ["in_progress", "error"],
    }  # `fast` (every 45 s) is not a Sentry Crons schedule: no check-in
    configs = {c["monitor_slug"]: c["monitor_config"] for c in found}
    assert configs == {
        "quarterly-digest": {
            "schedule": {"type": "crontab", "value": f"*/15 {hour} * * *"},
            "timezone": "Europe/Paris",
        },
        "two-hourly-sync": {
            "schedule": {"type": "interval", "value": 2, "unit": "hour"},
            "timezone": "UTC",
        },
    }
    for slug in by_slug:
        started, ended = [c for c in found if c["monitor_slug"] == slug]
        assert started["check_in_id"] == ended["check_in_id"]
        assert uuid.UUID(hex=started["check_in_id"]).version == 5  # the occurrence id
        assert isinstance(ended["duration"], float) and 0 <= ended["duration"] < TIMEOUT_S


def test_a_cron_alias_is_monitored_as_its_five_fields() -> None:
    # `@daily` was {} (not monitored), though docs/sentry.md names only sub-minute, seconds
    # fields and H as what Sentry Crons cannot take.
    from emq_bridge.cadence import Cron
    from emq_bridge.dramatiq.sentry import monitor_config_of

    assert monitor_config_of(Cron("@daily", "Europe/Paris")) == {
        "schedule": {"type": "crontab", "value": "0 0 * * *"},
        "timezone": "Europe/Paris",
    }
    assert monitor_config_of(Cron("@hourly"))["schedule"]["value"] == "0 * * * *"
    assert monitor_config_of(Cron("*/30 * * * * *")) == {}  # a seconds field: not monitored


def test_a_jittered_schedule_is_monitored_as_its_slots_with_a_margin_for_the_jitter() -> None:
    # It was {} (silently not monitored), though jitter keeps each slot's nominal time.
    from emq_bridge.cadence import Cron, Every
    from emq_bridge.dramatiq.sentry import monitor_config_of
    from emq_bridge.jitter import Jittered

    assert monitor_config_of(Jittered(Cron("0 * * * *"), 30 * 60_000, "s")) == {
        "schedule": {"type": "crontab", "value": "0 * * * *"},
        "timezone": "UTC",
        "checkin_margin": 31,  # Sentry's default minute, plus the jitter
    }
    config = monitor_config_of(Jittered(Every(3_600_000), 90_500, "s"))
    assert config["schedule"] == {"type": "interval", "value": 1, "unit": "hour"}
    assert config["checkin_margin"] == 3  # 1 + 91 s in whole minutes
    assert monitor_config_of(Jittered(Every(30_000), 5_000, "s")) == {}  # under a minute


def test_a_name_declared_on_two_queues_gets_a_monitor_per_queue(
    repeat: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Both reported to the monitor `job`, each check-in rewriting its schedule.
    import dramatiq
    import sentry_sdk
    from dramatiq.brokers.stub import StubBroker
    from sentry_sdk.transport import Transport

    from emq_bridge import Pump
    from emq_bridge.dramatiq import DramatiqDispatcher, RecurringMiddleware, recurring
    from emq_bridge.dramatiq.sentry import SentryCrons

    sent: list[dict[str, Any]] = []

    class Kept(Transport):
        def capture_envelope(self, envelope: Any) -> None:
            sent.extend(item.payload.json for item in envelope.items)

    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware(repeat, run_pump=False))
    broker.add_middleware(SentryCrons())

    @recurring(every="2m", name="job")
    @dramatiq.actor(broker=broker, queue_name="qa")
    def first() -> None: ...

    @recurring(cron="0 * * * *", name="job")
    @dramatiq.actor(broker=broker, queue_name="qb")
    def second() -> None: ...

    @recurring(every="2m", name="excluded", exclude=["2031-12-25"])
    @dramatiq.actor(broker=broker, queue_name="qa")
    def third() -> None: ...

    sentry_sdk.init(dsn="http://key@127.0.0.1:9/1", transport=Kept, default_integrations=False)
    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        later = repeat.server_time_ms() + 7 * 86_400_000  # all three due, a Monday or not
        for queue in ("qa", "qb"):
            Pump(repeat, [queue], DramatiqDispatcher(broker)).run_once(now_ms=later)
            broker.join(queue)
        worker.join()
    finally:
        worker.stop()
        sentry_sdk.get_client().close()
        sentry_sdk.init()  # no DSN: nothing sent by later tests of this process
    slugs = {(c["monitor_slug"], c["status"]) for c in sent}
    assert slugs == {
        ("qa-job", "in_progress"),
        ("qa-job", "ok"),
        ("qb-job", "in_progress"),
        ("qb-job", "ok"),
    }
    assert "Sentry Crons cannot monitor qa/excluded" in caplog.text
