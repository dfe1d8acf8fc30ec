"""A pipelined beat gives way to the path that carries a Sentry check-in per task when
sentry-sdk starts in `beat_init` (docs/sentry.md's setup), which Celery sends after it built
the scheduler: the fast path was kept and every monitored run went without its check-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_sentry_started_in_beat_init_turns_the_pipelined_path_off(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    envelopes = tmp_path / "envelopes.jsonl"
    done = subprocess.run(
        [sys.executable, str(HERE / "beat_init_order_check.py")],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(HERE),
            "SENTRY_BROKER": redis_url,
            "SENTRY_QUEUE": f"{prefix}-q",
            "SENTRY_PREFIX": prefix,
            "SENTRY_ENVELOPES": str(envelopes),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["before"] == "PipelinedCeleryDispatcher"  # Sentry was not on yet
    assert out["after"] == "CeleryDispatcher"
    assert done.stderr.count("emq_bridge_pipelined is off: Sentry Crons monitors") == 1
    [headers] = out["headers"]
    assert headers["sentry-monitor-slug"] == "minutely"
    check_in = headers["sentry-monitor-check-in-id"]
    sent = [json.loads(line) for line in envelopes.read_text().splitlines()]
    check_ins = [s["payload"] for s in sent if s["type"] == "check_in"]
    assert [(c["check_in_id"], c["status"]) for c in check_ins] == [(check_in, "in_progress")]
