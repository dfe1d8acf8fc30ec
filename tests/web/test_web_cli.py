"""`emq-bridge web`'s bad input: one line on stderr and the documented exit code, before
anything listens. (The browser test runs the command for real.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from emq_bridge.cli import cli
from emq_bridge.cli.web import parse_bind


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8000", ("127.0.0.1", 8000)),
        ("[::1]:9", ("::1", 9)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ],
)
def test_bind_addresses_are_host_and_port(value: str, expected: tuple[str, int]) -> None:
    assert parse_bind(value) == expected


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        (["web", "--bind", "8000"], {}, 2, "expected HOST:PORT"),
        (["web", "--bind", "localhost:0"], {}, 2, "between 1 and 65535"),
        (["web", "--bind", ":8000"], {}, 2, "expected HOST:PORT"),
        (["web", "--token-file", "missing.txt"], {}, 2, "cannot read missing.txt"),
        (["web"], {"EMQ_BRIDGE_WEB_TOKEN": "short"}, 2, "at least 16 characters"),
        (
            ["--redis-url", "redis://:hunter2hunter2@127.0.0.1:1/0", "web"],
            {},
            3,
            "cannot reach Redis at redis://:***@127.0.0.1:1/0",
        ),
    ],
)
def test_bad_input_exits_with_one_line_and_its_code(
    args: list[str],
    env: dict[str, str],
    code: int,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EMQ_BRIDGE_WEB_TOKEN", raising=False)
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert "hunter2" not in result.output
    assert len([line for line in result.stderr.splitlines() if line.startswith("Error")]) == 1


def test_a_port_in_use_is_one_line_and_exit_1_and_a_free_one_serves(redis_url: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "emq_bridge", "--redis-url", redis_url, "web"]
        busy = subprocess.run(
            [*command, "--bind", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60
        )
    assert busy.returncode == 1, busy.stderr
    assert busy.stderr.strip().splitlines() == [
        f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]  # and no "serving" line before it
    env = {k: v for k, v in os.environ.items() if k != "EMQ_BRIDGE_WEB_TOKEN"}
    served = subprocess.Popen(
        [*command, "--bind", f"127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert served.stderr is not None
        assert served.stderr.readline().startswith("serving ")
        deadline = time.monotonic() + 30
        while True:  # the socket bound before that line is the one uvicorn serves
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                    conn.sendall(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
                    assert conn.recv(100).startswith(b"HTTP/1.1 ")
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        served.terminate()
        served.wait(timeout=20)


@pytest.mark.parametrize(
    ("content", "env", "message"),
    [
        (b"", None, "Invalid value for '--token-file': token.txt is empty"),
        (b"  \n\t\n", None, "Invalid value for '--token-file': token.txt is empty"),
        (b"\xff" * 20, None, "Invalid value for '--token-file': token.txt is not UTF-8 text"),
        (None, "", "Invalid value for $EMQ_BRIDGE_WEB_TOKEN: it is set but empty"),
        (None, " \n ", "Invalid value for $EMQ_BRIDGE_WEB_TOKEN: it is set but empty"),
        (None, "a" * 16 + "\udcff", "the write token is not valid UTF-8"),
    ],
    ids=["empty file", "blank file", "file not UTF-8", "empty env", "blank env", "env not UTF-8"],
)
def test_an_empty_or_unreadable_token_given_exits_2_before_anything_else(
    content: bytes | None,
    env: str | None,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A token given but empty is bad usage, not a read-only view: exit 2 before Redis is
    asked (the URL's server is not there: a read-only start would exit 3)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EMQ_BRIDGE_WEB_TOKEN", raising=False)
    args = ["--redis-url", "redis://127.0.0.1:1/0", "web"]
    if content is not None:
        (tmp_path / "token.txt").write_bytes(content)
        args += ["--token-file", "token.txt"]
    result = CliRunner().invoke(cli, args, env={"EMQ_BRIDGE_WEB_TOKEN": env})
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: ") and message in line
    assert "serving" not in result.output


def test_an_unset_token_variable_still_means_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an unset variable gives no token: the command goes on to Redis (absent here)."""
    monkeypatch.delenv("EMQ_BRIDGE_WEB_TOKEN", raising=False)
    result = CliRunner().invoke(cli, ["--redis-url", "redis://127.0.0.1:1/0", "web"])
    assert result.exit_code == 3, result.output
    assert "cannot reach Redis" in result.stderr
