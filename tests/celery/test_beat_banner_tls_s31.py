"""The beat's banner and logs name the registry as its client connects: `rediss://` when
`broker_use_ssl` (or `emq_bridge_redis_use_ssl`) makes a `redis://` URL speak TLS, as
Celery's Redis transport does (session 30 left the banner saying `redis://`); and a broker
URL the registry cannot default to says what to set."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from emq_bridge.celery import RepeatScheduler
from emq_bridge.celery.declare import registry_url, shown_registry_url
from emq_bridge.errors import ConfigError


def app_with(broker: str, **conf: Any) -> Celery:
    app = Celery("banner-s31", broker=broker, set_as_current=False)
    app.conf.update(result_backend=None, **conf)
    return app


def banner(app: Celery) -> str:
    scheduler = RepeatScheduler.__new__(RepeatScheduler)  # `info` reads the app only
    scheduler.app = app
    return scheduler.info


def test_broker_use_ssl_shows_rediss() -> None:
    app = app_with("redis://:s3cret@127.0.0.1:6380/0", broker_use_ssl={"ssl_cert_reqs": "none"})
    assert shown_registry_url(app) == "rediss://:***@127.0.0.1:6380/0"
    assert "registry -> rediss://:***@127.0.0.1:6380/0 " in banner(app)


def test_the_registrys_own_tls_setting_shows_rediss() -> None:
    app = app_with(
        "amqp://guest@127.0.0.1//",
        emq_bridge_redis_url="redis://127.0.0.1:6381/2",
        emq_bridge_redis_use_ssl=True,
    )
    assert shown_registry_url(app) == "rediss://127.0.0.1:6381/2"


def test_no_tls_setting_shows_the_url_as_given() -> None:
    app = app_with("redis://127.0.0.1:6380/0")
    assert shown_registry_url(app) == "redis://127.0.0.1:6380/0"
    assert "registry -> redis://127.0.0.1:6380/0 " in banner(app)


def test_a_broker_tls_setting_on_a_registry_of_its_own_changes_nothing() -> None:
    app = app_with(
        "rediss://127.0.0.1:6380/0",
        broker_use_ssl=True,
        emq_bridge_redis_url="redis://127.0.0.1:6381/0",
    )
    assert shown_registry_url(app) == "redis://127.0.0.1:6381/0"


def test_a_sentinel_broker_says_how_to_name_the_registry() -> None:
    """A `sentinel://` broker is Redis, but its master is named in the transport options:
    the refusal says which URL to set, not that the broker is not Redis (session 31)."""
    app = app_with("sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380")
    with pytest.raises(ConfigError, match=r"redis\+sentinel://host:26379/MASTER_NAME/0"):
        registry_url(app)
