"""What `Repeat` and `Repeat.from_url` are given is checked up front (found by a Python API
probe).

- A client whose text encoding is not UTF-8 wrote a non-ASCII name in that encoding: the
  schedule never fired (its member is not UTF-8) and no read showed it. `Repeat(client)`
  refuses such a client, and a URL's `encoding=` or the keyword is refused before connecting.
- A `redis.asyncio` client was taken, and every move failed with a TypeError about a
  coroutine; `Repeat(None)` or `Repeat("redis://...")` raised AttributeError.
- `Repeat.from_url(url, bogus=1)` or `socket_timeout="x"` failed at the first move with a
  bare TypeError; a URL given as bytes or None raised AttributeError.
- `every=Decimal("1.5")` was told "every must be ms", though `every` takes seconds.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from emq_bridge import ConfigError, Pump, Repeat, ScheduleError
from emq_bridge.testing import RecordingDispatcher, fake_repeat

TEMPLATE = {"task": "reports.digest"}
SECRET = "pw-Q9-secret"


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nowhere(scheme: str = "redis") -> str:
    """A URL of nothing listening: what is refused there is refused before connecting."""
    if scheme == "redis+sentinel":
        return f"redis+sentinel://127.0.0.1:{unused_port()}/mymaster"
    if scheme == "redis+cluster":
        return f"redis+cluster://127.0.0.1:{unused_port()}"
    return f"{scheme}://127.0.0.1:{unused_port()}/0"


# -- 2. the client's encoding is UTF-8 -------------------------------------------------------


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252", "utf-16", "no-such-codec"])
def test_a_client_whose_encoding_is_not_utf8_is_refused_naming_it(
    redis_url: str, encoding: str
) -> None:
    with pytest.raises(ConfigError, match=f"encoding is '{encoding}'.*encoding='utf-8'"):
        Repeat(redis.Redis.from_url(redis_url, encoding=encoding))


def test_a_sentinels_master_client_of_another_encoding_is_refused() -> None:
    client = Sentinel([("127.0.0.1", unused_port())]).master_for("mymaster", encoding="latin-1")
    with pytest.raises(ConfigError, match="encoding is 'latin-1'"):
        Repeat(client)


def test_a_fakeredis_client_of_another_encoding_is_refused() -> None:
    with pytest.raises(ConfigError, match="encoding is 'latin-1'"):
        fake_repeat(encoding="latin-1")


@pytest.mark.parametrize("spelling", ["utf-8", "utf8", "UTF-8", "UTF8", "u8"])
def test_utf8_in_any_spelling_is_taken_and_a_non_ascii_name_fires(
    redis_url: str, prefix: str, spelling: str
) -> None:
    repeat = Repeat(redis.Redis.from_url(redis_url, encoding=spelling), prefix)
    repeat.upsert("q", "café-東京", every="1s", template=TEMPLATE, now_ms=1000)
    recorder = RecordingDispatcher()
    Pump(repeat, ["q"], recorder).run_once(now_ms=2000)
    assert recorder.names() == ["café-東京"]
    assert [r.name for r in Repeat(redis.Redis.from_url(redis_url), prefix).list("q")] == [
        "café-東京"
    ]


@pytest.mark.parametrize("scheme", ["redis", "redis+sentinel", "redis+cluster"])
def test_a_url_or_keyword_encoding_other_than_utf8_is_refused_before_connecting(
    scheme: str,
) -> None:
    with pytest.raises(ConfigError, match=r"^invalid Redis URL: query option encoding must be"):
        Repeat.from_url(f"{nowhere(scheme)}?encoding=latin-1")
    with pytest.raises(ConfigError, match=r"^invalid Redis client option: encoding must be"):
        Repeat.from_url(nowhere(scheme), encoding="latin1")


def test_a_url_may_spell_utf8_its_own_way(redis_url: str, prefix: str) -> None:
    for spelling in ("utf8", "UTF-8"):
        with Repeat.from_url(f"{redis_url}?encoding={spelling}", prefix) as repeat:
            assert repeat.queues() == []


# -- 3. a sync redis-py client -----------------------------------------------------------------


def test_an_asyncio_client_is_refused_saying_what_to_pass(redis_url: str) -> None:
    for client in (redis.asyncio.Redis.from_url(redis_url), fakeredis.FakeAsyncRedis()):
        with pytest.raises(ConfigError, match=r"asyncio client.*redis\.Redis.*asyncio\.to_thread"):
            Repeat(client)


@pytest.mark.parametrize("given", [None, "redis://127.0.0.1:6379/0", object(), 42])
def test_what_is_no_redis_client_is_refused_saying_what_to_pass(given: object) -> None:
    with pytest.raises(ConfigError, match=r"needs a Redis client \(redis\.Redis.*from_url"):
        Repeat(given)


def test_sync_clients_are_taken(redis_url: str, prefix: str) -> None:
    assert Repeat(redis.Redis.from_url(redis_url), prefix).queues() == []
    faked = fake_repeat(prefix)
    faked.register("q", "n", every="1m", template=TEMPLATE)
    assert faked.names("q") == ["n"]


# -- 4. keyword options of from_url ------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"bogus": 1}, "no option 'bogus'"),
        ({"sockettimeout": 5}, "no option 'sockettimeout'"),
        ({"timeout": 5}, "no option 'timeout'"),  # a BlockingConnectionPool's
        ({"socket_timeout": "x"}, "socket_timeout must be a number of seconds"),
        ({"socket_timeout": "5"}, "socket_timeout must be a number of seconds"),  # not parsed
        ({"socket_timeout": -1}, "socket_timeout must be"),
        ({"socket_timeout": 0}, "socket_timeout must be"),
        ({"socket_timeout": float("nan")}, "socket_timeout must be"),
        ({"socket_connect_timeout": 1e10}, "socket_connect_timeout must be"),
        ({"max_connections": 0}, "max_connections must be a whole number above 0"),
        ({"max_connections": True}, "max_connections must be"),
        ({"health_check_interval": -1}, "health_check_interval must be"),
        ({"db": -1}, "db must be"),
        ({"db": "x"}, "db must be"),
        ({"protocol": 4}, "protocol must be 2 or 3"),
        ({"decode_responses": "false"}, "decode_responses must be"),  # a string is true
        ({"retry_on_timeout": "no"}, "retry_on_timeout must be"),
        ({"retry_on_error": "ConnectionError"}, "retry_on_error must be"),
        ({"encoding_errors": "no-such-handler"}, "encoding_errors must be"),
        ({"connection_class": "Connection"}, "connection_class must be a class"),
    ],
)
def test_from_url_refuses_a_keyword_option_redis_py_cannot_use_before_connecting(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError, match=r"^invalid Redis client option: ") as caught:
        Repeat.from_url(nowhere(), **options)
    assert named in str(caught.value)


@pytest.mark.parametrize("scheme", ["rediss", "unix", "redis+sentinel", "redis+cluster"])
def test_every_scheme_checks_its_keyword_options(scheme: str) -> None:
    url = "unix:///nonexistent/redis.sock" if scheme == "unix" else nowhere(scheme)
    with pytest.raises(ConfigError, match="no option 'bogus'"):
        Repeat.from_url(url, bogus=1)
    with pytest.raises(ConfigError, match="socket_timeout must be"):
        Repeat.from_url(url, socket_timeout="x")


def test_options_of_another_scheme_are_refused() -> None:
    with pytest.raises(ConfigError, match="no option 'socket_keepalive'"):
        Repeat.from_url("unix:///nonexistent/redis.sock", socket_keepalive=True)
    with pytest.raises(ConfigError, match="db must be 0"):
        Repeat.from_url(nowhere("redis+cluster"), db=1)


def test_a_keyword_option_error_never_holds_its_value() -> None:
    for options in ({"password": 12345678}, {"socket_timeout": SECRET}, {"username": [SECRET]}):
        with pytest.raises(ConfigError) as caught:
            Repeat.from_url(nowhere(), **options)
        assert SECRET not in str(caught.value) and "12345678" not in str(caught.value)


@pytest.mark.parametrize("url", [b"redis://127.0.0.1:6379/0", None, 6379])
def test_a_url_that_is_not_text_is_a_config_error(url: Any) -> None:
    with pytest.raises(ConfigError, match=r"^invalid Redis URL: it must be text \(str\)"):
        Repeat.from_url(url)


def test_keyword_options_redis_py_takes_still_connect(redis_url: str, prefix: str) -> None:
    options: dict[str, Any] = {
        "socket_timeout": 2.5,
        "socket_connect_timeout": 1,
        "socket_keepalive": True,
        "retry_on_timeout": False,
        "retry": Retry(NoBackoff(), 1),
        "retry_on_error": [redis.ConnectionError],
        "health_check_interval": 10,
        "max_connections": 5,
        "single_connection_client": True,
        "client_name": "emq-bridge",
        "username": None,
        "password": None,
        "db": 0,
        "protocol": 3,
        "decode_responses": True,
        "encoding": "utf-8",
        "encoding_errors": "strict",
        "connection_class": redis.Connection,
    }
    with Repeat.from_url(redis_url, prefix, **options) as repeat:
        repeat.register("q", "n", every="1m", template=TEMPLATE)
        assert repeat.names("q") == ["n"]


# -- 5. each of every and every_ms names its own unit ------------------------------------------


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("every", "every must be seconds, a timedelta or a string like '15m', not Decimal"),
        ("every_ms", "every_ms must be ms, a timedelta or a string like '15m', not Decimal"),
    ],
)
def test_an_interval_of_another_type_is_told_the_unit_its_option_takes(
    any_repeat: Repeat, option: str, said: str
) -> None:
    upsert: Callable[..., Any] = any_repeat.upsert
    with pytest.raises(ScheduleError) as caught:
        upsert("q", f"n{uuid.uuid4().hex[:6]}", template=TEMPLATE, **{option: Decimal("1.5")})
    assert str(caught.value) == said


def test_a_catchup_window_of_another_type_is_told_seconds(any_repeat: Repeat) -> None:
    with pytest.raises(ScheduleError, match=r"^catchup_window must be seconds, a timedelta"):
        any_repeat.upsert("q", "n", every="1m", template=TEMPLATE, catchup_window=Decimal("1.5"))
