"""Sentry Crons parity: `celery beat -S emq` sends the check-ins Celery's own beat sends, for
the same `beat_schedule`, with sentry-sdk's `CeleryIntegration(monitor_beat_tasks=True)`.

Real processes: Celery's beat, emq-bridge's beat and one Celery worker serving both, each
with sentry-sdk's transport interface writing every envelope item to a file
(`crons_capture.FileTransport`). Both beats start with every entry due (Celery's: last run
three days ago; emq-bridge's: its registrations created three days ago). The crontab and
long interval entries fire once; the two quick entries (a one-minute interval to Sentry,
due every `BEAT_S` seconds) fire beat after beat, one succeeding, one failing. Check-in by
check-in, per entry and beat, the beat's `in_progress` and the worker's `ok`/`error` are
compared side by side, with the Sentry headers the task of that beat received.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from quiet import quiet_hour, quiet_offset

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 45
BEAT_S = 2.5  # sentry_app.BEAT_S: how often the quick entries are due
BEATS = 3  # beats compared of each quick entry (at least as many run)
MINUTE = {"type": "interval", "value": 1, "unit": "minute"}
QUICK = {"quick-ok": ("ok", MINUTE), "quick-fail": ("error", MINUTE)}
MONITORED = {
    **QUICK,
    # `{hour}`: the test's hour of the day far from now (sentry_app.QUIET_HOUR).
    "digest every quarter": ("ok", {"type": "crontab", "value": "*/15 {hour} * * *"}),
    "weekday paris": ("ok", {"type": "crontab", "value": "30 9 * * mon-fri"}),
    "hourly-interval": ("error", {"type": "interval", "value": 2, "unit": "hour"}),
    "every-two-minutes": ("ok", {"type": "interval", "value": 2, "unit": "minute"}),
}


def beats_compared(slug: str) -> int:
    """Return how many beats of `slug` are compared side by side: the crontab and long
    interval entries' first (minute resolution), the quick entries' first `BEATS`."""
    return BEATS if slug in QUICK else 1


UNMONITORED = {"fast", "excluded-nightly"}
HEADERS = {
    "sentry-monitor-slug",
    "sentry-monitor-config",
    "sentry-monitor-check-in-id",
    "sentry-monitor-start-timestamp-s",
}


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    # Whole lines only: another process may be writing the last one.
    return [json.loads(line) for line in path.read_text("utf-8").split("\n")[:-1] if line]


def check_ins(path: Path) -> list[dict[str, Any]]:
    return [item["payload"] for item in read_lines(path) if item["type"] == "check_in"]


class Processes:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str, **extra: str) -> None:
        with (self.tmp / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "sentry_app", *args, "-l", "info"],
                cwd=self.tmp,
                env={**self.env, "SENTRY_ENVELOPES": str(self.tmp / f"{name}.jsonl"), **extra},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n{(self.tmp / f'{name}.log').read_text(errors='replace')[-3000:]}"
            for name in self.procs
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def processes(tmp_path: Path, redis_url: str, prefix: str) -> Iterator[Processes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE),
        "SENTRY_BROKER": redis_url,
        "SENTRY_QUEUE": f"{prefix}-q",
        "SENTRY_PREFIX": prefix,
        "TASK_HEADERS": str(tmp_path / "tasks.jsonl"),
        # The entries that fire once at start: their next slots far from now (sentry_app.py).
        "SENTRY_QUIET_HOUR": str(quiet_hour("Europe/Paris")),
        "SENTRY_QUIET_OFFSET_2H": quiet_offset("2h"),
        "SENTRY_QUIET_OFFSET_2M": quiet_offset("2m"),
    }
    running = Processes(tmp_path, env)
    yield running
    running.stop()


VARYING = ("check_in_id", "duration", "event_id", "timestamp")


def stripped(check_in: dict[str, Any]) -> dict[str, Any]:
    """A check-in without what differs in any two runs: its ids, times and trace ids (the
    trace's shape is kept)."""
    out = {k: v for k, v in check_in.items() if k not in VARYING}
    trace = out.get("contexts", {}).get("trace", {})
    out["contexts"] = {**out.get("contexts", {}), "trace": sorted(trace)}
    return out


def trace_id(check_in: dict[str, Any]) -> str:
    return str(check_in["contexts"]["trace"]["trace_id"])


def when(check_in: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(check_in["timestamp"]).replace("Z", "+00:00"))


def test_celery_beat_dash_s_emq_sends_the_check_ins_celerys_own_beat_sends_beat_by_beat(
    processes: Processes, tmp_path: Path
) -> None:
    seeded = subprocess.run(
        [sys.executable, "-c", "import sentry_app; sentry_app.seed()"],
        cwd=tmp_path,
        env={**processes.env, "SENTRY_ENVELOPES": str(tmp_path / "seed.jsonl")},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert seeded.returncode == 0, seeded.stderr
    processes.start(
        "worker", "worker", "-P", "solo", "-c", "1", "-Q", processes.env["SENTRY_QUEUE"],
        "--without-mingle", "--without-gossip", "--without-heartbeat",
    )  # fmt: skip
    # Both beats at once: the quick entries' beats overlap in time, the test waits once.
    processes.start(
        "celery-beat", "beat", "--pidfile=", f"--schedule={tmp_path / 'celerybeat.db'}",
        SENTRY_SIDE="celery",
    )  # fmt: skip
    processes.start("emq-beat", "beat", "-S", "emq", "--pidfile=")
    sides = ("celery-beat", "emq-beat")

    def beats_of(side: str) -> dict[str, list[dict[str, Any]]]:
        """Return the `in_progress` check-ins `side` sent so far, by monitor slug."""
        beats: dict[str, list[dict[str, Any]]] = {}
        for check_in in check_ins(tmp_path / f"{side}.jsonl"):
            beats.setdefault(check_in["monitor_slug"], []).append(check_in)
        return beats

    def compared_closed() -> bool:
        """True once each side opened every monitor, each quick one `BEATS` times, and the
        worker closed those check-ins (a beat stopped later may have opened one more)."""
        opened = []
        for side in sides:
            beats = beats_of(side)
            if set(beats) != set(MONITORED) or min(len(beats[q]) for q in QUICK) < BEATS:
                return False
            opened += [
                c["check_in_id"] for k, found in beats.items() for c in found[: beats_compared(k)]
            ]
        return set(opened) <= {c["check_in_id"] for c in check_ins(tmp_path / "worker.jsonl")}

    deadline = time.monotonic() + TIMEOUT_S
    while not compared_closed():
        assert time.monotonic() < deadline, f"not {BEATS} beats closed\n{processes.logs()}"
        assert all(p.poll() is None for p in processes.procs.values()), processes.logs()
        time.sleep(0.2)
    processes.stop()

    closings: dict[str, list[dict[str, Any]]] = {}
    for check_in in check_ins(tmp_path / "worker.jsonl"):
        closings.setdefault(check_in["check_in_id"], []).append(check_in)
    # The worker closes only what a beat opened, each check-in once.
    assert set(closings) <= {
        c["check_in_id"] for side in sides for c in check_ins(tmp_path / f"{side}.jsonl")
    }
    assert all(len(found) == 1 for found in closings.values())
    tasks = read_lines(tmp_path / "tasks.jsonl")
    sides_seen: dict[str, dict[str, list[Any]]] = {}
    for side in sides:
        ours = [t for t in tasks if (t["emq_schedule"] is not None) == (side == "emq-beat")]
        beats = beats_of(side)
        # Each monitored entry sent check-ins, the others none. (A crontab or long interval
        # entry fires again if the test crosses its next time, on a side's own grid.)
        assert set(beats) == set(MONITORED), side
        seen: dict[str, list[Any]] = {}
        for slug, opened in beats.items():
            status, schedule = MONITORED[slug]
            if schedule["type"] == "crontab":
                hour = processes.env["SENTRY_QUIET_HOUR"]
                schedule = {**schedule, "value": str(schedule["value"]).format(hour=hour)}
            # One check-in per beat: its own id, and a new trace each beat.
            assert len({c["check_in_id"] for c in opened}) == len(opened), (side, slug)
            assert len({trace_id(c) for c in opened}) == len(opened), (side, slug)
            # Beat after beat, not a burst of catch-up runs.
            for earlier, later in pairwise(opened):
                assert (when(later) - when(earlier)).total_seconds() >= BEAT_S / 2, side
            seen[slug] = []
            # The beats compared (a beat may have sent one more as it stopped).
            for start in opened[: beats_compared(slug)]:
                assert start["status"] == "in_progress"
                assert start["monitor_config"] == {"schedule": schedule, "timezone": "Europe/Paris"}
                [end] = closings[start["check_in_id"]]  # this beat's own ok/error
                assert end["status"] == status and end["monitor_slug"] == slug
                assert end["monitor_config"] == start["monitor_config"]
                assert when(end) >= when(start)
                assert isinstance(end["duration"], float) and 0 <= end["duration"] < TIMEOUT_S
                [task] = [
                    t for t in ours if t.get("sentry-monitor-check-in-id") == start["check_in_id"]
                ]
                assert task["sentry-monitor-slug"] == slug
                assert str(task["trace"]).split("-")[0] == trace_id(start)
                assert task["sentry-monitor-config"] == start["monitor_config"]
                assert float(task["sentry-monitor-start-timestamp-s"]) > 0
                # The worker's check-in continues the trace the beat's started (sent in the task).
                same_trace = trace_id(end) == trace_id(start)
                seen[slug].append((stripped(start), stripped(end), sorted(task), same_trace))
        # Each task the beat sent, monitored or not, starts a trace of its own (sentry-sdk's
        # patched apply_entry starts one per entry), the monitored one its check-in's.
        traces = [str(t["trace"]).split("-")[0] for t in ours]
        assert len(set(traces)) == len(traces), side
        unmonitored = [t for t in ours if "sentry-monitor-slug" not in t]
        assert len(unmonitored) >= len(UNMONITORED)  # sent, without a monitor
        # ... "fast" (a plain interval under a minute) beat after beat.
        assert sum(t["task"] == "sentry_app.plain" for t in unmonitored) >= BEATS - 1, side
        # (sentry-sdk's apply_async stamps every task's start time when monitoring is on)
        assert all(t.keys() & HEADERS == {"sentry-monitor-start-timestamp-s"} for t in unmonitored)
        sides_seen[side] = seen
    # Check-in by check-in (beat i of an entry on one side against beat i on the other):
    # the check-ins and the headers, key by key.
    assert sides_seen["emq-beat"] == sides_seen["celery-beat"]

    # An entry Sentry Crons cannot monitor is logged once, not at each of its beats.
    log = (tmp_path / "emq-beat.log").read_text(errors="replace")
    assert log.count("Sentry Crons cannot monitor 'fast'") == 1

    # emq-bridge's check-in id is the occurrence id: a re-send after a crash reopens it.
    for task in tasks:
        if task["emq_schedule"] is not None and "sentry-monitor-check-in-id" in task:
            assert task["sentry-monitor-check-in-id"] == uuid.UUID(task["id"]).hex
