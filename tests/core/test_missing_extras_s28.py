"""The library APIs of the `[web]` and `[metrics]` extras name the extra to install when it
is missing, as `emq_bridge.celery` and `emq_bridge.dramatiq` do.

Before: `from emq_bridge.web import app` failed with `No module named 'jinja2'`, and
`emq_bridge.metrics` imported fine without prometheus_client, so `MetricsEvents()` was made
and the pump's first tick logged a listener traceback, every later metric silently missing.
Each case runs in a fresh interpreter whose import system refuses the extra's packages."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCK = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
        return None
sys.meta_path.insert(0, Refuse())
try:
    import {module}
except ImportError as exc:
    print(exc)
else:
    print("imported")
"""


@pytest.mark.parametrize(
    ("module", "blocked", "said"),
    [
        ("emq_bridge.web", {"jinja2"}, "pip install 'emq-bridge[web]'"),
        ("emq_bridge.web", {"starlette"}, "pip install 'emq-bridge[web]'"),
        ("emq_bridge.metrics", {"prometheus_client"}, "pip install 'emq-bridge[metrics]'"),
        # Session 35 (a probe of the built wheel): without python-multipart the pages served
        # and every action form (unlock, pause, resume) was a 500 with a traceback.
        (
            "emq_bridge.web",
            {"python_multipart", "multipart"},
            "needs Starlette, Jinja2 and python-multipart: pip install 'emq-bridge[web]'",
        ),
    ],
)
def test_a_missing_extra_is_named_at_import(module: str, blocked: set[str], said: str) -> None:
    code = BLOCK.format(module=module, blocked=blocked)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert said in done.stdout, done.stdout


def test_with_the_extras_the_modules_import() -> None:
    code = (
        "import emq_bridge.web, emq_bridge.metrics, sys; print('prometheus_client' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"  # found, not imported (its multiprocess mode)


def test_the_demo_without_dramatiq_says_which_extra_in_one_line() -> None:
    code = BLOCK.format(module="emq_bridge.cli", blocked={"dramatiq"}).replace(
        'print("imported")',
        'from emq_bridge.cli import main\nsys.argv = ["emq-bridge", "demo"]\nmain()',
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: the demo runs a Dramatiq worker"), lines
    assert "pip install 'emq-bridge[dramatiq]'" in lines[0]


def test_sentry_crons_without_sentry_sdk_says_which_extra_when_it_is_made() -> None:
    # Session 35 (a probe of the built wheel): `SentryCrons()` was made without sentry-sdk,
    # then each monitored message logged a CRITICAL traceback (`No module named
    # 'sentry_sdk'`) and no check-in was sent.
    code = BLOCK.format(module="emq_bridge.dramatiq.sentry", blocked={"sentry_sdk"}).replace(
        'print("imported")',
        "from emq_bridge.dramatiq.sentry import SentryCrons\n"
        "try:\n    SentryCrons()\nexcept ImportError as exc:\n    print(exc)",
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SentryCrons needs sentry-sdk: pip install 'emq-bridge[sentry]'"
