"""Input errors that must be one line, not a traceback, and must never show a password.

Issue 13, round two: a schedule file or `--args` nested deeper than any stack (items 4),
Redis URL query options redis-py checks only on the first connection (item 5), and a
password holding an unescaped '/', '#', '?' or '@' in the CLI's messages (item 6).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from emq_bridge import ConfigError, Repeat
from emq_bridge.cli import cli
from emq_bridge.cli.context import redact_url
from emq_bridge.config import load_schedule_file
from emq_bridge.template import MAX_TEMPLATE_DEPTH

Run = Callable[..., Result]

TOO_DEEP = f"template is nested more than {MAX_TEMPLATE_DEPTH} levels deep"
ENTRY = 'queue = "q"\n\n[[schedule]]\nname = "n"\ntask = "t"\nevery = "1m"\n'


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    """Invoke the CLI on the test server under the test's own prefix; tracebacks fail the test."""

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(
            cli, ["--redis-url", redis_url, "--prefix", prefix, *args], catch_exceptions=False
        )

    return invoke


def key_count(client: redis.Redis, prefix: str) -> int:
    return sum(1 for _ in client.scan_iter(match=f"{prefix}:*", count=1000))


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nested_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_toml_table(depth: int) -> str:
    return "{ a = " * depth + "1" + " }" * depth


def nested_json_object(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def one_error_line(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: ")
    return lines[0]


# -- 4. deep nesting: one line, never a RecursionError -------------------------------------


@pytest.mark.parametrize(
    "field_line",
    [f"args = {nested_array(10_000)}", f"kwargs = {{ a = {nested_toml_table(10_000)} }}"],
    ids=["args", "kwargs"],
)
def test_sync_of_a_file_nested_too_deep_to_read_exits_1_with_one_line_and_writes_nothing(
    run: Run, client: redis.Redis, prefix: str, tmp_path: Path, field_line: str
) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(ENTRY + field_line + "\n")
    result = run("sync", str(path))
    assert result.exit_code == 1
    assert result.stdout == ""
    line = one_error_line(result)
    assert line.startswith(f"Error: {path}: ")
    assert f"at most {MAX_TEMPLATE_DEPTH} levels" in line
    assert key_count(client, prefix) == 0


@pytest.mark.parametrize("depth", [MAX_TEMPLATE_DEPTH, 200])
@pytest.mark.parametrize(
    ("field", "value"),
    [("args", nested_array), ("kwargs", nested_toml_table), ("options", nested_toml_table)],
)
def test_a_file_field_nested_past_the_template_limit_is_refused_naming_the_field(
    tmp_path: Path, field: str, value: Callable[[int], str], depth: int
) -> None:
    # The field is level 2 of the template, so MAX_TEMPLATE_DEPTH levels of its own are one
    # too many; 200 is still readable TOML.
    path = tmp_path / "deep.toml"
    path.write_text(f"{ENTRY}{field} = {value(depth)}\n")
    with pytest.raises(ConfigError) as caught:
        load_schedule_file(path)
    assert str(caught.value) == f"{path}: schedule #1 (q/n), field {field!r}: {TOO_DEEP}"


def test_a_file_field_at_the_template_limit_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "limit.toml"
    path.write_text(f"{ENTRY}args = {nested_array(MAX_TEMPLATE_DEPTH - 1)}\n")
    (declaration,) = load_schedule_file(path).declarations
    assert declaration.definition.template["task"] == "t"


@pytest.mark.parametrize("depth", [MAX_TEMPLATE_DEPTH + 1, 10_000])
@pytest.mark.parametrize(
    ("option", "value"),
    [("--args", nested_array), ("--kwargs", nested_json_object), ("--options", nested_json_object)],
)
def test_add_with_json_nested_too_deep_exits_1_with_one_line_naming_the_field_and_writes_nothing(
    run: Run,
    client: redis.Redis,
    prefix: str,
    option: str,
    value: Callable[[int], str],
    depth: int,
) -> None:
    result = run("add", "q", "n", "--task", "t", "--every", "1m", option, value(depth))
    assert result.exit_code == 1
    assert result.stdout == ""
    line = one_error_line(result)
    assert f"field {option[2:]!r}: {TOO_DEEP}" in line
    assert key_count(client, prefix) == 0


# -- 5. URL query options are checked up front ---------------------------------------------

BAD_QUERIES = [
    ("foo=bar", "unknown query option"),
    ("socket_timeout=-1", "socket_timeout"),
    ("socket_timeout=0", "socket_timeout"),
    ("socket_timeout=nan", "socket_timeout"),
    ("socket_timeout=soon", "socket_timeout"),
    ("socket_connect_timeout=-5", "socket_connect_timeout"),
    ("db=-1", "db"),
    ("db=x", "db"),
    ("max_connections=0", "max_connections"),
    ("health_check_interval=-1", "health_check_interval"),
    ("socket_read_size=0", "socket_read_size"),
    ("protocol=4", "protocol"),
    ("retry_on_timeout=maybe", "retry_on_timeout"),
    ("decode_responses=false", "decode_responses"),
    ("encoding=no-such-codec", "encoding"),
    ("encoding_errors=no-such-handler", "encoding_errors"),
    (
        "retry_on_error=ConnectionError",
        "retry_on_error",
    ),  # redis-py would make it a list of letters
    ("timeout=5", "timeout"),  # a BlockingConnectionPool option; Redis.from_url's pool refuses it
    ("ssl_cert_reqs=none", "ssl_cert_reqs"),  # TLS options need rediss://
    ("host=elsewhere", "unknown query option"),
]


def with_query(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


@pytest.mark.parametrize(("query", "named"), BAD_QUERIES)
def test_repeat_from_url_refuses_an_unknown_query_option_or_a_bad_value_up_front(
    redis_url: str, query: str, named: str
) -> None:
    with pytest.raises(ConfigError, match=r"^invalid Redis URL: ") as caught:
        Repeat.from_url(with_query(redis_url, query))
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("ssl_cert_reqs=sometimes", "ssl_cert_reqs"),
        ("ssl_min_version=99", "ssl_min_version"),
        ("ssl_check_hostname=perhaps", "ssl_check_hostname"),
        ("ssl_include_verify_flags=VERIFY_NOTHING", "invalid Redis URL"),  # redis-py's own check
    ],
)
def test_tls_query_options_are_checked_too(query: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Repeat.from_url(f"rediss://127.0.0.1:{unused_port()}/0?{query}")


@pytest.mark.parametrize(
    "query",
    [
        "foo=x&password=pw-Q9-secret",  # the unknown name is not shown next to a password
        "socket_timeout=pw-Q9-secret",
        "socket_timeout=-1&password=pw-Q9-secret",
    ],
)
def test_a_query_option_error_never_holds_the_password(query: str) -> None:
    for url in (
        f"redis://user:pw-Q9-secret@127.0.0.1:{unused_port()}/0?{query}",
        f"redis://127.0.0.1:{unused_port()}/0?{query}",
    ):
        with pytest.raises(ConfigError) as caught:
            Repeat.from_url(url)
        assert "pw-Q9-secret" not in str(caught.value)
        assert "Q9" not in str(caught.value)


def test_an_unknown_query_option_is_named_when_the_url_holds_no_password() -> None:
    with pytest.raises(ConfigError, match="unknown query option 'sockettimeout'"):
        Repeat.from_url(f"redis://127.0.0.1:{unused_port()}/0?sockettimeout=5")


@pytest.mark.parametrize(
    "query",
    [
        "db=0",
        "socket_timeout=2.5",
        "socket_connect_timeout=1",
        "socket_read_size=65536",
        "socket_keepalive=yes",
        "retry_on_timeout=false",
        "max_connections=5",
        "health_check_interval=0",
        "protocol=3",
        "legacy_responses=true",
        "client_name=emq-bridge",
        *(
            pytest.param(query, marks=pytest.mark.filterwarnings("ignore::DeprecationWarning"))
            for query in ("lib_name=emq", "lib_version=1.0")  # deprecated for driver_info
        ),
        "encoding=utf8",  # the only encoding the registry takes (session 29)
        "encoding_errors=replace",
        "decode_responses=true",
        "username=default",
        "socket_timeout=",  # redis-py ignores a blank option, and so do we
    ],
)
def test_every_query_option_redis_py_takes_from_a_url_still_connects(
    redis_url: str, prefix: str, query: str
) -> None:
    with Repeat.from_url(with_query(redis_url, query), prefix) as repeat:
        assert repeat.queues() == []


def test_tls_query_options_are_taken_on_a_rediss_url() -> None:
    query = (
        "ssl_cert_reqs=required&ssl_check_hostname=true&ssl_min_version=771"
        "&ssl_include_verify_flags=VERIFY_X509_STRICT,VERIFY_X509_PARTIAL_CHAIN"
        "&ssl_ca_certs=/etc/ssl/ca.pem&ssl_ciphers=HIGH&socket_keepalive=true"
    )
    client = Repeat.from_url(f"rediss://127.0.0.1:{unused_port()}/0?{query}").client
    client.connection_pool.make_connection()  # redis-py builds the connection from the options


def test_the_cli_exits_2_with_one_line_for_a_bad_query_option_or_db() -> None:
    port = unused_port()
    for path_and_query in ("0?foo=bar", "0?socket_timeout=-1", "2x", "abc"):
        url = f"redis://user:pw-Q9-secret@127.0.0.1:{port}/{path_and_query}"
        result = CliRunner().invoke(cli, ["--redis-url", url, "list"])
        assert result.exit_code == 2, result.output
        line = one_error_line(result)
        assert "invalid Redis URL" in line and line.endswith("(see 'emq-bridge --help')")
        assert "Q9" not in result.output


# -- 6. a password with unescaped '/', '#', '?' or '@' is never printed ---------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:p/ss@127.0.0.1:1/0", "redis://user:***@127.0.0.1:1/0"),
        ("redis://user:p#ss@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://user:p?ss@host/0", "redis://user:***@host/0"),
        ("redis://user:a@b@host/0", "redis://user:***@host/0"),
        ("redis://:p/s#s?x@y@host/0?db=1", "redis://:***@host/0?db=1"),
        ("redis://p/ss@host/0", "redis://***@host/0"),
        ("redis://p?ss@host", "redis://***@host"),
        ("rediss://user:p#ss@host/0?password=q/w", "rediss://user:***@host/0?password=***"),
        ("unix://user:p?ss@/run/redis.sock?db=2", "unix://user:***@/run/redis.sock?db=2"),
    ],
)
def test_redact_url_hides_everything_after_the_user_up_to_the_last_at(url: str, shown: str) -> None:
    assert redact_url(url) == shown


PASSWORDS = ["pwA/ssB9x", "pwA#ssB9x", "pwA?ssB9x", "pwA@ssB9x", "pwA/s#s?x@yB9"]


def password_pieces(password: str) -> list[str]:
    """The password and its parts between '/', '#', '?' and '@', which redis-py may split at."""
    return [password, *(p for p in re.split(r"[/#?@]", password) if len(p) >= 3)]


@pytest.mark.parametrize("password", PASSWORDS)
def test_the_cli_never_prints_a_password_holding_unescaped_characters(
    tmp_path: Path, password: str
) -> None:
    port = unused_port()
    path = tmp_path / "ok.toml"
    path.write_text(ENTRY)
    runner = CliRunner()
    commands: list[list[str]] = [
        ["list"],
        ["show", "q", "n"],
        ["add", "q", "n", "--task", "t", "--every", "1m"],
        ["sync", str(path)],
    ]
    for url in (
        f"redis://user:{password}@127.0.0.1:{port}/0",
        f"redis://:{password}@127.0.0.1:{port}/0",
        f"redis://{password}@127.0.0.1:{port}/0",
    ):
        for args in commands:
            result = runner.invoke(cli, ["--redis-url", url, *args])
            assert result.exit_code in (2, 3), (url, args, result.output)
            assert result.exception is None or isinstance(result.exception, SystemExit)
            for piece in password_pieces(password):  # urllib lowercases the host it cuts
                assert piece.lower() not in result.output.lower(), (url, args, result.output)
