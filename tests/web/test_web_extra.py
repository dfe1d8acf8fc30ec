"""The web view is an extra: without Starlette, Jinja2 and uvicorn the package, the CLI and
every other command work, and `emq-bridge web` says which extra to install."""

from __future__ import annotations

import subprocess
import sys

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('starlette', 'jinja2', 'uvicorn', 'multipart'):
            raise ImportError(f'{name} is not installed (blocked by the test)')
sys.meta_path.insert(0, Block())
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code], capture_output=True, text=True, timeout=60
    )


def test_without_the_web_extra_the_cli_works_and_web_names_the_extra() -> None:
    listed = run("from emq_bridge.cli import main; main(['--help'])")
    assert listed.returncode == 0 and "web" in listed.stdout
    served = run(
        "from emq_bridge.cli import main; main(['--redis-url', 'redis://127.0.0.1:1/0', 'web'])"
    )
    assert served.returncode == 1, served.stderr
    assert served.stderr.startswith("Error: the web view needs its extra: pip install")
    assert "'emq-bridge[web]'" in served.stderr
    core = run("import emq_bridge, emq_bridge.cli, emq_bridge.health; print('ok')")
    assert core.stdout.strip() == "ok", core.stderr
