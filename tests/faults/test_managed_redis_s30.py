"""Managed Redis (ElastiCache, MemoryDB...), found by a probe: three defects, on real servers.

1. A plain `redis://` URL naming one node of a Redis Cluster (a cluster-mode endpoint given
   without `+cluster`): a move on a queue another node holds failed with redis-py's MOVED
   text stripped of its code (`register q/n: 10157 127.0.0.1:27464`), and `list`, `export`
   and `health` answered the node's own queues as if they were all of them, exit 0 (an
   export silently incomplete). Now both say the server is a cluster node and to use a
   `redis+cluster://` URL, and the CLI exits 3 in one line.
2. The eviction guard read the policy with `CONFIG GET` only, which managed services rename
   away: an `allkeys-*` policy went unsaid. Now `INFO memory` is read instead.
3. An outage said only the exception's type (`Redis is unreachable (ConnectionError)`), so a
   TLS certificate refused, a CA file not found and a refused connection read the same. Now
   redis-py's reason is said, on one line, bounded, and never with the password.

The servers are this module's own, on fixed ports (27750-27799, ten per xdist worker): a
cluster of three masters built by hand, and a valkey started from a config file that renames
CONFIG away, with a password and `maxmemory-policy allkeys-lru`, as ElastiCache is.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
import redis.cluster
from certificates import make_certificates
from click.testing import CliRunner, Result
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from emq_bridge import Pump, Repeat
from emq_bridge.cli import cli
from emq_bridge.embedded import EmbeddedServer, find_server_binary
from emq_bridge.errors import RegistryError, RegistryUnavailable
from emq_bridge.health import check
from emq_bridge.testing import RecordingDispatcher

from .cluster import SLOTS, cluster_port, wait_for
from .conftest import die_with_parent

pytestmark = pytest.mark.faults

PREFIX = "mg"
PASSWORD = "adminPW-Q9x"
TASK = {"task": "app.t"}
CLUSTER_NODE = "the server is a Redis Cluster node"
CLUSTER_URL = "redis+cluster://"


def _ports() -> list[int]:
    """Seven ports for this worker: three cluster nodes (their bus ports, +10000, are free
    too), the CONFIG-less server, a TLS listener, and one nothing listens on."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    if index < 5:
        # Below Linux's ephemeral range (32768 on), bus ports included, and apart from
        # `cluster_port`'s: no client socket's local port, nor another cluster, is on them.
        base = 16_000 + 10 * index
        return list(range(base, base + 7))
    return [cluster_port() for _ in range(7)]  # more workers than the range holds


PORTS = _ports()
CLUSTER_PORTS, CONFIGLESS_PORT, TLS_PORT, NOTHING_PORT = PORTS[:3], PORTS[3], PORTS[4], PORTS[5]


# -- the servers ------------------------------------------------------------------------


@dataclass
class ClusterOfThree:
    nodes: list[EmbeddedServer]

    @property
    def plain_url(self) -> str:
        """A `redis://` URL of the first node, as a cluster-mode endpoint given by mistake."""
        return self.nodes[0].url

    @property
    def cluster_url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def holder(self, queue: str) -> int:
        """Return the index of the node that holds `queue`'s keys (the slot of its tag)."""
        return key_slot(queue.encode()) * len(self.nodes) // SLOTS


def _slots_of(index: int, masters: int) -> range:
    """The slots of master `index` of `masters`, an even split (as `holder` reads it)."""
    return range(-(-index * SLOTS // masters), -(-(index + 1) * SLOTS // masters))


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterOfThree]:
    args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
    nodes = [EmbeddedServer(port=port, extra_args=args).start() for port in CLUSTER_PORTS]
    try:
        admins = [redis.Redis(port=n.port, decode_responses=True) for n in nodes]
        for index, admin in enumerate(admins):
            slots = _slots_of(index, len(admins))
            for start in range(0, len(slots), 1_000):  # ADDSLOTS: Redis 6.2 has no RANGE
                admin.execute_command("CLUSTER", "ADDSLOTS", *slots[start : start + 1_000])
        for admin in admins[1:]:
            admin.execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[0].port)
        wait_for(lambda: all(a.cluster("info")["cluster_state"] == "ok" for a in admins), 30, "ok")
        for admin in admins:
            admin.close()
        yield ClusterOfThree(nodes)
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture(scope="module")
def configless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A valkey started from a config file as ElastiCache runs Redis: CONFIG renamed away,
    a password, `maxmemory-policy allkeys-lru`. Yields its URL (with the password)."""
    directory = tmp_path_factory.mktemp("configless")
    config = directory / "valkey.conf"
    config.write_text(
        f'port {CONFIGLESS_PORT}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {directory}\n'
        f"requirepass {PASSWORD}\nmaxmemory 64mb\nmaxmemory-policy allkeys-lru\n"
        'rename-command CONFIG ""\n'
    )
    server = subprocess.Popen(
        [find_server_binary(), str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - one prctl call
    )
    try:
        admin = redis.Redis(port=CONFIGLESS_PORT, password=PASSWORD)
        wait_for(lambda: bool(admin.ping()), 10, "the CONFIG-less server answering")
        with pytest.raises(redis.ResponseError, match="unknown command"):
            admin.config_get("maxmemory-policy")  # renamed away, for real
        admin.close()
        yield f"redis://:{PASSWORD}@127.0.0.1:{CONFIGLESS_PORT}/0"
    finally:
        server.kill()
        server.wait()


@pytest.fixture(scope="module")
def untrusted_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A TLS listener whose certificate no CA of the client's signs: yields its port."""
    certs = make_certificates(tmp_path_factory.mktemp("tls"))  # a CA the client has not
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    listener = socket.create_server(("127.0.0.1", TLS_PORT))
    stopped = threading.Event()

    def serve() -> None:
        while not stopped.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(connection, server_side=True):
                    pass  # the client refuses the certificate: the handshake fails
            except (OSError, ssl.SSLError):
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield TLS_PORT
    stopped.set()
    listener.close()
    thread.join(5)


def queue_on(cluster: ClusterOfThree, node: int, stem: str) -> str:
    """Return a queue name `stem<n>` whose keys the cluster's node `node` holds."""
    return next(f"{stem}{n}" for n in range(10_000) if cluster.holder(f"{stem}{n}") == node)


@pytest.fixture(scope="module")
def spread(cluster: ClusterOfThree) -> list[str]:
    """A queue on each node, one schedule each, registered through a cluster client."""
    queues = [queue_on(cluster, node, "q") for node in range(3)]
    repeat = Repeat.from_url(cluster.cluster_url, PREFIX)
    for queue in queues:
        repeat.register(queue, "n", every="1h", template=TASK)
    assert repeat.queues() == sorted(queues)
    repeat.close()
    return queues


def run_cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--redis-url", url, "--prefix", PREFIX, *args])


def refused_in_one_line(result: Result) -> str:
    """Assert `result` is the CLI's refusal of a cluster node (exit 3, one line); return it."""
    assert result.exit_code == 3, result.output
    [line] = result.stderr.strip().splitlines()
    assert CLUSTER_NODE in line and CLUSTER_URL in line, line
    return line


# -- 1. a plain URL on a Redis Cluster node -----------------------------------------------


def test_a_move_on_a_queue_another_node_holds_says_to_use_a_cluster_url(
    cluster: ClusterOfThree, spread: list[str]
) -> None:
    repeat = Repeat.from_url(cluster.plain_url, PREFIX)
    far = queue_on(cluster, 1, "far")
    with pytest.raises(RegistryError, match=CLUSTER_NODE) as raised:
        repeat.register(far, "n", every="1h", template=TASK)
    message = str(raised.value)
    assert message.startswith(f"register {far}/n: ")
    assert CLUSTER_URL in message and "MOVED" in message, message
    assert not isinstance(raised.value, RegistryUnavailable)  # a wrong URL, not an outage
    line = refused_in_one_line(run_cli(cluster.plain_url, "show", spread[2], "n"))
    assert "MOVED" in line


def test_a_pump_on_a_cluster_node_tells_why_a_far_queue_fails(
    cluster: ClusterOfThree, spread: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    pump = Pump(Repeat.from_url(cluster.plain_url, PREFIX), spread, RecordingDispatcher())
    pump.step()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2, errors  # the two queues the other nodes hold, told once each
    assert all(CLUSTER_NODE in e and CLUSTER_URL in e for e in errors), errors


def test_reads_of_every_queue_refuse_a_cluster_node_instead_of_answering_part(
    cluster: ClusterOfThree, spread: list[str]
) -> None:
    repeat = Repeat.from_url(cluster.plain_url, PREFIX)
    assert cluster.holder(spread[0]) == 0  # the node's own queue, which a SCAN there sees
    for read in (repeat.queues, lambda: repeat.queues(broken=True), repeat.pump_queues):
        with pytest.raises(RegistryError, match=CLUSTER_NODE) as raised:
            read()
        assert CLUSTER_URL in str(raised.value)
        assert not isinstance(raised.value, RegistryUnavailable)
    with pytest.raises(RegistryError, match=CLUSTER_NODE):
        check(repeat)
    # Through the cluster URL, every queue is found.
    assert Repeat.from_url(cluster.cluster_url, PREFIX).queues() == sorted(spread)


def test_the_cluster_check_costs_one_info_per_registry_and_none_on_a_move(
    cluster: ClusterOfThree, spread: list[str]
) -> None:
    repeat = Repeat.from_url(cluster.plain_url, PREFIX)
    asked: list[tuple[object, ...]] = []
    info: Callable[..., object] = repeat.client.info

    def counted(*args: object, **kwargs: object) -> object:
        asked.append(args)
        return info(*args, **kwargs)

    repeat.client.info = counted
    assert repeat.read(spread[0], "n").name == "n"  # a move on the node's own queue
    assert asked == []
    for _ in range(3):
        with pytest.raises(RegistryError, match=CLUSTER_NODE):
            repeat.queues()
    assert asked == [("cluster",)]


@pytest.mark.parametrize(
    "args", [["list"], ["export"], ["health"], ["health", "--json"], ["pumps"]], ids=" ".join
)
def test_the_cli_on_a_cluster_node_exits_3_in_one_line_instead_of_a_partial_answer(
    cluster: ClusterOfThree, spread: list[str], args: list[str]
) -> None:
    result = run_cli(cluster.plain_url, *args)
    refused_in_one_line(result)
    assert "exported" not in result.output
    assert spread[0] not in result.stdout  # not the node's own queue alone


def test_the_cli_add_on_a_cluster_node_exits_3_naming_the_cluster(
    cluster: ClusterOfThree, spread: list[str]
) -> None:
    far = queue_on(cluster, 2, "add")
    result = run_cli(cluster.plain_url, "add", far, "u", "--task", "x.u", "--every", "1h")
    line = refused_in_one_line(result)
    assert f"register {far}/u: " in line and "MOVED" in line, line


# -- 2. the eviction guard where CONFIG is renamed away -----------------------------------


def warnings_about_eviction(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "emq_bridge.registry"
        and r.levelno >= logging.WARNING
        and "maxmemory-policy" in r.getMessage()
    ]


def test_a_pump_warns_loudly_of_allkeys_where_config_is_renamed_away(
    configless: str, caplog: pytest.LogCaptureFixture
) -> None:
    repeat = Repeat.from_url(configless, PREFIX)
    assert repeat.eviction_policy() == "allkeys-lru"
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    assert pump.check_eviction_policy() == "allkeys-lru"
    [message] = warnings_about_eviction(caplog)
    assert "allkeys-lru" in message and "noeviction" in message


def test_health_and_pump_once_name_the_policy_where_config_is_renamed_away(
    configless: str, caplog: pytest.LogCaptureFixture
) -> None:
    Repeat.from_url(configless, PREFIX).register("q", "n", every="1h", template=TASK)
    found = check(Repeat.from_url(configless, PREFIX))
    assert found.eviction_policy == "allkeys-lru"
    assert "maxmemory-policy is allkeys-lru" in found.reason
    as_json = json.loads(run_cli(configless, "health", "--json").stdout)
    assert as_json["eviction_policy"] == "allkeys-lru"
    line = run_cli(configless, "health").stderr  # unhealthy (no pump), the warning in it
    assert "maxmemory-policy is allkeys-lru" in line
    once = run_cli(configless, "pump", "q", "--list-key", "out", "--once")
    assert once.exit_code == 0, once.output
    assert "maxmemory-policy is allkeys-lru" in once.output + caplog.text


def test_a_user_refused_both_config_and_info_is_told_at_info_and_lists_all_the_same(
    configless: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis.from_url(configless)
    admin.acl_setuser(
        "nodanger", enabled=True, passwords=["+nodanger-PW"], keys=["*"], channels=["*"],
        commands=["+@all", "-@dangerous"],
    )  # fmt: skip
    admin.close()
    url = f"redis://nodanger:nodanger-PW@127.0.0.1:{CONFIGLESS_PORT}/0"
    repeat = Repeat.from_url(url, "mg-acl")
    repeat.register("q", "n", every="1h", template=TASK)
    caplog.set_level(logging.INFO, logger="emq_bridge")
    assert repeat.eviction_policy() is None
    assert "could not read maxmemory-policy" in caplog.text
    assert repeat.queues() == ["q"]  # INFO cluster refused: cannot tell, reads on


# -- 3. an outage says why ------------------------------------------------------------------


def unreachable(url: str, **options: object) -> str:
    """Return the message of the `RegistryUnavailable` a read of `url` raises."""
    repeat = Repeat.from_url(url, PREFIX, retry=Retry(NoBackoff(), 0), **options)
    with pytest.raises(RegistryUnavailable) as raised:
        repeat.queues()
    message = str(raised.value)
    assert "\n" not in message and len(message) < 300, message
    return message


def test_a_refused_connection_says_so() -> None:
    message = unreachable(f"redis://127.0.0.1:{NOTHING_PORT}/0")
    assert message.startswith("list queues: Redis is unreachable (ConnectionError: "), message
    assert "Connection refused" in message


def test_a_certificate_refused_and_a_ca_file_not_found_say_so(untrusted_tls: int) -> None:
    url = f"rediss://127.0.0.1:{untrusted_tls}/0"
    assert "CERTIFICATE_VERIFY_FAILED" in unreachable(url)
    missing = unreachable(f"{url}?ssl_ca_certs=/nonexistent/emq-ca.pem")
    assert "No such file or directory" in missing, missing


def test_an_outage_message_never_holds_the_password(configless: str) -> None:
    refused = unreachable(f"redis://:wrong-PW-Q9x@127.0.0.1:{CONFIGLESS_PORT}/0")
    assert "refused the credentials" in refused and "wrong-PW-Q9x" not in refused
    assert "WRONGPASS" in refused or "invalid" in refused, refused  # the server's reply
    # redis-py reads the user info before an unescaped '#' as the host, and names it.
    misread = unreachable(f"redis://pwA#ssB9x@127.0.0.1:{NOTHING_PORT}/0")
    assert "pwa" not in misread.lower() and "ssb9x" not in misread.lower(), misread
    assert "connecting to the server" in misread, misread
