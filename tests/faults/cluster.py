"""A throwaway Redis Cluster of embedded servers, built by hand (no redis-cli needed).

Three masters split the 16,384 slots; each gets one replica. `kill_master_of(key)` SIGKILLs
the master holding a key and waits until its replica has taken over.
"""

from __future__ import annotations

import contextlib
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from redis.crc import key_slot

from emq_bridge.embedded import EmbeddedServer

SLOTS = 16_384
NODE_TIMEOUT_MS = 1_000


def cluster_port() -> int:
    """Return a free port whose cluster bus port (port + 10000) is free too.

    Both are drawn below Linux's ephemeral range (32768 on), from ranges that do not overlap
    (10000-15999, bus 20000-25999): a port `bind(0)` hands out (another test's server, or
    another test process picking its nodes at the same moment) is never a node's nor a
    bus's, so two clusters started at once do not take each other's ports.
    """
    draw = random.SystemRandom()
    for _ in range(1_000):
        port = draw.randrange(10_000, 16_000)
        if _free(port) and _free(port + 10_000):
            return port
    raise AssertionError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError):
            if condition():
                return
        time.sleep(0.05)
    raise AssertionError(f"cluster: {what} did not happen within {timeout_s}s")


def _add_slots(admin: redis.Redis, slots: range, chunk: int = 1_000) -> None:
    """Give `slots` to the node, a chunk of slot numbers a command: `CLUSTER ADDSLOTS`, not
    7.0's `ADDSLOTSRANGE`, so that the cluster builds on Redis 6.2 too."""
    for start in range(0, len(slots), chunk):
        admin.execute_command("CLUSTER", "ADDSLOTS", *slots[start : start + chunk])


@dataclass
class Cluster:
    masters: int = 3
    nodes: list[EmbeddedServer] = field(default_factory=list)

    def start(self) -> Cluster:
        args = [
            "--cluster-enabled", "yes", "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--cluster-config-file", "nodes.conf", "--appendonly", "no",
            "--cluster-replica-validity-factor", "0",  # a replica always may take over
        ]  # fmt: skip
        for _ in range(2 * self.masters):
            self.nodes.append(EmbeddedServer(port=cluster_port(), extra_args=args).start())
        admins = [self.admin(n) for n in self.nodes]
        per_master = SLOTS // self.masters
        for index in range(self.masters):
            last = SLOTS - 1 if index == self.masters - 1 else (index + 1) * per_master - 1
            _add_slots(admins[index], range(index * per_master, last + 1))
        for admin in admins[1:]:
            admin.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
        wait_for(
            lambda: all(len(a.cluster("nodes")) == len(self.nodes) for a in admins), 20, "meet"
        )
        for index in range(self.masters):
            master_id = admins[index].cluster("myid")
            replica = admins[self.masters + index]
            wait_for(
                lambda r=replica, m=master_id: bool(r.cluster("replicate", m)), 20, "replicate"
            )
        wait_for(
            lambda: all(a.cluster("info")["cluster_state"] == "ok" for a in admins), 30, "state ok"
        )
        wait_for(self._replicas_in_sync, 30, "replicas in sync")
        for admin in admins:
            admin.close()
        return self

    def admin(self, node: EmbeddedServer) -> redis.Redis:
        return redis.Redis(port=node.port, decode_responses=True, single_connection_client=True)

    def _replicas_in_sync(self) -> bool:
        for node in self.nodes[self.masters :]:
            with self.admin(node) as replica:
                info = replica.info("replication")
                if info.get("role") != "slave" or info.get("master_link_status") != "up":
                    return False
        return True

    @property
    def startup_nodes(self) -> list[redis.cluster.ClusterNode]:
        return [redis.cluster.ClusterNode("127.0.0.1", n.port) for n in self.nodes]

    def client(self) -> redis.cluster.RedisCluster:
        return redis.cluster.RedisCluster(startup_nodes=self.startup_nodes)

    def master_of(self, key: str) -> EmbeddedServer:
        slot = key_slot(key.encode())
        for node in self.nodes:
            if node.process is None:
                continue
            with self.admin(node) as admin, contextlib.suppress(redis.RedisError):
                if admin.info("replication")["role"] == "master":
                    for start, end, *holders in admin.execute_command("CLUSTER", "SLOTS"):
                        if start <= slot <= end and int(holders[0][1]) == node.port:
                            return node
        raise AssertionError(f"no live master holds slot {slot}")

    def replicated(self, master: EmbeddedServer, timeout_ms: int = 5_000) -> int:
        """Block until the replica of `master` has every write made so far (a WAIT barrier).

        WAIT counts the replicas that acknowledged this connection's last write; the write
        here is a marker on `master`, and replication is one ordered stream, so a replica
        that has the marker has every earlier write too. Returns the replicas that did.
        """
        with self.admin(master) as admin:
            marker = self._key_on(admin)
            admin.set(marker, "1")
            return int(admin.execute_command("WAIT", 1, timeout_ms))

    def _key_on(self, admin: redis.Redis) -> str:
        for start, end, *holders in admin.execute_command("CLUSTER", "SLOTS"):
            if int(holders[0][1]) == admin.connection_pool.connection_kwargs["port"]:
                for probe in range(100_000):
                    key = f"wait-marker:{probe}"
                    if start <= key_slot(key.encode()) <= end:
                        return key
        raise AssertionError("the node holds no slot")

    def replica_of(self, master: EmbeddedServer) -> EmbeddedServer:
        for node in self.nodes:
            if node.process is None or node is master:
                continue
            with self.admin(node) as admin:
                info = admin.info("replication")
                if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
                    return node
        raise AssertionError(f"the master on port {master.port} has no replica")

    def kill_and_fail_over(self, master: EmbeddedServer, timeout_s: float = 30) -> EmbeddedServer:
        """SIGKILL `master`; return its replica once promoted and the cluster state is ok."""
        replica = self.replica_of(master)
        master.kill()

        def promoted() -> bool:
            with self.admin(replica) as admin:
                if admin.info("replication").get("role") != "master":
                    return False
            live = [n for n in self.nodes if n.process is not None]
            for node in live:
                with self.admin(node) as admin:
                    if admin.cluster("info")["cluster_state"] != "ok":
                        return False
            return True

        wait_for(promoted, timeout_s, f"failover of the master on port {master.port}")
        return replica

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
