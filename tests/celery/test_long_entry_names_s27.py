"""An error about a `beat_schedule` entry (or a celery-redbeat entry, converted the same way)
names its key clipped: a 100,000-character key gave a 100 KB error line (session 27's probe,
through `emq-bridge import redbeat`)."""

from __future__ import annotations

import pytest
from celery import Celery

from emq_bridge.celery import app_schedule
from emq_bridge.errors import ConfigError


def test_an_error_names_a_long_key_clipped() -> None:
    app = Celery("long", set_as_current=False)
    key = "k" * 100_000 + " "  # not a name as it is: converted, then refused as too long
    app.conf.update(
        beat_schedule={key: {"task": "proj.run", "schedule": 60.0}}, emq_bridge_check_tasks=False
    )
    with pytest.raises(ConfigError) as caught:
        app_schedule(app)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message[:500]
    assert message.startswith("beat_schedule['kkkk") and "(100001 characters)" in message


def test_a_key_that_is_no_string_is_named_by_its_type() -> None:
    app = Celery("typed", set_as_current=False)
    app.conf.update(
        beat_schedule={None: {"task": "proj.run", "schedule": 60.0}}, emq_bridge_check_tasks=False
    )
    with pytest.raises(ConfigError, match=r"^beat_schedule keys must be non-empty strings, got"):
        app_schedule(app)
