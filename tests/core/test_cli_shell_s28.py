"""`emq-bridge` in shell scripts, CI and containers: the locale, the environment, pipes,
terminals and signals, with the CLI run as a real process where they matter.

- Output is UTF-8 whatever the locale: an export in a Latin-1 locale is a file `sync` reads
  back, and a character the locale cannot encode is no traceback.
- An empty `$REDIS_URL` is bad usage (exit 2), refused before anything connects, never the
  default server on localhost.
- A password missing or wrong is said as a refused authentication (exit 3), not "cannot reach".
- An export to a pipe whose reader stops early exits 1 in one line, never "exported".
- `NO_COLOR` and `TERM=dumb` turn the colours of `sync`'s diff off on a terminal.
- In a `C` locale without UTF-8 mode, arguments given in UTF-8 are read as UTF-8.
- Signals: `pump` and `web` stop gracefully (exit 0); a one-shot command exits 130 on SIGINT
  with one line, and is killed by SIGTERM.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cli_runs import cli_runner, one_error_line
from processes import wait_until

from emq_bridge import Repeat
from emq_bridge.embedded import EmbeddedServer

TIMEOUT_S = 60
CLI = [sys.executable, "-m", "emq_bridge"]
ADD_REST = ["--task", "t", "--every", "1h"]  # what `add QUEUE NAME` needs besides

# Exit at once, before any connection, should anything try the default server (6379): the
# audit hook runs before the socket connects. Then runs the command line as the script does.
GUARDED_MAIN = textwrap.dedent(
    """
    import os, sys

    def guard(event, args):
        if event == "socket.connect" and isinstance(args[1], tuple) and args[1][1] == 6379:
            os.write(2, b"test guard: a connection to port 6379 was attempted\\n")
            os._exit(99)

    sys.addaudithook(guard)
    from emq_bridge.cli import main
    sys.argv[0] = "emq-bridge"
    main()
    """
)


def _env(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _c_locale(**changes: str | None) -> dict[str, str]:
    """A `C` locale without Python's UTF-8 mode (nor locale coercion, which LC_ALL stops)."""
    locale: dict[str, str | None] = {
        "LC_ALL": "C",
        "LANG": None,
        "LC_CTYPE": None,
        "PYTHONUTF8": "0",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONIOENCODING": None,
    }
    return _env(**{**locale, **changes})


def _run(
    args: list[str | bytes], env: dict[str, str], **kwargs: object
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, timeout=TIMEOUT_S, check=False, **kwargs
    )


def _one_line(stderr: bytes) -> str:
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _sigint_default() -> None:
    # A test runner's worker may ignore SIGINT, which a child inherits: Python then installs
    # no KeyboardInterrupt handler. The CLI's users' shells do not ignore it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# -- 1. output is UTF-8 whatever the locale ---------------------------------------------------


def test_export_and_json_are_utf8_in_a_latin1_locale_and_the_export_syncs_back(
    redis_url: str, prefix: str, repeat: Repeat, tmp_path: Path
) -> None:
    repeat.register(
        "exq",
        "café",
        every="1h",
        template={"task": "app.t", "args": [], "kwargs": {"x": "☃"}, "options": {}},
    )
    # A Latin-1 stdout, as a Latin-1 locale gives (no locale has to be installed for it).
    latin1 = _c_locale(PYTHONIOENCODING="latin-1")
    base = ["--redis-url", redis_url, "--prefix", prefix]

    exported = _run([*base, "export", "exq"], latin1)
    assert exported.returncode == 0, exported.stderr
    document = exported.stdout.decode("utf-8")  # UTF-8, not Latin-1 (nor a traceback)
    assert "café" in document and "☃" in document

    for args in (["list", "exq", "--json"], ["show", "exq", "café", "--json"]):
        done = _run([*base, *args], latin1)
        assert done.returncode == 0, done.stderr
        assert b"Traceback" not in done.stderr
        assert "☃" in json.dumps(json.loads(done.stdout.decode("utf-8")), ensure_ascii=False)
    table = _run([*base, "list", "exq"], latin1)
    assert table.returncode == 0, table.stderr
    assert "café" in table.stdout.decode("utf-8")

    path = tmp_path / "exported.toml"
    path.write_bytes(exported.stdout)
    back = _run([*base, "sync", str(path), "--dry-run"], latin1)  # read as UTF-8: valid
    assert back.returncode == 0, back.stderr
    assert "exq/café" in back.stdout.decode("utf-8")


# -- 2. an empty $REDIS_URL -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["list"], ["pause", "reports", "--all"], ["sync", "schedules.toml"], ["demo"]],
    ids=["list", "pause-all", "sync", "demo"],
)
def test_an_empty_redis_url_is_refused_before_anything_connects(
    args: list[str], tmp_path: Path
) -> None:
    (tmp_path / "schedules.toml").write_text(
        'source = "s"\nqueue = "reports"\n[[schedule]]\nname = "a"\ntask = "t"\nevery = "1h"\n'
    )
    done = subprocess.run(
        [sys.executable, "-c", GUARDED_MAIN, *args],
        env=_env(REDIS_URL=""),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    line = _one_line(done.stderr.encode())
    assert line.startswith("Error: REDIS_URL is set but empty"), line


def test_an_empty_redis_url_leaves_help_and_a_given_redis_url_alone(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    repeat.register("reports", "digest", every="15m", template={"task": "app.digest"})
    helped = subprocess.run(
        [sys.executable, "-c", GUARDED_MAIN, "list", "--help"],
        env=_env(REDIS_URL=""),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert helped.returncode == 0, helped.stderr
    given = subprocess.run(
        [sys.executable, "-c", GUARDED_MAIN, "--redis-url", redis_url, "--prefix", prefix, "list"],
        env=_env(REDIS_URL=""),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert given.returncode == 0, given.stderr
    assert "digest" in given.stdout


# -- 3. authentication ------------------------------------------------------------------------

PASSWORD = "s3cret-pass"


@pytest.fixture(scope="module")
def password_server() -> Iterator[str]:
    """An own server that requires `PASSWORD` (set once it answers PING)."""
    with EmbeddedServer() as server:
        admin = redis.Redis.from_url(server.url)
        admin.config_set("requirepass", PASSWORD)
        admin.close()
        yield f"127.0.0.1:{server.port}"


@pytest.mark.parametrize("query", ["", "?protocol=2"], ids=["resp3", "resp2"])
def test_a_missing_password_is_a_refused_authentication(password_server: str, query: str) -> None:
    done = cli_runner(f"redis://{password_server}/0{query}", "auth")("list")
    line = one_error_line(done, 3)
    assert line.startswith(f"Error: Redis refused authentication at redis://{password_server}/0")
    assert "requires a password and none was given" in line
    assert "cannot reach" not in line and "HELLO" not in line


@pytest.mark.parametrize("user", ["", "bob"], ids=["default-user", "acl-user"])
def test_a_wrong_password_is_a_refused_authentication_and_stays_hidden(
    password_server: str, user: str
) -> None:
    done = cli_runner(f"redis://{user}:Wr0ngPassw0rd@{password_server}/0", "auth")("list")
    line = one_error_line(done, 3)
    assert line.startswith(f"Error: Redis refused authentication at redis://{user}:***@"), line
    assert "check the user and password" in line
    assert "Wr0ngPassw0rd" not in done.output


def test_a_redbeat_server_refusing_authentication_is_said_so(
    password_server: str, redis_url: str, prefix: str
) -> None:
    pytest.importorskip("celery")
    source = f"redis://ops:Wr0ngPassw0rd@{password_server}/0"
    done = cli_runner(redis_url, prefix)("import", "redbeat", "--from", source, "--dry-run")
    line = one_error_line(done, 3)
    assert line.startswith(
        f"Error: Redis refused authentication at redis://ops:***@{password_server}"
    )
    assert "celery-redbeat" in line and "Wr0ngPassw0rd" not in done.output


def test_the_right_password_still_works(password_server: str) -> None:
    done = cli_runner(f"redis://:{PASSWORD}@{password_server}/0", "auth")("list")
    assert done.exit_code == 0, done.output


# -- 4. export into a pipe whose reader stops early -------------------------------------------


def test_an_export_whose_reader_stops_early_exits_1_in_one_line(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    entries = "".join(
        f'[[schedule]]\nname = "job-{i:05d}"\ntask = "app.tasks.some_long_task_name"\n'
        f'every = "{i + 1}m"\nkwargs = {{ report = "weekly-{i}", padding = "{"x" * 40}" }}\n'
        for i in range(3000)
    )  # about 500 KiB exported: many times a pipe's buffer
    path = tmp_path / "big.toml"
    path.write_text(f'source = "big"\nqueue = "bigq"\n{entries}')
    assert cli_runner(redis_url, prefix)("sync", str(path)).exit_code == 0
    process = subprocess.Popen(
        [*CLI, "--redis-url", redis_url, "--prefix", prefix, "export"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.read(10) == b'source = "'  # the export is under way
        process.stdout.close()  # `| head -c 10`: the reader is gone
        stderr = process.stderr.read()
        process.wait(TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1, stderr
    assert _one_line(stderr) == "Error: cannot write to stdout: Broken pipe"


# -- 5. NO_COLOR and TERM=dumb ----------------------------------------------------------------


def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Run the CLI with its stdout and stderr on a pseudo-terminal; its exit code and output."""
    main, child = pty.openpty()
    process = subprocess.Popen([*CLI, *args], stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    output = b""
    try:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child's side closed
                break
            if not chunk:
                break
            output += chunk
        process.wait(TIMEOUT_S)
    finally:
        os.close(main)
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, output


@pytest.mark.parametrize(
    ("changes", "coloured"),
    [
        ({"NO_COLOR": None, "TERM": "xterm-256color"}, True),
        ({"NO_COLOR": "", "TERM": "xterm-256color"}, True),  # set but empty: no effect
        ({"NO_COLOR": "1", "TERM": "xterm-256color"}, False),
        ({"NO_COLOR": None, "TERM": "dumb"}, False),
    ],
    ids=["terminal", "no-color-empty", "no-color", "term-dumb"],
)
def test_sync_colours_its_diff_on_a_terminal_unless_no_color_or_a_dumb_terminal(
    redis_url: str, prefix: str, tmp_path: Path, changes: dict[str, str | None], coloured: bool
) -> None:
    path = tmp_path / "col.toml"
    path.write_text(
        'source = "col"\nqueue = "colq"\n[[schedule]]\nname = "a"\ntask = "t"\nevery = "1h"\n'
    )
    code, output = _on_a_terminal(
        ["--redis-url", redis_url, "--prefix", prefix, "sync", str(path), "--dry-run"],
        _env(**changes),
    )
    assert code == 0, output
    assert b"+ colq/a" in output
    assert (b"\x1b[" in output) is coloured, output


# -- 6. UTF-8 arguments in a C locale without UTF-8 mode --------------------------------------


def test_utf8_arguments_are_read_as_utf8_in_a_c_locale(
    redis_url: str, prefix: str, repeat: Repeat
) -> None:
    env = _c_locale()
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; print(sys.flags.utf8_mode, sys.getfilesystemencoding())",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.split() == ["0", "ascii"], probe.stdout  # the locale this test needs
    done = _run(
        [
            "--redis-url",
            redis_url,
            "--prefix",
            prefix,
            "add",
            "qé",
            "naïve",
            "--task",
            "app.tâche",
            "--every",
            "1h",
            "--label",
            "team=sûreté",
        ],
        env,
    )
    assert done.returncode == 0, done.stderr
    assert "added qé/naïve" in done.stdout.decode("utf-8")
    registration = repeat.get("qé", "naïve")
    assert registration is not None
    assert registration.definition.template["task"] == "app.tâche"
    assert dict(registration.definition.labels) == {"team": "sûreté"}


def test_invalid_utf8_arguments_are_still_refused_in_a_c_locale(
    redis_url: str, prefix: str, client: redis.Redis
) -> None:
    done = _run(
        ["--redis-url", redis_url, "--prefix", prefix, "add", b"q\xff", "n", *ADD_REST],
        _c_locale(),
    )
    assert done.returncode == 1, done.stderr
    assert "is not valid UTF-8" in _one_line(done.stderr)
    assert list(client.scan_iter(match=f"{prefix}:*")) == []


# -- 7. signals -------------------------------------------------------------------------------


@pytest.fixture
def paused_server() -> Iterator[tuple[str, redis.Redis]]:
    """An own server whose writes are paused (`CLIENT PAUSE WRITE`): a write command waits."""
    with EmbeddedServer() as server:
        admin = redis.Redis.from_url(server.url)
        admin.client_pause(TIMEOUT_S * 1000, all=False)
        try:
            yield server.url, admin
        finally:
            admin.client_unpause()
            admin.close()


def _blocked_add(url: str, admin: redis.Redis) -> subprocess.Popen[bytes]:
    """`add` as a process, once it waits on the paused server."""
    process = subprocess.Popen(
        [*CLI, "--redis-url", url, "--prefix", "sig", "add", "q", "n", *ADD_REST],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_sigint_default,  # noqa: PLW1509
    )
    me = str(admin.client_id())
    wait_until(
        lambda: any(c["id"] != me and "b" in c["flags"] for c in admin.client_list()),
        TIMEOUT_S,
        "the command to wait on the paused server",
    )
    return process


def test_a_one_shot_command_interrupted_by_sigint_exits_130_in_one_line(
    paused_server: tuple[str, redis.Redis],
) -> None:
    process = _blocked_add(*paused_server)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 130, err
    assert _one_line(err) == "Error: interrupted (SIGINT)"
    assert out == b""


def test_a_one_shot_command_is_killed_by_sigterm(paused_server: tuple[str, redis.Redis]) -> None:
    process = _blocked_add(*paused_server)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == -signal.SIGTERM  # 143 in the shell


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _started(process: subprocess.Popen[bytes], says: bytes) -> bytes:
    """Read `process`'s stderr until a line holding `says`; what was read."""
    assert process.stderr is not None
    read = b""
    deadline = time.monotonic() + TIMEOUT_S
    while says not in read and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        read += line
    assert says in read, read
    return read


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_web_stops_gracefully_and_exits_0_on_sigterm_and_sigint(
    redis_url: str, prefix: str, sig: signal.Signals
) -> None:
    pytest.importorskip("uvicorn")
    bind = f"127.0.0.1:{_free_port()}"
    process = subprocess.Popen(
        [*CLI, "--redis-url", redis_url, "--prefix", prefix, "web", "--bind", bind],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(EMQ_BRIDGE_WEB_TOKEN=None),
        preexec_fn=_sigint_default,  # noqa: PLW1509
    )
    try:
        _started(process, b"serving ")  # a signal from now on is a graceful stop
        process.send_signal(sig)
        _, err = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert b"web view stopped" in err
    assert b"Aborted" not in err and b"Traceback" not in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_pump_stops_gracefully_and_exits_0_on_sigterm_and_sigint(
    redis_url: str, prefix: str, sig: signal.Signals
) -> None:
    options = ["--list-key", f"{prefix}:out", "--max-sleep", "0.5"]
    process = subprocess.Popen(
        [*CLI, "--redis-url", redis_url, "--prefix", prefix, "pump", "sigq", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_sigint_default,  # noqa: PLW1509
    )
    try:
        _started(process, b"pumping ")  # "Ctrl-C to stop": from now on it does
        process.send_signal(sig)
        _, err = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert b"pump stopped" in err
