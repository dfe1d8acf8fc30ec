"""`Repeat.pumps()` returns `PumpInfo` values, which a typed caller imports from the package
(found by a probe of the typed public API, session 35: only `emq_bridge.heartbeat` had it,
though docs/health.md names it)."""

from __future__ import annotations

from emq_bridge import Pump, PumpInfo, Repeat
from emq_bridge.testing import RecordingDispatcher


def test_the_pumps_a_registry_lists_are_pump_infos_of_the_package(repeat: Repeat) -> None:
    repeat.upsert("q", "job", every="1h", template={"task": "t"})
    pump = Pump(repeat, ["q"], RecordingDispatcher())
    pump.step()
    found: list[PumpInfo] = repeat.pumps(["q"])
    assert [type(info) for info in found] == [PumpInfo]
    assert found[0].id == pump.heartbeat.id
