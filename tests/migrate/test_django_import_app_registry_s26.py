"""`manage.py emq_import` imports into the project's Celery app's registry when no
`--redis-url`/`--prefix` is given (found by a probe, session 26).

It required `--redis-url` and wrote under the prefix `emq` whatever the app's
`emq_bridge_prefix` (`CELERY_EMQ_BRIDGE_PREFIX` in Django's settings): the app's beat and
pumps, on their own prefix, never fired what was imported. A real Django project on SQLite,
its Celery app configured from Django's settings as Celery's Django guide does, in a
subprocess of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from emq_bridge import Repeat

SETTINGS = """
SECRET_KEY = "x"
INSTALLED_APPS = ["django_celery_beat", "emq_bridge.celery.importers.django"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {db!r}}}}}
USE_TZ = True
TIME_ZONE = "UTC"
CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
CELERY_EMQ_BRIDGE_REDIS_URL = {url!r}
CELERY_EMQ_BRIDGE_PREFIX = {prefix!r}
"""

CELERY = """
from celery import Celery

app = Celery("djproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
"""

SEED = """
import django

django.setup()
from django_celery_beat.models import IntervalSchedule, PeriodicTask

every = IntervalSchedule.objects.create(every=10, period="minutes")
PeriodicTask.objects.create(name="refresh", task="djproj.refresh", interval=every)
"""


def write_project(tmp_path: Path, redis_url: str, prefix: str) -> None:
    """A Django project `djproj` in `tmp_path` whose Celery app names the registry
    (`redis_url`, `prefix`) in Django's settings, and a `seed.py` making one periodic task."""
    package = tmp_path / "djproj"
    package.mkdir()
    (package / "__init__.py").write_text("from .celery import app as celery_app\n")
    (package / "celery.py").write_text(CELERY)
    settings = SETTINGS.format(db=str(tmp_path / "db.sqlite3"), url=redis_url, prefix=prefix)
    (package / "settings.py").write_text(textwrap.dedent(settings))
    (tmp_path / "seed.py").write_text(SEED)


def python_in(tmp_path: Path, **extra_env: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run Python in the project `tmp_path` (its settings named, $REDIS_URL unset)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "djproj.settings",
        "PYTHONPATH": str(tmp_path),
        **extra_env,
    }
    env.pop("REDIS_URL", None)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def test_without_url_or_prefix_it_imports_into_the_apps_registry(
    tmp_path: Path, repeat: Repeat, redis_url: str
) -> None:
    write_project(tmp_path, redis_url, repeat.prefix)
    run = python_in(tmp_path)
    assert run("-m", "django", "migrate", "--verbosity=0").returncode == 0
    assert run("seed.py").returncode == 0
    done = run("-m", "django", "emq_import")
    assert done.returncode == 0, done.stderr
    assert f"(prefix {repeat.prefix!r})" in done.stderr.splitlines()[0]
    assert "1 created" in done.stderr
    imported = repeat.get("celery", "refresh")
    assert imported is not None and imported.definition.template["task"] == "djproj.refresh"


def test_the_cli_from_the_project_directory_imports_into_the_apps_registry_too(
    tmp_path: Path, repeat: Repeat, redis_url: str
) -> None:
    # Session 33 (a probe of a Django project's switch): `DJANGO_SETTINGS_MODULE=proj.settings
    # emq-bridge import django-celery-beat`, run from the project's directory as its help
    # shows, died with a raw `ModuleNotFoundError` (the console script does not put the
    # directory on sys.path, as `manage.py` and `celery -A` do); given PYTHONPATH, it wrote
    # into $REDIS_URL or 127.0.0.1:6379 under `emq`, where the app's beat never looks.
    write_project(tmp_path, redis_url, repeat.prefix)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "djproj.settings"}
    env.pop("REDIS_URL", None)
    env.pop("PYTHONPATH", None)
    cli = str(Path(sys.executable).with_name("emq-bridge"))

    def run(*argv: str, where: Path = tmp_path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=env, cwd=where, capture_output=True, text=True, timeout=120
        )

    assert run(sys.executable, "-m", "django", "migrate", "--verbosity=0").returncode == 0
    assert run(sys.executable, "seed.py").returncode == 0
    done = run(cli, "import", "django-celery-beat")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0].startswith("registry: ")
    assert f"(prefix {repeat.prefix!r})" in done.stderr.splitlines()[0]
    assert "1 created" in done.stderr
    imported = repeat.get("celery", "refresh")
    assert imported is not None and imported.definition.template["task"] == "djproj.refresh"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lost = run(cli, "import", "django-celery-beat", where=elsewhere)
    assert lost.returncode == 1 and "Traceback" not in lost.stderr
    assert "DJANGO_SETTINGS_MODULE='djproj.settings' cannot be imported" in lost.stderr
    assert len(lost.stderr.strip().splitlines()) == 1


def test_a_project_whose_package_does_not_load_its_celery_app_is_told_so_and_nothing_written(
    tmp_path: Path, repeat: Repeat, redis_url: str
) -> None:
    # Session 35 (a probe of a Django project's switch): with `proj/__init__.py` not
    # importing the app (Celery's guide has it import `celery_app`), `current_app` was
    # Celery's fallback app: the import said the broker was no Redis (it was), or, with
    # CELERY_BROKER_URL in the environment as in a container, imported under the prefix
    # `emq`, where the project's beat never looks. A misplaced setting is named too.
    write_project(tmp_path, redis_url, repeat.prefix)
    (tmp_path / "djproj" / "__init__.py").write_text("")
    run = python_in(tmp_path, CELERY_BROKER_URL=redis_url)
    assert run("-m", "django", "migrate", "--verbosity=0").returncode == 0
    assert run("seed.py").returncode == 0
    client = repeat.client
    before = sorted(client.scan_iter("emq:*"))
    done = run("-m", "django", "emq_import")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "CommandError: the project has no Celery app loaded, so its registry is unknown: does "
        "djproj/__init__.py import it (from .celery import app as celery_app, as Celery's "
        "'First steps with Django' has it)? Or give --redis-url (and --prefix)"
    ]
    assert sorted(client.scan_iter("emq:*")) == before
    assert repeat.get("celery", "refresh") is None

    # The app loaded, a setting outside its namespace: named, and the import goes on.
    (tmp_path / "djproj" / "__init__.py").write_text("from .celery import app as celery_app\n")
    with (tmp_path / "djproj" / "settings.py").open("a") as settings:
        settings.write("EMQ_BRIDGE_PREFIX = 'misplaced'\n")
    done = run("-m", "django", "emq_import")
    assert done.returncode == 0, done.stderr
    assert (
        "emq-bridge: EMQ_BRIDGE_PREFIX is not read: this app reads emq_bridge_prefix "
        "(CELERY_EMQ_BRIDGE_PREFIX in the settings), which is set as well (that one applies)"
    ) in done.stderr.splitlines()
    assert repeat.get("celery", "refresh") is not None
