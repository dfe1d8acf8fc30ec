"""Set Django up outside a project, on one database URL, to read django-celery-beat's tables.

`emq-bridge import django-celery-beat --database-url URL` uses it: `postgresql://user:pw@host:5432/db`
(psycopg), `mysql://...` (mysqlclient) or `sqlite:///path/to/db.sqlite3`.

PostgreSQL stores instants; SQLite and MySQL store wall times without a zone: UTC from a
project with `USE_TZ = True`, its `TIME_ZONE` from one with `USE_TZ = False`. Nothing in the
database tells which: `--stored-timezone` names it (default UTC, as Django reads them by
default). `--timezone` stays the app's (what zone-less crontabs follow).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

from ....errors import ConfigError

__all__ = ["database_settings", "setup"]

# Backends whose datetime columns have no time zone (Django's `supports_timezones` False).
_ZONELESS = {"django.db.backends.mysql", "django.db.backends.sqlite3"}

_ENGINES = {
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "pgsql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
    "sqlite": "django.db.backends.sqlite3",
}


def database_settings(url: str) -> dict[str, Any]:
    """Return Django's `DATABASES["default"]` for `url`; `ConfigError` if it is not one."""
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is not a number raises here, not at connect
    except ValueError:  # not its text: it quotes what it took for the port, a password's piece
        raise ConfigError(
            "--database-url is not a valid URL: its host or port cannot be read (escape the "
            "password's special characters as %XX)"
        ) from None
    engine = _ENGINES.get(parts.scheme)
    if engine is None:
        raise ConfigError(
            f"--database-url: unknown scheme {parts.scheme!r}; use postgresql://, mysql:// "
            "or sqlite:///path"
        )
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        name = path[1:]  # sqlite:///relative.db, sqlite:////absolute.db (dj-database-url's)
        if not name:
            raise ConfigError("--database-url: sqlite:///path names no database file")
        if not os.path.isfile(name):  # SQLite would create it, empty, even for a dry run
            raise ConfigError(f"--database-url: no SQLite database file {name!r}")
        return {"ENGINE": engine, "NAME": name}
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ConfigError("--database-url names no database (…/dbname)")
    return {
        "ENGINE": engine,
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(port or ""),
    }


def setup(url: str, timezone: str = "UTC", stored_timezone: str = "UTC") -> None:
    """Configure Django on `url` with django-celery-beat installed, and set it up.

    `timezone` is the app's (Django's `TIME_ZONE`: what zone-less crontabs follow).
    `stored_timezone` is the zone a SQLite or MySQL database's datetimes are in: UTC if the
    project's `USE_TZ` is True, else its `TIME_ZONE` (it becomes Django's per-database
    `TIME_ZONE`, so Django reads them in it). PostgreSQL's are instants: it changes nothing
    there.
    """
    database = database_settings(url)
    if database["ENGINE"] in _ZONELESS:
        database["TIME_ZONE"] = stored_timezone
    try:
        import django  # type: ignore[import-untyped]
        from django.conf import settings  # type: ignore[import-untyped]
        from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ConfigError(
            "importing from django-celery-beat needs Django and django-celery-beat installed"
        ) from exc
    if not settings.configured:
        settings.configure(
            DATABASES={"default": database},
            INSTALLED_APPS=["django_celery_beat"],
            USE_TZ=True,
            TIME_ZONE=timezone,
        )
    try:
        django.setup()
    except ImportError as exc:
        raise ConfigError(
            f"importing from django-celery-beat needs it installed ({exc}): "
            "pip install django-celery-beat"
        ) from exc
    except ImproperlyConfigured as exc:  # the database's driver missing (mysqlclient)
        raise ConfigError(f"--database-url: {' '.join(str(exc).split())}") from None
