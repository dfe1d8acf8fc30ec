"""A `RegistrationsCollector` scraped before a fork still reads the registry in the child
(found by a probe of preloading web servers, session 34): its executor's thread was the
parent's, so every scrape in a child (a gunicorn `--preload` worker, a `multiprocessing`
fork) waited the whole read timeout (5 s), left `emq_bridge_registrations` out and said the
registry could not be read. Real server, a real fork."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from emq_bridge import Repeat
from emq_bridge.metrics import RegistrationsCollector

pytest.importorskip("prometheus_client")


def _scrape_in_child(collector: RegistrationsCollector, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    started = time.monotonic()
    families = list(collector.collect())
    samples = {(s.labels["queue"], s.labels["state"]): s.value for f in families for s in f.samples}
    out.put((time.monotonic() - started, samples))


def test_a_collector_scraped_before_a_fork_reads_in_the_child(repeat: Repeat) -> None:
    repeat.upsert("reports", "digest", every="15m", template={"task": "d"})
    collector = RegistrationsCollector(repeat, ["reports"])
    collector.read_timeout_s = 3.0
    assert list(collector.collect())  # the parent scraped: its executor has its thread
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_scrape_in_child, args=(collector, out))
    child.start()
    took, samples = out.get(timeout=30)
    child.join(10)
    assert samples.get(("reports", "active")) == 1, samples  # before: no family at all
    assert took < collector.read_timeout_s  # before: the whole timeout, every scrape
