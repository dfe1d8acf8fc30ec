"""An old pump of a rolling deploy leaves what it cannot send to the newer pumps instead of
re-taking it at every lease expiry (found by a probe, session 26).

Such an occurrence's lease was kept by the old pump, which woke at exactly its expiry and
claimed it again before a newer pump's next wake-up: the occurrence went out only once the
old workers were gone (up to 7 leases late in the probe's runs). Now the old pump keeps off
it for one lease more. Real server, two pumps on one queue, explicit clocks.
"""

from __future__ import annotations

from emq_bridge import Declaration, Occurrence, Pump, Repeat, define
from emq_bridge.errors import PermanentDispatchError
from emq_bridge.sync import sync

T0 = 1_900_000_000_000
SECOND = 1000
LEASE_MS = 10 * SECOND
NEW_TASK = "tick_v2"


class OldBroker:
    """The old version's broker: it does not know the renamed task."""

    def __init__(self) -> None:
        self.tries: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        self.tries.append(occurrence)
        raise PermanentDispatchError(f"{occurrence.name}: task {NEW_TASK!r} is not declared")


class NewBroker:
    def __init__(self) -> None:
        self.sent: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        self.sent.append(occurrence)


def test_an_old_pump_leaves_the_expired_lease_to_the_newer_pump_that_ticks_after_it(
    any_repeat: Repeat,
) -> None:
    declared = [Declaration("q", "tick", define(every="10s", template={"task": NEW_TASK}))]
    sync(any_repeat, declared, "app", generation=2)
    old, new = OldBroker(), NewBroker()
    old_pump = Pump(any_repeat, ["q"], old, lease_ms=LEASE_MS, code=("app", 1))
    new_pump = Pump(any_repeat, ["q"], new, lease_ms=LEASE_MS, code=("app", 2))
    first = old_pump.run_once(now_ms=T0 + 10 * SECOND)
    assert [o.name for o in first.failed] == ["tick"] and first.parked == []
    (failed,) = old.tries
    # Past the lease, the old pump ticks first (it woke at the expiry): it leaves it...
    after = old_pump.run_once(now_ms=T0 + 20 * SECOND + 1)
    assert [o.id for o in old.tries].count(failed.id) == 1
    assert after.next_wake_ms is not None and after.next_wake_ms > T0 + 20 * SECOND + 1
    # ...to the new pump, which sends it at its next tick (same id, marked redelivered).
    new_pump.run_once(now_ms=T0 + 20 * SECOND + 2)
    resent = [o for o in new.sent if o.id == failed.id]
    assert len(resent) == 1 and resent[0].redelivered
    # Were no newer pump to come, the old one tries it again one lease later.
    any_repeat.client.zadd(any_repeat.keys("q").leases, {failed.lease_member: 0})
    old_pump.run_once(now_ms=T0 + 31 * SECOND)
    assert [o.id for o in old.tries].count(failed.id) == 2
