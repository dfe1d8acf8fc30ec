"""The HTTP endpoint: `prometheus_client`'s own server, aware of its multiprocess mode."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .families import multiprocess_dir

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["MetricsServer", "exposition_registry", "serve"]


def exposition_registry(collectors: Iterable[Any] = ()) -> CollectorRegistry:
    """Return the registry to expose: `prometheus_client.REGISTRY`, or, in multiprocess mode
    (`PROMETHEUS_MULTIPROC_DIR` set), a fresh one whose `MultiProcessCollector` adds up every
    process's files, as prometheus_client prescribes. `collectors` are registered on it
    (scrape-time collectors such as `RegistrationsCollector`)."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    if multiprocess_dir() is None:
        registry = REGISTRY
    else:
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    for collector in collectors:
        registry.register(collector)
    return registry


@dataclass(slots=True)
class MetricsServer:
    """A running endpoint: `port` is the one bound (useful with port 0)."""

    host: str
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def serve(
    port: int, host: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> MetricsServer:
    """Serve `registry` (default: `exposition_registry()`) at `http://host:port/metrics` from a
    daemon thread; port 0 takes a free one. OSError if the address cannot be bound."""
    from prometheus_client import start_http_server

    target = exposition_registry() if registry is None else registry
    server, thread = start_http_server(port, addr=host, registry=target)
    return MetricsServer(host, int(server.server_port), server, thread)
