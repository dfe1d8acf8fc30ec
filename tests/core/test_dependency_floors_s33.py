"""What the declared dependency floors rest on (found by a probe that installed the lowest
version each range of pyproject.toml allows, session 33).

The floors were raised to versions the features need (pyproject.toml). Beside that, URL
query options that only a newer redis-py reads from a URL passed emq-bridge's checks with an
older one, then failed with a raw `TypeError` at the first command: with such a redis-py
they are now unknown options, named with the version that reads them.
"""

from __future__ import annotations

import pytest

from emq_bridge import ConfigError
from emq_bridge import urls as urls_module
from emq_bridge.urls import client_from_url


@pytest.mark.parametrize(
    ("option", "since"),
    [
        ("legacy_responses=true", "8.0"),
        ("socket_read_size=65536", "8.0"),
    ],
)
def test_an_option_an_older_redis_py_cannot_read_is_refused_naming_the_version(
    monkeypatch: pytest.MonkeyPatch, option: str, since: str
) -> None:
    monkeypatch.setattr(urls_module, "_REDIS_PY", (7, 1))
    with pytest.raises(ConfigError, match=rf"unknown query option '.*' from redis-py {since} on"):
        client_from_url(f"redis://127.0.0.1:6399/0?{option}")


def test_tls_verify_flags_need_redis_py_7(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(urls_module, "_REDIS_PY", (6, 4))
    with pytest.raises(ConfigError, match=r"from redis-py 7\.0 on"):
        client_from_url("rediss://127.0.0.1:6399/0?ssl_include_verify_flags=VERIFY_X509_STRICT")


def test_the_installed_redis_py_takes_them() -> None:
    client = client_from_url(
        "redis://127.0.0.1:6399/0?legacy_responses=true&socket_read_size=65536"
    )
    client.close()  # built, not connected: nothing listens on 6399


def test_the_readme_names_the_floors_pyproject_declares() -> None:
    import re
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    floors = {
        re.split(r"[\[>=]", spec, maxsplit=1)[0]: spec.rsplit(">=", 1)[1]
        for spec in [*project["dependencies"], *project["optional-dependencies"]["celery"]]
        + project["optional-dependencies"]["dramatiq"]
    }
    assert (floors["celery"], floors["dramatiq"], floors["redis"]) == ("5.7", "2.0", "6.4")
    readme = " ".join((root / "README.md").read_text().split())
    assert "Celery 5.7 or later, Dramatiq 2 or later, redis-py 6.4 or later" in readme
    for name, floor in floors.items():  # what the suite runs on meets them
        installed = tuple(int(p) for p in re.findall(r"\d+", version(name))[:2])
        assert installed >= tuple(int(p) for p in floor.split(".")[:2]), name


def test_the_sentry_floor_has_the_api_the_beats_check_ins_use() -> None:
    # Session 35 (a probe of the built wheel): the floor was sentry-sdk 2.0, and with 2.0 to
    # 2.11 (no `sentry_sdk.get_isolation_scope`) every dispatch of a monitoring beat raised.
    import tomllib
    from pathlib import Path

    import sentry_sdk

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["sentry"] == ["sentry-sdk>=2.12"]
    assert callable(sentry_sdk.get_isolation_scope)
    build = tomllib.loads((root / "pyproject.toml").read_text())["build-system"]
    assert build["requires"] == ["setuptools>=77"]  # the first to read `license = "MIT"`
