"""The Python API stored task names that a schedule file, `add` and a `beat_schedule` refuse
(a control character, a line break, a format character), and `export` then left those
schedules out as unreadable (found by a probe of definition fidelity, session 33). `define`,
so `upsert` and `register`, refuse them too now, naming the field, and write nothing.
"""

from __future__ import annotations

import pytest

from emq_bridge import Repeat, ScheduleError, define


@pytest.mark.parametrize("bad", ["\x00", "\n", "\x7f", "\x85", "\u2028", "\ufeff", "\u200b"])
def test_the_api_refuses_a_task_name_every_other_surface_refuses(
    any_repeat: Repeat, bad: str
) -> None:
    with pytest.raises(ScheduleError, match=r"^template's task: task .* control characters"):
        any_repeat.upsert("q", "n", every="1m", template={"task": f"app.t{bad}x"})
    with pytest.raises(ScheduleError, match="control characters"):
        define(every="1m", template={"task": f"app.t{bad}x"})
    assert any_repeat.get("q", "n") is None
    any_repeat.upsert("q", "n", every="1m", template={"task": "app.tâche"})  # text is fine
