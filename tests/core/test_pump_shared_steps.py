"""A batch decides the misfire step once for registrations that share a cadence and a due
instant, and never shares it across what tells them apart."""

from __future__ import annotations

from datetime import datetime, timezone

from emq_bridge import Pump, Repeat
from emq_bridge.cadence import Cadence
from emq_bridge.testing import ManualClock, RecordingDispatcher

HOUR = 3_600_000
T0 = int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)  # on every grid


def test_registrations_sharing_a_cadence_and_due_instant_each_get_their_own_policy(
    repeat: Repeat,
) -> None:
    for i in range(5):
        for misfire in ("latest", "skip"):
            repeat.register(
                "q",
                f"{misfire}-{i}",
                every="1h",
                misfire=misfire,
                template={"task": "t", "args": [i]},
                now_ms=T0,
            )
    shared: list[Cadence] = []

    def one_cadence(queue: str, name: str, cadence: Cadence) -> Cadence:
        # Every registration gets the very same cadence object, whatever its policy.
        if not shared:
            shared.append(cadence)
        return shared[0]

    clock = ManualClock(T0 + 3 * HOUR + 30 * 60_000)  # three slots passed, half an hour late
    dispatcher = RecordingDispatcher()
    pump = Pump(repeat, ["q"], dispatcher, clock=clock, resolve_cadence=one_cadence)
    pump.run_once()
    fired = sorted(o.name for o in dispatcher.occurrences)
    assert fired == [f"latest-{i}" for i in range(5)]  # `skip` drops a slot this late
    assert {o.due_ms for o in dispatcher.occurrences} == {T0 + 3 * HOUR}
    for i in range(5):
        assert repeat.get("q", f"skip-{i}").next_run_ms == T0 + 4 * HOUR  # type: ignore[union-attr]
        assert repeat.get("q", f"latest-{i}").next_run_ms == T0 + 4 * HOUR  # type: ignore[union-attr]


def test_registrations_due_at_different_instants_are_not_given_one_step(repeat: Repeat) -> None:
    repeat.register("q", "early", every="1h", template={"task": "t"}, now_ms=T0)
    repeat.register("q", "late", every="2h", template={"task": "t"}, now_ms=T0)
    clock = ManualClock(T0 + 2 * HOUR)
    dispatcher = RecordingDispatcher()
    Pump(repeat, ["q"], dispatcher, clock=clock).run_once()
    assert sorted((o.name, o.due_ms) for o in dispatcher.occurrences) == [
        ("early", T0 + 2 * HOUR),
        ("late", T0 + 2 * HOUR),
    ]
    assert repeat.get("q", "early").next_run_ms == T0 + 3 * HOUR  # type: ignore[union-attr]
    assert repeat.get("q", "late").next_run_ms == T0 + 4 * HOUR  # type: ignore[union-attr]
