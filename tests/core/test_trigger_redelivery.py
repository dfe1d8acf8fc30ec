"""A triggered occurrence: sent once, and re-sent as `redelivered` only after a pump died with it.

A pump that "dies" between claim and ack is the registry moves run by hand: `scan` and
`claim`, and no `ack`. Time is an injected clock; nothing sleeps.
"""

from __future__ import annotations

import json

import pytest

from emq_bridge import ListPushDispatcher, Pump, Repeat, occurrence_id
from emq_bridge.testing import RecordingDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
HOUR = 3_600_000
LEASE_MS = 60_000
TEMPLATE = {"task": "reports.digest"}


def die_after_claim(repeat: Repeat, queue: str, now_ms: int) -> list[str]:
    """Scan and claim what is due in `queue` as a pump would, then never dispatch or ack."""
    scan = repeat.scan(queue, 100, now_ms)
    candidates = [(name, score, score + HOUR, 0, "fire") for name, score in scan.due]
    return repeat.claim(queue, now_ms, LEASE_MS, candidates, scan.expired).released


def test_a_trigger_whose_pump_died_before_the_ack_is_re_sent_with_its_id_as_redelivered(
    any_repeat: Repeat,
) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    triggered = any_repeat.trigger("reports", "digest", now_ms=T0 + 10)
    assert die_after_claim(any_repeat, "reports", T0 + 20) == [f"digest {T0 + 10} manual"]
    recorder = RecordingDispatcher()
    pump = Pump(any_repeat, ["reports"], recorder, lease_ms=LEASE_MS)

    pump.run_once(now_ms=T0 + 20 + LEASE_MS - 1)  # the dead pump's lease still holds
    assert recorder.occurrences == []
    pump.run_once(now_ms=T0 + 20 + LEASE_MS)
    pump.run_once(now_ms=T0 + 20 + 3 * LEASE_MS)

    [resent] = recorder.occurrences
    assert resent.id == triggered
    assert (resent.due_ms, resent.redelivered, resent.triggered) == (T0 + 10, True, True)
    assert any_repeat.leases("reports") == []
    assert any_repeat.get("reports", "digest").next_run_ms == T0 + HOUR  # type: ignore[union-attr]


def test_a_trigger_is_sent_once_and_not_marked_redelivered(any_repeat: Repeat) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    triggered = any_repeat.trigger("reports", "digest", now_ms=T0 + 10)
    recorder = RecordingDispatcher()
    pump = Pump(any_repeat, ["reports"], recorder, lease_ms=LEASE_MS)
    for step in range(4):
        pump.run_once(now_ms=T0 + 20 + step * LEASE_MS)
    [sent] = recorder.occurrences
    assert (
        sent.id
        == triggered
        == occurrence_id(any_repeat.prefix, "reports", "digest", T0 + 10, triggered=True)
    )
    assert (sent.redelivered, sent.triggered) == (False, True)
    assert any_repeat.leases("reports") == []


@pytest.mark.parametrize("score", [0, T0 + 15], ids=["as-old-trigger-wrote-it", "re-leased"])
def test_an_old_style_manual_lease_is_still_sent_once_as_a_trigger(
    any_repeat: Repeat, score: int
) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    any_repeat.client.zadd(any_repeat.keys("reports").leases, {f"digest {T0 + 5} manual": score})
    recorder = RecordingDispatcher()
    pump = Pump(any_repeat, ["reports"], recorder, lease_ms=LEASE_MS)
    for step in range(3):
        pump.run_once(now_ms=T0 + 20 + step * LEASE_MS)
    [sent] = recorder.occurrences
    assert sent.id == occurrence_id(any_repeat.prefix, "reports", "digest", T0 + 5, triggered=True)
    assert (sent.due_ms, sent.redelivered, sent.triggered) == (T0 + 5, False, True)
    assert any_repeat.leases("reports") == []


def test_two_pumps_claiming_one_trigger_take_it_once(any_repeat: Repeat) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    any_repeat.trigger("reports", "digest", now_ms=T0 + 10)
    first = any_repeat.scan("reports", 10, T0 + 20)
    second = any_repeat.scan("reports", 10, T0 + 20)
    assert first.expired == second.expired == [f"digest {T0 + 10} manual"]
    assert any_repeat.claim("reports", T0 + 20, LEASE_MS, [], first.expired).released == [
        f"digest {T0 + 10} manual"
    ]
    assert any_repeat.claim("reports", T0 + 20, LEASE_MS, [], second.expired).released == []
    assert any_repeat.leases("reports") == [("digest", T0 + 10, T0 + 20 + LEASE_MS)]


def test_a_trigger_repeated_in_the_millisecond_of_one_in_flight_is_one_of_its_own(
    any_repeat: Repeat,
) -> None:
    # Each trigger is an occurrence of its own (session 26: the repeated one took the id of
    # the one in flight, which then went out twice once that one was acked).
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    triggered = any_repeat.trigger("reports", "digest", now_ms=T0 + 10)
    die_after_claim(any_repeat, "reports", T0 + 20)
    again = any_repeat.trigger("reports", "digest", now_ms=T0 + 10)
    assert again != triggered
    recorder = RecordingDispatcher()
    pump = Pump(any_repeat, ["reports"], recorder, lease_ms=LEASE_MS)

    pump.run_once(now_ms=T0 + 30)  # the first is in flight (its lease carries it): the second goes
    [second] = recorder.occurrences
    assert (second.id, second.redelivered, second.triggered) == (again, False, True)
    recorder.clear()
    pump.run_once(now_ms=T0 + 20 + LEASE_MS)
    [resent] = recorder.occurrences
    assert (resent.id, resent.redelivered, resent.triggered) == (triggered, True, True)
    assert any_repeat.leases("reports") == []


def test_cancel_drops_a_pending_trigger_and_the_lease_of_a_claimed_one(
    any_repeat: Repeat,
) -> None:
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    any_repeat.register("reports", "other", every="1h", template=TEMPLATE, now_ms=T0)
    any_repeat.trigger("reports", "digest", now_ms=T0 + 10)
    die_after_claim(any_repeat, "reports", T0 + 20)
    any_repeat.trigger("reports", "digest", now_ms=T0 + 30)
    any_repeat.trigger("reports", "other", now_ms=T0 + 30)
    assert len(any_repeat.leases("reports")) == 3
    assert any_repeat.cancel("reports", "digest") is True
    assert any_repeat.leases("reports") == [("other", T0 + 30, 0)]


def test_a_list_message_carries_the_redelivered_and_triggered_flags(
    any_repeat: Repeat, prefix: str
) -> None:
    out = f"{prefix}:out"
    any_repeat.register("reports", "digest", every="1h", template=TEMPLATE, now_ms=T0)
    triggered = any_repeat.trigger("reports", "digest", now_ms=T0 + 10)
    die_after_claim(any_repeat, "reports", T0 + 20)
    pump = Pump(any_repeat, ["reports"], ListPushDispatcher(any_repeat.client, out))
    pump.run_once(now_ms=T0 + 20 + LEASE_MS)  # the dead pump's trigger, re-sent
    any_repeat.trigger("reports", "digest", now_ms=T0 + HOUR - 1)
    pump.run_once(now_ms=T0 + HOUR)  # a fresh trigger and the scheduled slot

    messages = [json.loads(m) for m in any_repeat.client.lrange(out, 0, -1)]
    flags = {(m["id"], m["due_ms"]): (m["redelivered"], m["triggered"]) for m in messages}
    fresh = occurrence_id(any_repeat.prefix, "reports", "digest", T0 + HOUR - 1, triggered=True)
    slot = occurrence_id(any_repeat.prefix, "reports", "digest", T0 + HOUR)
    assert flags == {
        (triggered, T0 + 10): (True, True),
        (fresh, T0 + HOUR - 1): (False, True),
        (slot, T0 + HOUR): (False, False),
    }
    assert all(m["template"] == TEMPLATE and m["queue"] == "reports" for m in messages)
