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
