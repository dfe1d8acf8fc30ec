"""The metrics listeners count what pumps and workers tell, with the right lag, on any registry.

In-process: an injected clock fixes every nominal and sent time, so the lag each histogram
observes is known to the millisecond (the real-process tests are beside this file).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
import redis
from prometheus_client import REGISTRY, CollectorRegistry
from redis.backoff import NoBackoff
from redis.retry import Retry

from emq_bridge import Occurrence, Pump, PumpEvents, Repeat, define
from emq_bridge.errors import DispatchError
from emq_bridge.events import outcome_listeners
from emq_bridge.lifecycle import report_of
from emq_bridge.metrics import (
    MetricsEvents,
    RegistrationsCollector,
    install,
    install_outcomes,
    uninstall_outcomes,
)
from emq_bridge.reporting import Reporter
from emq_bridge.testing import ManualClock, RecordingDispatcher

T0 = 1_900_000_000_000
TEMPLATE = {"task": "reports.digest"}


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    found = CollectorRegistry()
    yield found
    uninstall_outcomes(found)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


class Missed(PumpEvents):
    def __init__(self) -> None:
        self.missed = 0

    def on_missed(self, queue: str, name: str, missed: int, due_ms: int) -> None:
        self.missed += missed


class Flaky:
    """Refuses every occurrence while `down`."""

    def __init__(self) -> None:
        self.down = True
        self.sent: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        if self.down:
            raise DispatchError("the broker is down")
        self.sent.append(occurrence)


def test_a_dispatch_is_counted_and_its_lag_is_sent_minus_nominal(
    repeat: Repeat, registry: CollectorRegistry
) -> None:
    clock = ManualClock(T0)
    repeat.register("mq", "digest", every="1m", template=TEMPLATE, now_ms=T0)
    due = repeat.next_runs("mq", "digest", 1)[0]
    pump = Pump(repeat, ["mq"], RecordingDispatcher(), clock=clock)
    install(pump, registry, registrations=False)
    clock.set(due + 3_000)  # 3 s late
    assert len(pump.run_once().dispatched) == 1

    assert value(registry, "emq_bridge_occurrences_dispatched_total", queue="mq") == 1
    assert value(registry, "emq_bridge_dispatch_lag_seconds_count", queue="mq") == 1
    lag = value(registry, "emq_bridge_dispatch_lag_seconds_sum", queue="mq")
    assert 3.0 <= lag < 3.5
    assert value(registry, "emq_bridge_dispatch_lag_seconds_bucket", queue="mq", le="2.5") == 0
    assert value(registry, "emq_bridge_dispatch_lag_seconds_bucket", queue="mq", le="5.0") == 1
    assert value(registry, "emq_bridge_pump_ticks_total") == 1
    assert value(registry, "emq_bridge_pump_last_tick_timestamp_seconds") > 0


def test_refused_sends_count_failed_and_their_re_sends_count_redispatched(
    repeat: Repeat, registry: CollectorRegistry
) -> None:
    clock = ManualClock(T0)
    repeat.register("mq", "digest", every="1m", template=TEMPLATE, now_ms=T0)
    due = repeat.next_runs("mq", "digest", 1)[0]
    broker = Flaky()
    pump = Pump(repeat, ["mq"], broker, clock=clock, lease_ms=1_000)
    install(pump, registry, registrations=False)
    clock.set(due)
    pump.run_once()
    assert value(registry, "emq_bridge_occurrences_failed_total", queue="mq") == 1
    broker.down = False
    clock.advance(1_500)  # the lease expired unacked: sent again, same id
    pump.run_once()
    assert [o.redelivered for o in broker.sent] == [True]
    assert value(registry, "emq_bridge_occurrences_redispatched_total", queue="mq") == 1
    assert value(registry, "emq_bridge_occurrences_dispatched_total", queue="mq") == 1
    # The re-send left 2.5 s after its slot: the lag of what reaches the broker.
    lag = value(registry, "emq_bridge_dispatch_lag_seconds_sum", queue="mq")
    assert 1.5 <= lag < 2.0


def test_slots_dropped_while_no_pump_ran_count_as_missed(
    repeat: Repeat, registry: CollectorRegistry
) -> None:
    clock = ManualClock(T0)
    repeat.register("mq", "tick", every="1s", template=TEMPLATE, now_ms=T0)
    journal = Missed()
    pump = Pump(repeat, ["mq"], RecordingDispatcher(), clock=clock, listeners=[journal])
    install(pump, registry, registrations=False)
    clock.advance(30_500)
    pump.run_once()
    assert journal.missed > 0
    assert value(registry, "emq_bridge_occurrences_missed_total", queue="mq") == journal.missed


def test_worker_reports_count_by_status_and_a_first_start_observes_the_run_lag(
    repeat: Repeat, registry: CollectorRegistry
) -> None:
    install_outcomes(registry)
    repeat.register("mq", "digest", every="1m", template=TEMPLATE, now_ms=T0)
    occurrence = {"id": "o-1", "queue": "mq", "name": "digest", "due_ms": T0}
    retry = {**occurrence, "id": "o-2", "due_ms": T0 + 60_000}
    repeat.report(
        [
            report_of("started", occurrence, at_ms=T0 + 1_500),
            report_of("succeeded", occurrence, at_ms=T0 + 2_000),
            report_of("started", retry, at_ms=T0 + 60_200),
            report_of("retrying", retry, at_ms=T0 + 60_300, error="boom", hold_ms=1_000),
            report_of("started", retry, attempt=2, at_ms=T0 + 65_000),
            report_of("heartbeat", retry, attempt=2, at_ms=T0 + 66_000),
            report_of("failed", retry, attempt=2, at_ms=T0 + 67_000, error="boom"),
        ]
    )
    counts = {
        status: value(registry, "emq_bridge_outcomes_total", queue="mq", status=status)
        for status in ("started", "succeeded", "retrying", "failed", "heartbeat")
    }
    assert counts == {"started": 3, "succeeded": 1, "retrying": 1, "failed": 1, "heartbeat": 0}
    # Run lag of first attempts only: 1.5 s and 0.2 s (a retry is late by its countdown).
    assert value(registry, "emq_bridge_run_lag_seconds_count", queue="mq") == 2
    assert value(registry, "emq_bridge_run_lag_seconds_sum", queue="mq") == pytest.approx(1.7)
    assert value(registry, "emq_bridge_run_lag_seconds_bucket", queue="mq", le="0.25") == 1


def test_a_start_the_reporter_folds_into_its_end_still_counts_and_observes_its_lag(
    redis_url: str, prefix: str, registry: CollectorRegistry
) -> None:
    install_outcomes(registry)
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    repeat.register("mq", "digest", every="1m", template=TEMPLATE, now_ms=T0)
    occurrence = {"id": "o-1", "queue": "mq", "name": "digest", "due_ms": T0}
    reporter = Reporter(repeat, linger_s=0.2)  # both wait in one batch: folded into one
    reporter.report(report_of("started", occurrence, at_ms=T0 + 4_000))
    reporter.report(report_of("succeeded", occurrence, at_ms=T0 + 4_100))
    assert reporter.flush()
    reporter.close()
    assert value(registry, "emq_bridge_outcomes_total", queue="mq", status="started") == 1
    assert value(registry, "emq_bridge_outcomes_total", queue="mq", status="succeeded") == 1
    assert value(registry, "emq_bridge_run_lag_seconds_sum", queue="mq") == pytest.approx(4.0)
    assert repeat.history("mq", "digest")[0].started_ms == T0 + 4_000
    repeat.close()


def test_install_outcomes_twice_adds_one_listener(registry: CollectorRegistry) -> None:
    before = len(outcome_listeners.listeners)
    first = install_outcomes(registry)
    assert install_outcomes(registry) is first
    assert len(outcome_listeners.listeners) == before + 1
    uninstall_outcomes(registry)
    assert len(outcome_listeners.listeners) == before
    # The default registry, named or not, is one registry: one listener.
    uninstall_outcomes()  # an earlier test of this process may have installed it
    before = len(outcome_listeners.listeners)
    install_outcomes(REGISTRY)
    install_outcomes()
    assert len(outcome_listeners.listeners) == before + 1
    uninstall_outcomes()
    assert len(outcome_listeners.listeners) == before


def test_install_on_the_default_registry_named_or_not_adds_one_listener(repeat: Repeat) -> None:
    pump = Pump(repeat, ["mq"], RecordingDispatcher())
    first = install(pump, outcomes=False, registrations=False)
    assert install(pump, REGISTRY, outcomes=False, registrations=False) is first
    assert install(pump, outcomes=False, registrations=False) is first
    assert sum(isinstance(each, MetricsEvents) for each in pump.events.listeners) == 1


def test_registrations_are_counted_by_state_on_each_scrape(
    repeat: Repeat, registry: CollectorRegistry
) -> None:
    for name in ("a", "b", "c", "d"):
        repeat.register("mq", name, every="1m", template=TEMPLATE, now_ms=T0)
    registry.register(RegistrationsCollector(repeat, ["mq", "empty"]))
    assert value(registry, "emq_bridge_registrations", queue="mq", state="active") == 4
    repeat.pause("mq", "a")
    template = repeat.load_records("mq", ["b"], ("template",))["b"]["template"]
    repeat.park("mq", "b", [], deadline_ms=0, template=template, reason="no such task", now_ms=T0)
    # A one-off whose instant passed is completed (+inf too), not paused.
    past = datetime.fromtimestamp((T0 - 60_000) / 1000, tz=timezone.utc)
    repeat.register("mq", "once", at=past, template=TEMPLATE, now_ms=T0)
    states = {
        state: value(registry, "emq_bridge_registrations", queue="mq", state=state)
        for state in ("active", "paused", "parked", "completed")
    }
    assert states == {"active": 2, "paused": 1, "parked": 1, "completed": 1}
    assert value(registry, "emq_bridge_registrations", queue="empty", state="active") == 0


def test_a_schedule_stopped_by_pause_after_failures_is_counted_parked(
    repeat: Repeat, registry: CollectorRegistry
) -> None:
    # As `list` and `show --json` give it (docs/metrics.md, docs/lifecycle.md).
    repeat.register("mq", "flaky", every="1m", template=TEMPLATE, pause_after_failures=1)
    registry.register(RegistrationsCollector(repeat, ["mq"]))
    recorder = RecordingDispatcher()
    repeat.trigger("mq", "flaky")
    Pump(repeat, ["mq"], recorder).run_once()
    [occurrence] = recorder.clear()
    assert repeat.finished(occurrence, ok=False, error="ValueError: no rows")
    flaky = repeat.get("mq", "flaky")
    assert flaky is not None and flaky.parked_reason is not None
    assert value(registry, "emq_bridge_registrations", queue="mq", state="parked") == 1
    assert value(registry, "emq_bridge_registrations", queue="mq", state="paused") == 0


def test_two_pumps_installed_on_one_registry_share_one_registrations_family(
    repeat: Repeat, registry: CollectorRegistry
) -> None:
    repeat.register("a", "x", every="1m", template=TEMPLATE, now_ms=T0)
    repeat.register("b", "y", every="1m", template=TEMPLATE, now_ms=T0)
    first = Pump(repeat, ["a"], RecordingDispatcher())
    second = Pump(repeat, ["b"], RecordingDispatcher())
    events = install(first, registry, outcomes=False)
    assert install(first, registry, outcomes=False) is events  # once per pump and registry
    install(second, registry, outcomes=False)
    assert value(registry, "emq_bridge_registrations", queue="a", state="active") == 1
    assert value(registry, "emq_bridge_registrations", queue="b", state="active") == 1
    repeat.trigger("a", "x")
    first.run_once()
    assert value(registry, "emq_bridge_occurrences_dispatched_total", queue="a") == 1


def test_a_scrape_goes_on_without_the_registrations_when_redis_is_down(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    gone = Repeat(unreachable)
    events = MetricsEvents(registry)
    events.on_outage_begin(ConnectionError("gone"))
    events.on_outage_end(2.5)
    registry.register(RegistrationsCollector(gone, ["mq"]))
    labels = {"queue": "mq", "state": "active"}
    assert registry.get_sample_value("emq_bridge_registrations", labels) is None
    assert value(registry, "emq_bridge_outages_total") == 1
    assert value(registry, "emq_bridge_outage_seconds_total") == 2.5
    assert "left out of the scrape" in caplog.text


def test_importing_emq_bridge_metrics_does_not_import_prometheus_client() -> None:
    # Its multiprocess mode is chosen when it is imported; Dramatiq's middleware sets the
    # directory only after the app module was loaded.
    code = "import sys, emq_bridge.metrics; assert 'prometheus_client' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_jittered_slot_is_late_from_its_jittered_instant_not_its_nominal_time(
    repeat: Repeat, registry: CollectorRegistry
) -> None:
    # Found by a probe (session 25): the jitter counted as lateness, so an on-time pump put a
    # jittered schedule's sends in the 2.5-10 s buckets, and latency alerts could not tell.
    clock = ManualClock(T0)
    spread = define(every="1m", jitter="50s", template=TEMPLATE)
    repeat.upsert("mq", "spread", definition=spread, now_ms=T0)
    registration = repeat.get("mq", "spread")
    assert registration is not None and registration.next_run_ms is not None
    send_at = registration.next_run_ms  # the jittered instant its slot is sent at
    sent = RecordingDispatcher()
    pump = Pump(repeat, ["mq"], sent, clock=clock)
    install(pump, registry, registrations=False)
    clock.set(send_at + 1_000)  # 1 s late
    [occurrence] = pump.run_once().dispatched
    assert send_at - occurrence.due_ms >= 5_000  # a jitter well above the lag below
    assert occurrence.send_at_ms == send_at
    lag = value(registry, "emq_bridge_dispatch_lag_seconds_sum", queue="mq")
    assert 1.0 <= lag < 1.5
