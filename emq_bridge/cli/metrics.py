"""`emq-bridge pump --metrics-port N`: the pump's metrics over HTTP (emq_bridge.metrics)."""

from __future__ import annotations

from typing import Any

import click

from ..pump import Pump

__all__ = ["metrics_options", "require_metrics", "serve_pump_metrics"]


def metrics_options(command: Any) -> Any:
    """Add --metrics-port and --metrics-host to the pump command."""
    command = click.option(
        "--metrics-host",
        default="127.0.0.1",
        show_default=True,
        help="Address the metrics endpoint binds (0.0.0.0 for every interface).",
    )(command)
    return click.option(
        "--metrics-port",
        type=click.IntRange(min=0, max=65535),
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (needs "
        "emq-bridge[metrics]; docs/metrics.md).",
    )(command)


def require_metrics() -> None:
    """Exit 1, saying which extra to install, when prometheus_client is missing: checked
    before the pump loads its app or syncs anything."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise click.ClickException(
            "--metrics-port needs prometheus_client: pip install 'emq-bridge[metrics]'"
        ) from None


def serve_pump_metrics(pump: Pump, host: str, port: int) -> str:
    """Count `pump`'s events (`emq_bridge.metrics.install`) and serve them; return the URL.

    A missing prometheus_client or an address that cannot be bound is an error (exit 1)."""
    require_metrics()
    from ..metrics import RegistrationsCollector, exposition_registry, install, serve
    from ..metrics.families import multiprocess_dir

    # Counted on prometheus_client.REGISTRY; served from it, or, under
    # PROMETHEUS_MULTIPROC_DIR, from a registry adding up the directory's files (which
    # then needs the scrape-time registrations collector of its own).
    install(pump)
    scraped = [RegistrationsCollector(pump.repeat, pump.queues)] if multiprocess_dir() else []
    try:
        server = serve(port, host, exposition_registry(scraped))
    except OSError as exc:
        raise click.ClickException(f"cannot serve metrics on {host}:{port}: {exc}") from None
    return server.url
