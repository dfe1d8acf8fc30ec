"""`emq_bridge.celery.sentry` case by case, in a process of its own (sentry-sdk patches
Celery process-wide): the monitor config is sentry-sdk's own for every kind of schedule,
the check-in id is the occurrence id, triggers and unknown names are not monitored, and
the pipelined path gives way to the one that carries a check-in per task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def check(tmp_path: Path, redis_url: str, prefix: str, mode: str) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, str(HERE / "beat_monitors_check.py"), mode],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(HERE),
            "SENTRY_BROKER": redis_url,
            "SENTRY_QUEUE": f"{prefix}-q",
            "SENTRY_PREFIX": prefix,
            "SENTRY_ENVELOPES": str(tmp_path / f"{mode}.jsonl"),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_the_beats_monitors_build_sentry_sdks_config_and_check_in_once_per_occurrence(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    out, stderr = check(tmp_path, redis_url, prefix, "on")
    for kind, (ours, sentrys) in out["configs"].items():
        assert ours == sentrys, kind
    assert out["configs"]["crontab"][0] == {
        "schedule": {"type": "crontab", "value": "*/5 9-17 * * 1-5"},
        "timezone": "America/New_York",
    }
    assert out["configs"]["interval-3d"][0]["schedule"] == {
        "type": "interval",
        "value": 3,
        "unit": "day",
    }
    assert [out["configs"][k][0] for k in ("interval-90s", "interval-30s", "solar")] == [{}] * 3
    assert "Sentry Crons cannot monitor 'interval-90s'" in stderr
    # The slug is the entry's key (spaces and all), found by the registration's name.
    assert out["entries"] == [
        [f"{prefix}-q", "hourly", "hourly"],
        [f"{prefix}-q", "nightly_report", "nightly report"],
    ]
    check_in = uuid.UUID(out["occurrence_id"]).hex
    assert out["scheduled"] == {
        "sentry-monitor-slug": "nightly report",
        "sentry-monitor-config": {
            "schedule": {"type": "crontab", "value": "0 2 * * *"},
            "timezone": "America/New_York",
        },
        "sentry-monitor-check-in-id": check_in,
    }
    assert out["redelivered"] == out["scheduled"]  # a re-send reopens the same check-in
    assert out["triggered"] is None and out["unknown"] is None
    # Session 35 (a probe of the built wheel): with sentry-sdk 2.0 to 2.11, which the floor
    # allowed, every dispatch of the beat raised AttributeError and no task was sent; the
    # floor is now 2.12, and a check-in that fails is logged once and skipped.
    assert out["broken"] == [None, None]
    assert stderr.count("Sentry Crons: no check-in for") == 1
    assert out["traces"] == 5  # each task the beat sends starts a trace, monitored or not
    sent = [json.loads(line) for line in (tmp_path / "on.jsonl").read_text().splitlines()]
    assert [(s["payload"]["check_in_id"], s["payload"]["status"]) for s in sent] == [
        (check_in, "in_progress"),
        (check_in, "in_progress"),
    ]
    assert out["dispatcher"] == "CeleryDispatcher" and out["hooked"]
    assert "emq_bridge_pipelined is off: Sentry Crons monitors beat tasks" in stderr


def test_without_monitor_beat_tasks_nothing_is_added_and_pipelined_stays(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    out, _ = check(tmp_path, redis_url, prefix, "off")
    assert out["scheduled"] is None and out["redelivered"] is None
    assert out["traces"] == 5  # as sentry-sdk's patched apply_entry, monitoring or not
    assert not (tmp_path / "off.jsonl").exists()  # no check-in at all
    assert out["dispatcher"] == "PipelinedCeleryDispatcher"
