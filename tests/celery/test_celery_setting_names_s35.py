"""emq-bridge's Celery settings as a Django project writes them (found by a probe of a Django
project's switch, session 35).

Before: a setting misspelt (`CELERY_EMQ_BRIDGE_PREFX`) or outside the namespace the app
reads (`EMQ_BRIDGE_PREFIX` beside `namespace="CELERY"`) was silently ignored, the default
applied (the beat pumped another prefix); most errors named the `app.conf` spelling a Django
project never writes (`set app.conf.emq_bridge_redis_url = ...`); and numbers read from the
environment (`os.environ.get("HB", "10")`) were refused, which turned a worker's reports off.
"""

from __future__ import annotations

import logging
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from emq_bridge import ConfigError
from emq_bridge.celery import registry_url
from emq_bridge.celery.declare import app_schedule
from emq_bridge.celery.reporting import history_size_setting, reporter_for
from emq_bridge.celery.setting_names import unread_settings, warn_unread_settings


@pytest.fixture
def django_app(prefix: str) -> Iterator[Any]:
    """Build an app configured as Celery's Django guide does: `config_from_object` of a
    settings module, under `namespace="CELERY"`."""
    apps: list[tuple[Celery, str]] = []

    def build(**settings: Any) -> Celery:
        module = types.ModuleType(f"{prefix}_settings_{len(apps)}")
        module.__dict__.update(settings)
        sys.modules[module.__name__] = module
        app = Celery(f"proj{len(apps)}", set_as_current=False)
        app.config_from_object(module.__name__, namespace="CELERY")
        apps.append((app, module.__name__))
        return app

    yield build
    for app, module in apps:
        sys.modules.pop(module, None)
        app.close()


def test_a_misspelt_or_misplaced_setting_is_named_with_what_is_read(django_app: Any) -> None:
    app = django_app(
        CELERY_BROKER_URL="redis://127.0.0.1:1/0",
        CELERY_EMQ_BRIDGE_PREFIX="dj",
        CELERY_EMQ_BRIDGE_PREFX="typo",
        EMQ_BRIDGE_REDIS_URL="redis://127.0.0.1:2/0",
        EMQ_BRIDGE_SOURCE="misplaced",
        CELERY_EMQ_BRIDGE_SOURCE="read",
        CELERY_EMQ_BRIDGE_REPORT=False,
    )
    assert sorted(unread_settings(app)) == [
        "CELERY_EMQ_BRIDGE_PREFX is not a setting of emq-bridge's, and is ignored (did you "
        "mean emq_bridge_prefix (CELERY_EMQ_BRIDGE_PREFIX in the settings)?)",
        "EMQ_BRIDGE_REDIS_URL is not read: this app reads emq_bridge_redis_url "
        "(CELERY_EMQ_BRIDGE_REDIS_URL in the settings), which is not set",
        "EMQ_BRIDGE_SOURCE is not read: this app reads emq_bridge_source "
        "(CELERY_EMQ_BRIDGE_SOURCE in the settings), which is set as well (that one applies)",
    ]


def test_a_plain_app_is_told_of_a_misspelling_and_a_right_one_of_nothing(prefix: str) -> None:
    app = Celery("plain", set_as_current=False)
    app.conf.update(emq_bridge_prefix=prefix, emq_bridge_heartbeat=5, emq_bridge_report=True)
    assert unread_settings(app) == [
        "emq_bridge_heartbeat is not a setting of emq-bridge's, and is ignored "
        "(did you mean emq_bridge_heartbeat_s?)"
    ]
    del app.conf["emq_bridge_heartbeat"]
    assert unread_settings(app) == []


def test_the_warnings_are_logged_once_per_app_when_the_registry_is_first_named(
    django_app: Any, redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = django_app(
        CELERY_EMQ_BRIDGE_REDIS_URL=redis_url,
        CELERY_EMQ_BRIDGE_PREFIX=prefix,
        EMQ_BRIDGE_PREFIX="elsewhere",
    )
    with caplog.at_level(logging.WARNING, logger="emq_bridge.celery"):
        app_schedule(app)  # the beat's conversion: the registry is not needed yet
        warn_unread_settings(app)
        warn_unread_settings(app)
    lines = [r.getMessage() for r in caplog.records if "is not read" in r.getMessage()]
    assert lines == [
        "emq-bridge: EMQ_BRIDGE_PREFIX is not read: this app reads emq_bridge_prefix "
        "(CELERY_EMQ_BRIDGE_PREFIX in the settings), which is set as well (that one applies)"
    ]


def test_errors_name_the_setting_as_the_settings_module_spells_it(django_app: Any) -> None:
    app = django_app(CELERY_BROKER_URL="amqp://guest@127.0.0.1:5672//")
    with pytest.raises(ConfigError) as raised:
        registry_url(app)
    assert "set CELERY_EMQ_BRIDGE_REDIS_URL = 'redis://host:6379/0' in the settings" in str(
        raised.value
    )
    plain = Celery("plain", broker="amqp://guest@127.0.0.1:5672//", set_as_current=False)
    with pytest.raises(ConfigError, match=r"set app\.conf\.emq_bridge_redis_url = 'redis://"):
        registry_url(plain)

    queues = django_app(CELERY_EMQ_BRIDGE_QUEUES="q2")
    with pytest.raises(
        ConfigError,
        match=r"^emq_bridge_queues \(CELERY_EMQ_BRIDGE_QUEUES in the settings\) must be a list",
    ):
        app_schedule(queues)
    size = django_app(CELERY_EMQ_BRIDGE_HISTORY_SIZE="many")
    with pytest.raises(
        ConfigError,
        match=r"^emq_bridge_history_size \(CELERY_EMQ_BRIDGE_HISTORY_SIZE in the settings\) "
        r"must be a whole number, got 'many'$",
    ):
        history_size_setting(size)


@pytest.mark.parametrize("heartbeat", ["ten", "inf", "nan", "-1", "0", float("inf")])
def test_a_heartbeat_that_is_no_positive_number_turns_reports_off_naming_the_setting(
    django_app: Any, redis_url: str, caplog: pytest.LogCaptureFixture, heartbeat: Any
) -> None:
    app = django_app(CELERY_EMQ_BRIDGE_REDIS_URL=redis_url, CELERY_EMQ_BRIDGE_HEARTBEAT_S=heartbeat)
    with caplog.at_level(logging.ERROR, logger="emq_bridge.celery"):
        assert reporter_for(app) is None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert (
        "emq_bridge_heartbeat_s (CELERY_EMQ_BRIDGE_HEARTBEAT_S in the settings) must be a "
        "positive number of seconds, got " in errors[0]
    )


def test_numbers_read_from_the_environment_are_numbers(
    django_app: Any, redis_url: str, prefix: str
) -> None:
    app = django_app(
        CELERY_EMQ_BRIDGE_REDIS_URL=redis_url,
        CELERY_EMQ_BRIDGE_PREFIX=prefix,
        CELERY_EMQ_BRIDGE_HEARTBEAT_S=" 2.5 ",
        CELERY_EMQ_BRIDGE_HISTORY_SIZE="20",
        CELERY_EMQ_BRIDGE_GENERATION="1765100000",
    )
    reporter = reporter_for(app)
    assert reporter is not None
    try:
        assert reporter.heartbeat_s == 2.5 and reporter.history_size == 20
    finally:
        reporter.close(1.0)
    assert app_schedule(app).generation == 1_765_100_000
    # Digits of another script are no number from the environment: refused, named.
    other = django_app(CELERY_EMQ_BRIDGE_GENERATION="١٢")
    with pytest.raises(ConfigError, match=r"^emq_bridge_generation \(CELERY_EMQ_BRIDGE_GENER"):
        app_schedule(other)


def test_keys_that_only_look_like_ours_are_left_alone(django_app: Any) -> None:
    # Session 35 (a review): `EMQ_BRIDGE_WEB_TOKEN` (what `emq-bridge web` reads) and a
    # project's own `MYAPP_EMQ_BRIDGE_REPORT_EMAIL` were called misspelt settings.
    app = django_app(
        EMQ_BRIDGE_WEB_TOKEN="x" * 20,
        MYAPP_EMQ_BRIDGE_REPORT_EMAIL="ops@example.com",
        EMQ_BRIDGE_SCREENSHOTS=True,
        CELERY_EMQ_BRIDGE_PREFIX="dj",
    )
    assert unread_settings(app) == []


def test_the_settings_spelling_overridden_in_app_conf_is_said_so(django_app: Any) -> None:
    app = django_app(CELERY_EMQ_BRIDGE_PREFIX="x")
    app.conf.update(emq_bridge_prefix="y")
    assert unread_settings(app) == [
        "CELERY_EMQ_BRIDGE_PREFIX does not apply: this app's emq_bridge_prefix is set "
        "elsewhere too (app.conf.update, add_defaults), and that one applies"
    ]


@pytest.mark.parametrize(
    ("setting", "text", "said"),
    [
        ("CELERY_EMQ_BRIDGE_GENERATION", "1_2_3", "generation must be a whole number, got '1_2_3'"),
        ("CELERY_EMQ_BRIDGE_GENERATION", "20261207.1", "got '20261207.1'"),
        ("CELERY_EMQ_BRIDGE_HISTORY_SIZE", "1e3", "must be a whole number, got '1e3'"),
    ],
)
def test_only_plain_decimal_text_is_a_number(
    django_app: Any, setting: str, text: str, said: str
) -> None:
    app = django_app(**{setting: text})
    with pytest.raises(ConfigError, match=re.escape(said)):
        if setting.endswith("GENERATION"):
            app_schedule(app)
        else:
            history_size_setting(app)


def test_a_password_in_the_registry_url_is_warned_of_once(
    redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Session 35 (a probe of Celery's tooling): `celery report`, `inspect conf` and Flower
    # show `emq_bridge_redis_url` in clear; nothing said so when it held a password.
    app = Celery("pw", set_as_current=False)
    app.conf.update(
        emq_bridge_redis_url=redis_url.replace("://", "://:s3cret-pw@"), emq_bridge_prefix=prefix
    )
    with caplog.at_level(logging.WARNING, logger="emq_bridge.celery"):
        warn_unread_settings(app)
        warn_unread_settings(app)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "emq-bridge: emq_bridge_redis_url holds a password, which celery report, celery "
        "inspect conf and Flower show in clear: give it in emq_bridge_redis_password instead "
        "(masked)"
    ]
    assert "s3cret-pw" not in lines[0]
