"""Crontabs in Celery's local time (`enable_utc = False`, no `timezone`) take the host's IANA
zone; a `$TZ` that is no IANA name (a POSIX rule, a typo), which libc and so Celery's own beat
follow, is refused in one line. Before (session 27's probe), the conversion asked Celery's
`LocalTimezone` (its zone when tzlocal finds no IANA one) for its offset at None and died in
an AttributeError traceback; past that, `/etc/localtime` would have been taken silently,
another zone than Celery's. Each case runs in a process of its own: Celery reads the host's
zone once per process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CONVERT = """
from celery import Celery
from celery.schedules import crontab
from emq_bridge.celery import app_schedule
from emq_bridge.errors import ConfigError

app = Celery("local", set_as_current=False)
app.conf.update(
    enable_utc=False,
    emq_bridge_check_tasks=False,
    beat_schedule={"nine": {"task": "proj.run", "schedule": crontab(minute=0, hour=9)}},
)
print(type(app.timezone).__name__)
try:
    [declaration] = [d for d in app_schedule(app).entries if d.name == "nine"]
except ConfigError as exc:
    print("refused:", exc)
else:
    print("zone:", declaration.definition.cadence.tz)
"""


def convert_with(tz: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CONVERT],
        env={**os.environ, "TZ": tz},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout.splitlines()


def test_an_iana_tz_is_the_zone_of_a_local_crontab() -> None:
    assert convert_with("Europe/Berlin")[-1] == "zone: Europe/Berlin"


@pytest.mark.parametrize("tz", ["CET-1CEST,M3.5.0,M10.5.0/3", "America/Nwe_York"])
def test_a_tz_that_is_no_iana_name_is_refused_in_one_line(tz: str) -> None:
    kind, outcome = convert_with(tz)
    assert kind == "LocalTimezone"  # Celery's own beat would run in libc's local time
    assert outcome.startswith("refused: beat_schedule['nine']: ")
    assert f"the host's time zone TZ={tz!r} is not an IANA name" in outcome
    assert "app.conf.timezone" in outcome
