"""Framework targets: the CLI finds adapters through entry points, a third one included.

The third framework here is a real installed distribution (a `.dist-info` with its
`entry_points.txt`, on `PYTHONPATH`), exactly what `pip install` of an adapter leaves, and
`emq-bridge` runs as a subprocess, as a user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from emq_bridge import Repeat
from emq_bridge.targets import ENTRY_POINT_GROUP, frameworks

ADAPTER = '''
"""A toy adapter for the test: its "framework" is a Redis list named by the spec."""
import redis
from emq_bridge.dispatch import ListPushDispatcher, PumpTarget


def load_target(spec, *, pipelined=False):
    if pipelined:
        from emq_bridge.errors import ConfigError
        raise ConfigError("the toy adapter has no pipelined path")
    url, _, key = spec.rpartition("#")
    return PumpTarget(ListPushDispatcher(redis.Redis.from_url(url), key), ("toyq",), (), "toy")
'''


@pytest.fixture
def toy_framework(tmp_path: Path) -> dict[str, str]:
    """Install the toy adapter as a distribution registering the `toy` framework."""
    (tmp_path / "toy_adapter.py").write_text(ADAPTER)
    info = tmp_path / "toy_adapter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-adapter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\ntoy = toy_adapter:load_target\nBad_Name = toy_adapter:x\n"
    )
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path)


def emq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emq_bridge", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_the_builtin_adapters_are_found_through_their_entry_points() -> None:
    found = frameworks()
    assert found["celery"].value == "emq_bridge.celery.target:load_target"
    assert found["dramatiq"].value == "emq_bridge.dramatiq.target:load_target"


def test_an_installed_third_framework_gets_its_option_without_any_change_to_the_cli(
    toy_framework: dict[str, str],
) -> None:
    result = emq(toy_framework, "pump", "--help")
    assert result.returncode == 0, result.stderr
    assert "--toy SPEC" in result.stdout
    assert "--celery SPEC" in result.stdout and "--dramatiq SPEC" in result.stdout
    assert "Bad_Name" not in result.stdout  # not an option name: skipped


def test_the_third_framework_pumps_its_target(
    toy_framework: dict[str, str], redis_url: str, prefix: str, client: redis.Redis
) -> None:
    repeat = Repeat(client, prefix)
    past = repeat.server_time_ms() - 5000  # due now
    repeat.register("toyq", "tick", every="1h", template={"task": "t"}, now_ms=past - 3_600_000)
    key = f"{prefix}:out"
    result = emq(
        toy_framework, "--redis-url", redis_url, "--prefix", prefix,
        "pump", "--toy", f"{redis_url}#{key}", "--once",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "dispatched 1, failed 0" in result.stdout
    [message] = [json.loads(m) for m in client.lrange(key, 0, -1)]
    assert message["queue"] == "toyq" and message["name"] == "tick"


def test_a_target_that_refuses_an_option_fails_with_one_line_and_exit_1(
    toy_framework: dict[str, str], redis_url: str, prefix: str
) -> None:
    result = emq(
        toy_framework, "--redis-url", redis_url, "--prefix", prefix,
        "pump", "--toy", f"{redis_url}#k", "--pipelined", "--once",
    )  # fmt: skip
    assert result.returncode == 1
    *warnings, reason = result.stderr.strip().splitlines()
    assert reason == "Error: the toy adapter has no pipelined path"
    assert len(warnings) == 1 and "'Bad_Name' (toy_adapter:x) ignored" in warnings[0]


def test_two_targets_at_once_are_a_usage_error(toy_framework: dict[str, str]) -> None:
    result = emq(toy_framework, "pump", "--toy", "x#k", "--list-key", "k")
    assert result.returncode == 2
    assert "give exactly one target" in result.stderr and "--toy" in result.stderr


def test_the_loader_module_is_imported_only_when_its_option_is_used(
    toy_framework: dict[str, str],
) -> None:
    probe = textwrap.dedent(
        """
        import sys
        from click.testing import CliRunner
        from emq_bridge.cli import cli
        CliRunner().invoke(cli, ["pump", "--help"])
        print(sorted(m for m in ("toy_adapter", "celery", "dramatiq") if m in sys.modules))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=toy_framework
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
