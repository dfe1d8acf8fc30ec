"""Misfire policies (latest, earliest, skip, all + max) and the catch-up window.

The pure math (`catch_up`) is held against a brute-force oracle; the pump is driven by a
`ManualClock` through long outages, counting what fires, what is dropped (the record's
`missed`) and the log lines: one per registration per outage, whatever the number of slots.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emq_bridge import Cron, Every, Repeat, ScheduleError, advance
from emq_bridge.cadence import (
    DEFAULT_CATCHUP_MAX,
    SKIP_GRACE_MS,
    Cadence,
    catch_up,
    misfire_policy,
)
from emq_bridge.definition import Definition, define
from emq_bridge.events import PumpEvents, Tick
from emq_bridge.testing import ManualClock, RecordingDispatcher, manual_pump

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR
T0 = int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)  # on every grid
TEMPLATE = {"task": "t"}
POLICIES = ("latest", "earliest", "skip", "all")


# -- the math, against a brute-force oracle ---------------------------------------------------


def oracle(
    cadence: Cadence, due: int, now: int, policy: str, window: int | None, most: int
) -> tuple[int | None, int, int]:
    """(slot fired, next score, dropped) by listing every passed slot one by one."""
    passed = [due]
    while (slot := cadence.next_after(passed[-1])) <= now:
        passed.append(slot)
    future = cadence.next_after(passed[-1])
    if window is None and policy == "skip":
        window = SKIP_GRACE_MS
    live = [s for s in passed if window is None or now - s <= window]
    fires = {"latest": live[-1:], "skip": live[-1:], "earliest": live[:1], "all": live[-most:]}
    chosen = fires[policy]
    next_ms = chosen[1] if len(chosen) > 1 else future
    return (chosen[0] if chosen else None), next_ms, len(passed) - len(chosen)


CADENCES = [Every(15 * MIN), Every(7 * MIN, "schedule"), Cron("*/20 * * * *"), Cron("0 9 * * 1-5")]


@settings(max_examples=300, deadline=None)
@given(
    cadence=st.sampled_from(CADENCES),
    slot=st.integers(0, 50),
    late=st.integers(0, 3 * DAY),
    policy=st.sampled_from(POLICIES),
    window=st.one_of(st.none(), st.integers(1, 2 * DAY)),
    most=st.integers(1, 30),
)
def test_catch_up_fires_and_drops_what_a_brute_force_walk_of_the_slots_says(
    cadence: Cadence, slot: int, late: int, policy: str, window: int | None, most: int
) -> None:
    due = T0
    for _ in range(slot):
        due = cadence.next_after(due)
    now = due + late
    step = catch_up(cadence, due, now, policy, window_ms=window, max_runs=most)  # type: ignore[arg-type]
    assert (step.fire_ms, step.next_ms, step.missed) == oracle(
        cadence, due, now, policy, window, most
    )
    assert step.next_ms > (step.fire_ms if step.fire_ms is not None else now)


DST_NIGHTS = [  # Paris springs forward on 31 March 2030 and falls back on 27 October 2030
    int(datetime(2030, 3, 30, 12, tzinfo=timezone.utc).timestamp() * 1000),
    int(datetime(2030, 10, 26, 12, tzinfo=timezone.utc).timestamp() * 1000),
]
PARIS_CRONS = [Cron("30 2 * * *", "Europe/Paris"), Cron("*/30 * * * *", "Europe/Paris")]


@settings(max_examples=200, deadline=None)
@given(
    cadence=st.sampled_from(PARIS_CRONS),
    night=st.sampled_from(DST_NIGHTS),
    slot=st.integers(0, 30),
    late=st.integers(0, DAY),
    policy=st.sampled_from(POLICIES),
    window=st.one_of(st.none(), st.integers(1, DAY)),
    most=st.integers(1, 30),
)
def test_catch_up_across_a_dst_transition_matches_the_brute_force_walk(
    cadence: Cadence, night: int, slot: int, late: int, policy: str, window: int | None, most: int
) -> None:
    due = cadence.next_after(night)
    for _ in range(slot):
        due = cadence.next_after(due)
    step = catch_up(cadence, due, due + late, policy, window_ms=window, max_runs=most)  # type: ignore[arg-type]
    assert (step.fire_ms, step.next_ms, step.missed) == oracle(
        cadence, due, due + late, policy, window, most
    )


def test_the_old_names_are_aliases_and_advance_keeps_its_signature() -> None:
    assert misfire_policy("coalesce") == "latest"
    assert misfire_policy("catchup") == "all"
    cadence = Every(15 * MIN)
    # `coalesce` now fires the newest missed slot; the next run and the count are unchanged.
    step = catch_up(cadence, T0, T0 + 50 * MIN, "coalesce")
    assert (step.fire_ms, step.next_ms, step.missed) == (T0 + 45 * MIN, T0 + 60 * MIN, 3)
    assert advance(cadence, T0, T0 + 50 * MIN) == (T0 + 60 * MIN, 3)
    with pytest.raises(ScheduleError, match="misfire must be one of"):
        catch_up(cadence, T0, T0, "oldest")  # type: ignore[arg-type]


def test_all_is_bounded_a_one_second_schedule_after_a_day_fires_the_newest_hundred() -> None:
    step = catch_up(Every(1000), T0, T0 + DAY, "catchup")
    assert step.passed == 86_401 and step.missed == 86_401 - DEFAULT_CATCHUP_MAX
    assert step.fire_ms == T0 + DAY - (DEFAULT_CATCHUP_MAX - 1) * 1000
    assert step.next_ms == step.fire_ms + 1000


def test_a_cron_outage_past_the_counting_cap_still_fires_the_newest_slot_quickly() -> None:
    step = catch_up(Cron("* * * * *"), T0, T0 + 30 * DAY, "latest")
    assert step.fire_ms == T0 + 30 * DAY and step.next_ms == T0 + 30 * DAY + MIN
    assert step.missed >= 10_000  # a lower bound past the cap, documented


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"misfire": "latest", "catchup_max": 5}, "catchup_max applies to misfire='all'"),
        ({"misfire": "all", "catchup_max": 0}, "catchup_max must be a whole number"),
        ({"misfire": "all", "catchup_max": True}, "catchup_max must be a whole number"),
        ({"catchup_window": 0}, "catchup_window must be at least 1 ms"),
        ({"catchup_window": "soon"}, "catchup_window 'soon' is not an interval"),
        ({"misfire": "never"}, "misfire must be one of"),
    ],
)
def test_bad_misfire_settings_are_refused_with_a_clear_error(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ScheduleError, match=message):
        define(every="1m", **kwargs)  # type: ignore[arg-type]


def test_default_settings_add_no_field_so_old_digests_hold() -> None:
    old = define(every="15m", template=TEMPLATE)
    assert "catchup_window" not in old.to_fields() and "catchup_max" not in old.to_fields()
    windowed = define(every="15m", template=TEMPLATE, catchup_window="10m")
    assert windowed.to_fields()["catchup_window"] == str(10 * MIN)
    assert windowed.digest != old.digest
    again = Definition.from_fields(windowed.to_fields())
    assert again.catchup_window_ms == 10 * MIN and again.digest == windowed.digest


# -- the pump through long outages --------------------------------------------------------


class Journal(PumpEvents):
    def __init__(self) -> None:
        self.missed: list[tuple[str, int, int]] = []

    def on_missed(self, queue: str, name: str, missed: int, due_ms: int) -> None:
        self.missed.append((name, missed, due_ms))


def missed_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "emq_bridge.pump"
        and f"reports/{name}:" in r.getMessage()
        and "missed, unclaimed in time" in r.getMessage()
    ]


def drain(
    pump_ticks: int,
    clock: ManualClock,
    repeat: Repeat,
    dispatcher: RecordingDispatcher,
    journal: Journal,
) -> None:
    pump = manual_pump(repeat, ["reports"], clock, dispatcher)
    pump.add_listener(journal)
    for _ in range(pump_ticks):
        pump.run_once()


@pytest.mark.parametrize(
    ("policy", "fired", "dropped"),
    [
        # An hourly job, the pumps down for three days (72 slots passed, from T0+1h).
        ("latest", [T0 + 72 * HOUR], 71),
        ("coalesce", [T0 + 72 * HOUR], 71),
        ("earliest", [T0 + HOUR], 71),
        ("skip", [], 72),
        ("all", [T0 + k * HOUR for k in range(73 - 5, 73)], 67),  # catchup_max = 5
    ],
)
def test_each_policy_through_a_three_day_outage_fires_counts_and_logs_once(
    any_repeat: Repeat,
    caplog: pytest.LogCaptureFixture,
    policy: str,
    fired: list[int],
    dropped: int,
) -> None:
    most = 5 if policy == "all" else None
    any_repeat.register(
        "reports",
        "hourly",
        definition=define(every="1h", misfire=policy, catchup_max=most, template=TEMPLATE),  # type: ignore[arg-type]
        now_ms=T0,
    )
    clock = ManualClock(T0 + 72 * HOUR + 30 * MIN)
    dispatcher, journal = RecordingDispatcher(), Journal()
    with caplog.at_level(logging.WARNING, logger="emq_bridge.pump"):
        drain(8, clock, any_repeat, dispatcher, journal)
        clock.set(T0 + 73 * HOUR + 30_000)  # back to normal: on time, nothing dropped
        drain(1, clock, any_repeat, dispatcher, journal)
    assert [o.due_ms for o in dispatcher.occurrences] == [*fired, T0 + 73 * HOUR]
    registration = any_repeat.get("reports", "hourly")
    assert registration is not None
    assert registration.missed == dropped
    assert registration.next_run_ms == T0 + 74 * HOUR
    assert [m[:2] for m in journal.missed] == [("hourly", dropped)]
    [line] = missed_lines(caplog, "hourly")
    assert f"{dropped} slot(s) missed, unclaimed in time (72 passed" in line
    assert f"misfire policy {misfire_policy(policy)}" in line
    if not fired:
        assert "none fires" in line


def test_the_window_drops_slots_older_than_it_and_fires_from_within(repeat: Repeat) -> None:
    for name, window in (("wide", "3h"), ("narrow", "10m")):
        repeat.register(
            "reports",
            name,
            definition=define(
                every="1h", misfire="earliest", catchup_window=window, template=TEMPLATE
            ),
            now_ms=T0,
        )
    clock = ManualClock(T0 + 10 * HOUR + 30 * MIN)  # slots 1h..10h passed
    dispatcher, journal = RecordingDispatcher(), Journal()
    drain(2, clock, repeat, dispatcher, journal)
    fired = {o.name: o.due_ms for o in dispatcher.occurrences}
    # `earliest` within 3 h of 10:30 is 08:00; nothing hourly falls within 10 minutes.
    assert fired == {"wide": T0 + 8 * HOUR}
    assert {n: m for n, m, _ in journal.missed} == {"wide": 9, "narrow": 10}


def test_skip_fires_a_slot_released_within_its_grace_and_drops_a_later_one(repeat: Repeat) -> None:
    repeat.register("reports", "ontime", every="1h", misfire="skip", template=TEMPLATE, now_ms=T0)
    late = define(every="1h", offset="59m59s", misfire="skip", template=TEMPLATE)  # T0 + 59:59
    repeat.register("reports", "late", definition=late, now_ms=T0)
    dispatcher, journal = RecordingDispatcher(), Journal()
    drain(1, ManualClock(T0 + HOUR + SKIP_GRACE_MS), repeat, dispatcher, journal)
    assert [o.name for o in dispatcher.occurrences] == ["ontime"]  # 60 s late: on time
    assert journal.missed == [("late", 1, T0 + 2 * HOUR - 1000)]  # 61 s: none fires


def test_a_record_written_by_the_old_version_loads_and_its_catchup_is_bounded(
    repeat: Repeat,
) -> None:
    """Version 1 wrote `misfire=catchup` (unbounded); it is `all` with the default bound."""
    repeat.register("reports", "tick", every="1s", template=TEMPLATE, now_ms=T0)
    keys = repeat.keys("reports")
    repeat.client.hset(keys.record("tick"), mapping={"misfire": "catchup", "anchor": "schedule"})
    dispatcher, journal = RecordingDispatcher(), Journal()
    drain(DEFAULT_CATCHUP_MAX + 5, ManualClock(T0 + DAY), repeat, dispatcher, journal)
    dues = [o.due_ms for o in dispatcher.occurrences]
    assert dues == [T0 + DAY - k * 1000 for k in reversed(range(DEFAULT_CATCHUP_MAX))]
    assert len(journal.missed) == 1
    registration = repeat.get("reports", "tick")
    assert registration is not None and registration.definition.misfire == "catchup"
    assert registration.missed == 86_400 - DEFAULT_CATCHUP_MAX


def test_a_guarded_registration_counts_the_slots_its_policy_dropped(repeat: Repeat) -> None:
    """Overlap `skip` used to count only `skipped`: the misfire drops were lost."""
    repeat.register("reports", "g", every="1h", overlap="skip", template=TEMPLATE, now_ms=T0)
    dispatcher, journal = RecordingDispatcher(), Journal()
    drain(1, ManualClock(T0 + 5 * HOUR), repeat, dispatcher, journal)
    registration = repeat.get("reports", "g")
    assert registration is not None and registration.missed == 4
    assert [o.due_ms for o in dispatcher.occurrences] == [T0 + 5 * HOUR]


def test_only_the_pump_whose_claim_counted_the_drops_tells_them(repeat: Repeat) -> None:
    repeat.register("reports", "r", every="1h", template=TEMPLATE, now_ms=T0)
    clock = ManualClock(T0 + 5 * HOUR)
    journals = [Journal(), Journal()]
    pumps = [manual_pump(repeat, ["reports"], clock) for _ in journals]
    for pump, journal in zip(pumps, journals, strict=True):
        pump.add_listener(journal)
    scan = repeat.scan("reports", 10, clock())
    # The second pump claims first, from the same scan: the first one's claim finds the
    # score moved, claims nothing and tells nothing.
    pumps[1].run_once()
    pumps[0]._fire_batch("reports", scan.now_ms, scan.due, scan.expired, Tick())
    assert [len(j.missed) for j in journals] == [0, 1]


# -- a cadence changed while a slot was overdue -------------------------------------------


def test_changing_a_cadence_while_a_slot_is_overdue_counts_and_logs_the_drop(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    any_repeat.upsert("reports", "c", every="10m", template=TEMPLATE, now_ms=T0)
    overdue_at = T0 + 35 * MIN  # slots 10, 20, 30 passed with no pump
    with caplog.at_level(logging.WARNING, logger="emq_bridge.registry"):
        result = any_repeat.upsert("reports", "c", every="1h", template=TEMPLATE, now_ms=overdue_at)
    assert result == "updated"
    registration = any_repeat.get("reports", "c")
    assert registration is not None
    assert registration.missed == 3 and registration.next_run_ms == T0 + HOUR
    assert (
        sum(
            "cadence changed while its next run was overdue" in r.getMessage()
            for r in caplog.records
        )
        == 1
    )


def test_changing_a_cadence_on_time_drops_nothing(any_repeat: Repeat) -> None:
    any_repeat.upsert("reports", "c", every="10m", template=TEMPLATE, now_ms=T0)
    any_repeat.upsert("reports", "c", cron="0 * * * *", template=TEMPLATE, now_ms=T0 + 5 * MIN)
    registration = any_repeat.get("reports", "c")
    assert registration is not None and registration.missed == 0


def test_a_long_outage_is_one_line_per_registration_not_one_per_slot(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(3):
        repeat.register("reports", f"s{i}", every="1s", template=TEMPLATE, now_ms=T0)
    clock = ManualClock(T0 + 6 * HOUR)
    with caplog.at_level(logging.WARNING, logger="emq_bridge.pump"):
        drain(3, clock, repeat, RecordingDispatcher(), Journal())
    for i in range(3):
        [line] = missed_lines(caplog, f"s{i}")
        assert "21599 slot(s) missed" in line


@pytest.mark.parametrize(
    ("policy", "fired", "dropped"),
    [
        # Hourly until T0+2h; the pumps down until T0+5h30: of the slots, 1h and 2h passed
        # (3h..5h are past end_at: none of its slots, neither fired nor missed).
        ("latest", [T0 + 2 * HOUR], 1),
        ("earliest", [T0 + HOUR], 1),
        ("skip", [], 2),
        ("all", [T0 + HOUR, T0 + 2 * HOUR], 0),
    ],
)
def test_an_outage_across_end_at_catches_up_on_the_slots_before_it(
    repeat: Repeat, policy: str, fired: list[int], dropped: int
) -> None:
    repeat.register(
        "reports",
        "ends",
        definition=define(
            every="1h",
            end_at=datetime.fromtimestamp((T0 + 2 * HOUR) / 1000, tz=timezone.utc),
            misfire=policy,  # type: ignore[arg-type]
            template=TEMPLATE,
        ),
        now_ms=T0,
    )
    dispatcher, journal = RecordingDispatcher(), Journal()
    drain(4, ManualClock(T0 + 5 * HOUR + 30 * MIN), repeat, dispatcher, journal)
    assert [o.due_ms for o in dispatcher.occurrences] == fired
    registration = repeat.get("reports", "ends")
    assert registration is not None
    assert (registration.missed, registration.completed) == (dropped, "end_at")


def test_a_one_off_missed_under_skip_is_told_in_one_line_with_no_run_left(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    repeat.register(
        "reports",
        "once",
        definition=define(
            at=datetime.fromtimestamp((T0 + HOUR) / 1000, tz=timezone.utc),
            misfire="skip",
            template=TEMPLATE,
        ),
        now_ms=T0,
    )
    dispatcher, journal = RecordingDispatcher(), Journal()
    with caplog.at_level(logging.WARNING, logger="emq_bridge"):
        drain(2, ManualClock(T0 + 5 * HOUR), repeat, dispatcher, journal)
    assert dispatcher.occurrences == []
    assert [r for r in caplog.records if "listener" in r.getMessage()] == []  # none failed
    [line] = missed_lines(caplog, "once")
    assert "none fires; it has no run left" in line
    assert [m[:2] for m in journal.missed] == [("once", 1)]
