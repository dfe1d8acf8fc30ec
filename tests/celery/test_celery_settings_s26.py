"""Celery settings as Django projects give them, and the one-line refusals the guide
promises (found by a probe, session 26):

* a boolean setting read from the environment is a string: `"false"` read as true (`bool`
  of it) turned the opt-in fast path on and kept the task check on;
* a beat with `emq_bridge_pipelined` on a broker the fast path cannot send on synced its
  schedules, then died with Celery's traceback, where it should refuse before writing;
* `emq-bridge pump --celery` for an app that names no Redis (a RabbitMQ broker, the URL
  setting misspelt) pumped the command's default server under the prefix `emq`;
* an app whose task modules raise (a Django project's settings or tasks) gave a traceback.

Real servers: the registry is the test Redis; the RabbitMQ broker URL is never connected to
(nothing is sent).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from processes import run_app_cli

from emq_bridge import Repeat
from emq_bridge.celery import BeatRefused, RepeatScheduler, app_schedule
from emq_bridge.celery.declare import flag_setting
from emq_bridge.errors import ConfigError

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def app_with(**conf: Any) -> Celery:
    app = Celery("settings-s26", broker=AMQP, set_as_current=False)
    app.conf.update(result_backend=None, **conf)
    return app


@pytest.mark.parametrize(
    ("given", "read"),
    [
        (True, True),
        (False, False),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("off", False),
        ("true", True),
        (" Yes ", True),
        ("1", True),
        (0, False),
        (1, True),
        (None, True),
    ],
)
def test_a_boolean_setting_reads_the_strings_of_the_environment(given: Any, read: bool) -> None:
    assert (
        flag_setting(app_with(emq_bridge_check_tasks=given), "emq_bridge_check_tasks", True) is read
    )


@pytest.mark.parametrize("given", ["maybe", "", 2, 1.5, []])
def test_any_other_value_of_a_boolean_setting_is_refused_naming_it(given: Any) -> None:
    with pytest.raises(ConfigError, match=r"^emq_bridge_pipelined must be True or False"):
        flag_setting(app_with(emq_bridge_pipelined=given), "emq_bridge_pipelined", False)


def test_check_tasks_false_as_a_string_lets_an_unknown_task_through(redis_url: str) -> None:
    app = app_with(
        emq_bridge_redis_url=redis_url,
        emq_bridge_check_tasks="false",
        beat_schedule={"tick": {"task": "elsewhere.tick", "schedule": 60.0}},
    )
    assert [d.name for d in app_schedule(app).declarations if d.name == "tick"] == ["tick"]


def test_a_pipelined_beat_on_a_broker_it_cannot_send_on_refuses_before_writing(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    app = app_with(
        emq_bridge_redis_url=redis_url,
        emq_bridge_prefix=prefix,
        emq_bridge_pipelined="True",
        beat_schedule={"tick": {"task": "celery.backend_cleanup", "schedule": 60.0}},
    )
    with pytest.raises(BeatRefused) as refused:
        RepeatScheduler(app)
    assert isinstance(refused.value.error, ConfigError)
    assert list(repeat.client.scan_iter(match=f"{prefix}:*")) == []  # nothing written


APP = """
from celery import Celery

app = Celery("s26app", broker="amqp://guest:guest@127.0.0.1:5672//")
app.conf.update(
    result_backend=None,
    emq_bridge_prefix={prefix!r},
    emq_bridge_redis_ur="redis://typo",  # misspelt: the app names no registry
    beat_schedule={{"tick": {{"task": "celery.backend_cleanup", "schedule": 60.0}}}},
    imports={imports!r},
)
"""


def _pump(tmp_path: Path, prefix: str, *args: str, imports: tuple[str, ...] = ()) -> Any:
    (tmp_path / "s26app.py").write_text(textwrap.dedent(APP.format(prefix=prefix, imports=imports)))
    (tmp_path / "s26broken.py").write_text("raise RuntimeError('settings are not configured')\n")
    return run_app_cli(tmp_path, *args, "pump", "--celery", "s26app", "--once")


def test_the_pump_of_an_app_naming_no_registry_refuses_to_guess_one(
    tmp_path: Path, prefix: str
) -> None:
    done = _pump(tmp_path, prefix)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "emq_bridge_redis_url" in line and "--redis-url" in line


def test_given_a_server_the_pump_uses_it_under_the_apps_prefix(
    tmp_path: Path, prefix: str, redis_url: str, repeat: Repeat
) -> None:
    done = _pump(tmp_path, prefix, "--redis-url", redis_url)
    assert done.returncode == 0, done.stderr
    assert repeat.get("celery", "tick") is not None  # under the app's prefix, not `emq`


def test_an_app_whose_task_modules_raise_is_one_line(tmp_path: Path, prefix: str) -> None:
    done = _pump(tmp_path, prefix, imports=("s26broken",))
    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()
    assert "cannot load the Celery app 's26app'" in line and "RuntimeError" in line


BAD_RECURRING = """
from celery import Celery
from emq_bridge.celery import recurring

app = Celery("s26bad", broker="redis://127.0.0.1:1/0")


@recurring(cron="61 25 * * *")
@app.task
def refresh():
    return None
"""


def test_a_bad_recurring_is_one_line_naming_where_it_is_declared(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "s26bad.py").write_text(BAD_RECURRING)
    done = run_app_cli(tmp_path, "--redis-url", redis_url, "pump", "--celery", "s26bad", "--once")
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "invalid cron '61 25 * * *'" in line and line.endswith("(at s26bad.py:8)"), line


def test_a_bad_flag_of_a_namespaced_app_names_the_setting_as_its_settings_module_does() -> None:
    # Session 33 (a probe of a Django project): `CELERY_EMQ_BRIDGE_CHECK_TASKS = "maybe"` was
    # refused as `emq_bridge_check_tasks must be True or False`, a name the project does not
    # have, and "True or False" when the strings "false" and "0" are taken too.
    class Settings:
        CELERY_EMQ_BRIDGE_CHECK_TASKS = "maybe"

    app = Celery("s33ns")
    app.config_from_object(Settings, namespace="CELERY")
    with pytest.raises(ConfigError) as refused:
        flag_setting(app, "emq_bridge_check_tasks", True)
    message = str(refused.value)
    assert message.startswith(
        "emq_bridge_check_tasks (CELERY_EMQ_BRIDGE_CHECK_TASKS in the settings) must be"
    )
    assert "true/false" in message and "'maybe'" in message
