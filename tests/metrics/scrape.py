"""Scraping helpers for the metrics tests: read an endpoint, free ports, wait for a value."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(url: str) -> Samples:
    """Every sample of the endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(body):
        for found in family.samples:
            key = (found.name, tuple(sorted(found.labels.items())))
            assert key not in samples, f"a series twice in one scrape: {key}"
            samples[key] = found.value
    return samples


def sample(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(
    read: Callable[[], Samples], done: Callable[[Samples], bool], timeout_s: float
) -> Samples:
    """Scrape until `done` holds (its last scrape), or fail with the last one."""
    deadline = time.monotonic() + timeout_s
    last: Samples = {}
    while time.monotonic() < deadline:
        try:
            last = read()
        except OSError:  # not listening yet
            time.sleep(0.1)
            continue
        if done(last):
            return last
        time.sleep(0.1)
    interesting = {k: v for k, v in last.items() if k[0].startswith("emq_bridge")}
    raise AssertionError(f"the scrape never got there; last: {interesting}")
