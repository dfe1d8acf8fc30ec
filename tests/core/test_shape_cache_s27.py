"""The pump's cache of decoded shapes (what registrations that differ only in their template
share) keeps no template: each registration brings its own, which the byte-bounded cache of
whole decodes holds. Before (session 27's soak probe), each shape kept its first
registration's decoded template outside that bound: 2,000 registrations of their own shape
with 21 KB templates grew a pump by about 500 MB."""

from __future__ import annotations

from emq_bridge import Pump, Repeat
from emq_bridge.testing import RecordingDispatcher


def test_shapes_hold_no_template_and_each_firing_its_own(repeat: Repeat) -> None:
    hour_ago = repeat.server_time_ms() - 3_600_000
    for i in range(50):
        template = {"task": "t", "args": [i, "x" * 2_000]}
        # Its own label: a shape of its own.
        repeat.register(
            "q", f"s{i}", every="1h", template=template, labels={"n": str(i)}, now_ms=hour_ago
        )
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    pump.run_once()
    assert sorted(o.template["args"][0] for o in recorder.occurrences) == list(range(50))
    shapes = pump._shapes  # what the defect was: the cache's own contents
    assert len(shapes) == 50
    assert all(len(firing.template) == 0 for firing in shapes.values())
