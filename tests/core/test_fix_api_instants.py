"""A naive datetime names no instant, a template's copy is what the docs say, and the nominal
slot of a run has a typed public reader for any cadence.

`ManualClock(datetime(2030, 1, 1))` read the naive time as the host's local time (another
instant under TZ=Europe/Paris); `dict(template)` was documented as a changeable copy but is
shallow; docs/cron.md read `cadence.nominal(at)`, which only a jittered cadence has.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from emq_bridge import Repeat, ScheduleError, define
from emq_bridge.jitter import nominal_slot
from emq_bridge.millis import instant_ms
from emq_bridge.template import READ_ONLY, FrozenDict, FrozenList
from emq_bridge.testing import ManualClock, RecordingDispatcher, manual_pump

NAIVE = datetime(2030, 1, 1)
NEW_YEAR_2030_MS = 1_893_456_000_000


def test_a_manual_clock_refuses_a_naive_datetime() -> None:
    with pytest.raises(ScheduleError, match="has no time zone, so it names no instant"):
        ManualClock(NAIVE)
    clock = ManualClock(NEW_YEAR_2030_MS)
    with pytest.raises(ScheduleError, match="names no instant"):
        clock.set(NAIVE + timedelta(hours=1))
    assert clock() == NEW_YEAR_2030_MS  # unchanged


def test_a_manual_clock_reads_an_aware_datetime_the_same_in_every_host_zone() -> None:
    code = (
        "from datetime import datetime, timezone\n"
        "from zoneinfo import ZoneInfo\n"
        "from emq_bridge.testing import ManualClock\n"
        "print(ManualClock(datetime(2030, 1, 1, tzinfo=timezone.utc)).now_ms,"
        " ManualClock(datetime(2030, 1, 1, 1, tzinfo=ZoneInfo('Europe/Paris'))).now_ms)\n"
        "try:\n"
        "    ManualClock(datetime(2030, 1, 1))\n"
        "except ValueError as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    outputs = set()
    for zone in ("UTC", "Europe/Paris", "America/New_York"):
        env = {**os.environ, "TZ": zone}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(done.stdout)
    assert outputs == {f"{NEW_YEAR_2030_MS} {NEW_YEAR_2030_MS}\nScheduleError\n"}


def test_instant_ms_refuses_a_naive_datetime_and_reads_an_aware_one_exactly() -> None:
    with pytest.raises(ScheduleError, match="names no instant"):
        instant_ms(NAIVE)
    paris = datetime(2030, 1, 1, 1, 0, 0, 1500, tzinfo=ZoneInfo("Europe/Paris"))
    assert instant_ms(paris) == NEW_YEAR_2030_MS + 1
    assert instant_ms(paris, ceil=True) == NEW_YEAR_2030_MS + 2


def test_a_manual_pump_fires_at_the_instant_an_aware_clock_names(repeat: Repeat) -> None:
    clock = ManualClock(datetime(2030, 1, 1, 1, tzinfo=ZoneInfo("Europe/Paris")))
    repeat.upsert("q", "hourly", every="1h", template={"task": "t"}, now_ms=clock())
    recorder = RecordingDispatcher()
    pump = manual_pump(repeat, ["q"], clock, recorder)
    clock.advance(timedelta(hours=1))
    pump.run_once()
    assert [o.due_ms for o in recorder.occurrences] == [NEW_YEAR_2030_MS + 3_600_000]


def test_a_deep_copy_of_a_fired_template_changes_all_the_way_down_and_dict_is_shallow(
    repeat: Repeat,
) -> None:
    template = {"task": "t", "args": [1, {"n": 2}], "kwargs": {"x": {"y": 1}}}
    now = int(time.time() * 1000)
    repeat.upsert("q", "job", every="1h", template=template, immediately=True, now_ms=now)
    recorder = RecordingDispatcher()
    manual_pump(repeat, ["q"], ManualClock(now + 1), recorder).run_once()
    [occurrence] = recorder.occurrences
    shared = occurrence.template
    assert isinstance(shared, FrozenDict)

    deep = copy.deepcopy(shared)  # what the docs and the error now say: changeable throughout
    deep["kwargs"]["x"]["y"] = 2
    deep["args"][1]["n"] = 3
    deep["args"].append(4)
    deep["task"] = "other"
    assert type(deep) is dict and type(deep["args"]) is list
    assert deep == {"task": "other", "args": [1, {"n": 3}, 4], "kwargs": {"x": {"y": 2}}}

    shallow = dict(shared)  # its top level only, as the docs now say
    shallow["task"] = "other"
    assert isinstance(shallow["kwargs"], FrozenDict) and isinstance(shallow["args"], FrozenList)
    with pytest.raises(TypeError) as raised:
        shallow["kwargs"]["x"] = 1
    assert str(raised.value) == READ_ONLY
    assert "copy.deepcopy(template)" in READ_ONLY and "top level only" in READ_ONLY
    assert shared == template  # the shared one never moved


def test_the_docs_describe_dict_of_a_template_as_a_shallow_copy() -> None:
    from emq_bridge.occurrence import Occurrence

    design = (Path(__file__).parents[2] / "docs" / "design.md").read_text()
    text = " ".join(design.split())
    assert "`copy.deepcopy(t)` gives a copy changeable all the way down; `dict(t)` is shallow" in (
        text
    )
    assert "changeable copy" not in text
    assert "copy.deepcopy(template)" in " ".join((Occurrence.__doc__ or "").split())


def test_the_nominal_slot_of_an_unjittered_cadence_is_the_instant_itself() -> None:
    for definition in (
        define(every="1h"),
        define(cron="0 * * * *"),
        define(at=datetime(2030, 1, 1, tzinfo=timezone.utc)),
        define(cron="0 9 * * *", exclude=["cron:* * * * 0,6"]),
    ):
        assert nominal_slot(definition.cadence, NEW_YEAR_2030_MS) == NEW_YEAR_2030_MS
        assert nominal_slot(definition.cadence, NEW_YEAR_2030_MS + 17) == NEW_YEAR_2030_MS + 17


def test_the_nominal_slot_of_a_jittered_run_is_the_slot_it_stands_for(repeat: Repeat) -> None:
    now = NEW_YEAR_2030_MS + 60_000
    for name, definition in (
        ("plain", define(every="1h", template={"task": "t"})),
        ("spread", define(every="1h", jitter="10m", template={"task": "t"})),
    ):
        repeat.upsert("q", name, definition=definition, now_ms=now)
        run = repeat.get("q", name)
        assert run is not None and run.next_run_ms is not None
        at = run.next_run_ms
        nominal = nominal_slot(run.definition.cadence, at)
        assert nominal == NEW_YEAR_2030_MS + 3_600_000
        assert 0 <= at - nominal <= 600_000
        assert (at == nominal) is (name == "plain")


def test_the_documented_jitter_example_type_checks_under_mypy_strict(tmp_path: Path) -> None:
    from mypy import api

    cron_md = (Path(__file__).parents[2] / "docs" / "cron.md").read_text()
    section = cron_md.split("## Jitter", 1)[1]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "nominal_slot(run.definition.cadence, at)" in example
    snippet = tmp_path / "jitter_example.py"
    snippet.write_text(example)
    out, err, status = api.run(
        [
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(snippet),
        ]
    )
    assert status == 0, out + err
