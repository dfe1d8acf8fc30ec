"""A throwaway Redis Sentinel deployment: one master, one replica, one sentinel, on loopback.

Every server asks for a password (the sentinel its own), so a `redis+sentinel://` URL must
carry both to work. The sentinel declares the master down after `DOWN_AFTER_MS` and, being
the only one (quorum 1), promotes the replica on its own. `kill_master()` SIGKILLs the
master and waits until the sentinel names the replica.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from emq_bridge.embedded import EmbeddedServer, find_server_binary

from .conftest import die_with_parent, free_port

MASTER_NAME = "mymaster"
PASSWORD = "data-pw-7Kq"
SENTINEL_PASSWORD = "sentinel-pw-3Zx"
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 3_000


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if condition():
                return
        time.sleep(0.05)
    raise AssertionError(f"sentinel: {what} did not happen within {timeout_s}s")


@dataclass
class SentinelDeployment:
    master: EmbeddedServer | None = None
    replica: EmbeddedServer | None = None
    sentinel_port: int = 0
    sentinel_process: subprocess.Popen[bytes] | None = None
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="emq-sentinel-")))

    def start(self) -> SentinelDeployment:
        # The password is set once the server answers: EmbeddedServer waits for a PONG.
        auth = ["--masterauth", PASSWORD, "--repl-diskless-sync-delay", "0"]  # sync at once
        self.master = EmbeddedServer(port=free_port(), extra_args=auth).start()
        self.replica = EmbeddedServer(
            port=free_port(),
            extra_args=[*auth, "--replicaof", "127.0.0.1", str(self.master.port)],
        ).start()
        for server in (self.master, self.replica):
            with redis.Redis(port=server.port) as admin:
                admin.config_set("requirepass", PASSWORD)
        wait_for(lambda: self._link_up(self.replica_admin()), 20, "the replica in sync")
        self.sentinel_port = free_port()
        config = self.directory / "sentinel.conf"
        config.write_text(
            f"port {self.sentinel_port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.directory}\n"
            f"requirepass {SENTINEL_PASSWORD}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel auth-pass {MASTER_NAME} {PASSWORD}\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
        )
        self.sentinel_process = subprocess.Popen(
            [find_server_binary(), str(config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
        )
        wait_for(self._sees_the_replica, 20, "the sentinel seeing the replica")
        return self

    def url(self, path: str = f"/{MASTER_NAME}", *, query: str = "") -> str:
        """The `redis+sentinel://` URL of the deployment, with both passwords."""
        extra = f"&{query}" if query else ""
        return (
            f"redis+sentinel://:{PASSWORD}@127.0.0.1:{self.sentinel_port}{path}"
            f"?sentinel_password={SENTINEL_PASSWORD}&socket_timeout=2{extra}"
        )

    def sentinel_admin(self) -> redis.Redis:
        return redis.Redis(
            port=self.sentinel_port, password=SENTINEL_PASSWORD, decode_responses=True
        )

    def replica_admin(self) -> redis.Redis:
        assert self.replica is not None
        return redis.Redis(port=self.replica.port, password=PASSWORD, decode_responses=True)

    def master_port(self) -> int:
        """The port of the master the sentinel names now, as redis-py asks (SENTINEL MASTERS).

        During a failover GET-MASTER-ADDR-BY-NAME names the promoted replica already, but
        SENTINEL MASTERS, which redis-py reads, names the old master until it is over.
        """
        with self.sentinel_admin() as admin:
            return int(admin.sentinel_master(MASTER_NAME)["port"])

    def replicated(self, timeout_ms: int = 5_000) -> int:
        """Block until the replica has every write made so far on the master (WAIT barrier).

        WAIT counts the replicas that acknowledged this connection's last write; the write is
        a marker, and replication is one ordered stream, so the replica then has every
        earlier write too. Returns the replicas that did.
        """
        assert self.master is not None
        with redis.Redis(port=self.master.port, password=PASSWORD) as admin:
            admin.set("wait-marker", "1")
            return int(admin.execute_command("WAIT", 1, timeout_ms))

    def kill_master(self, timeout_s: float = 20) -> EmbeddedServer:
        """SIGKILL the master; return the replica once the sentinel names it the master."""
        assert self.master is not None and self.replica is not None
        self.master.kill()
        promoted = self.replica

        def switched() -> bool:
            with self.replica_admin() as admin:
                is_master = admin.info("replication")["role"] == "master"
            return is_master and self.master_port() == promoted.port

        wait_for(switched, timeout_s, "the replica promoted")
        return promoted

    def stop(self) -> None:
        if self.sentinel_process is not None:
            self.sentinel_process.kill()
            self.sentinel_process.wait()
            self.sentinel_process = None
        for server in (self.master, self.replica):
            if server is not None:
                server.stop()
        with contextlib.suppress(OSError):
            for path in self.directory.iterdir():
                path.unlink()
            self.directory.rmdir()

    @staticmethod
    def _link_up(admin: redis.Redis) -> bool:
        with admin:
            info = admin.info("replication")
            return info.get("role") == "slave" and info.get("master_link_status") == "up"

    def _sees_the_replica(self) -> bool:
        assert self.replica is not None
        with self.sentinel_admin() as admin:
            replicas = admin.sentinel_slaves(MASTER_NAME)
        return any(
            int(r["port"]) == self.replica.port and not r["is_sdown"] and not r["is_odown"]
            for r in replicas
        )
