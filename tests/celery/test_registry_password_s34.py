"""`emq_bridge_redis_password` keeps the registry's password out of `emq_bridge_redis_url`,
where `celery report`, `celery inspect conf` and Flower showed it in clear (found by a probe of
secrets, session 34): Celery hides a setting by its name (API, TOKEN, KEY, SECRET, PASS...),
and the broker's and the backend's URLs, not `emq_bridge_redis_url`. Real server with a
password; Celery's own masking (`conf.humanize(censored=True)`, what `celery report` prints)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from emq_bridge.celery.declare import repeat_for
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.errors import ConfigError

PASSWORD = "S3cr3t/pw@x"


@pytest.fixture(scope="module")
def guarded() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as server:
        redis.Redis.from_url(server.url).config_set("requirepass", PASSWORD)
        yield server


def test_the_password_setting_connects_and_celery_masks_it(guarded: EmbeddedServer) -> None:
    app = Celery("pw", broker="memory://")
    app.conf.emq_bridge_redis_url = guarded.url  # no password in it
    app.conf.emq_bridge_redis_password = PASSWORD
    with repeat_for(app) as repeat:
        assert repeat.server_time_ms() > 0
    report = app.conf.humanize(with_defaults=False, censored=True)
    assert "emq_bridge_redis_password: '********'" in report
    assert PASSWORD not in report

    app.conf.emq_bridge_redis_url = guarded.url.replace("://", "://:pw@")  # a second one
    with pytest.raises(ConfigError, match="holds a password too"):
        repeat_for(app)
    app.conf.emq_bridge_redis_url = guarded.url + "?password=pw"
    with pytest.raises(ConfigError, match="holds a password too"):
        repeat_for(app)
    app.conf.emq_bridge_redis_url = guarded.url
    for bad in ("", 42):
        app.conf.emq_bridge_redis_password = bad
        with pytest.raises(ConfigError, match="must be a non-empty string"):
            repeat_for(app)
