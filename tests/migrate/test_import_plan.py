"""The core of an import: a seed (next slot, paused state, counters) applies when the
registration is created only; an update of an imported registration keeps its live state;
two imported schedules cannot share a registration."""

from __future__ import annotations

from dataclasses import replace

import pytest

from emq_bridge import Repeat
from emq_bridge.definition import Declaration, define
from emq_bridge.errors import ConfigError
from emq_bridge.migrate.plan import Imported, ImportPlan, Refusal, _utc, apply_import
from emq_bridge.registry import Seed
from emq_bridge.template import TaskTemplate


def imported(name: str, every: str, seed: Seed, task: str = "app.t") -> Imported:
    definition = define(every=every, anchor="schedule", template=TaskTemplate(task).to_dict())
    return Imported(f"old {name}", Declaration("q", name, definition), seed)


def test_a_seed_applies_on_create_and_an_update_keeps_the_live_state(repeat: Repeat) -> None:
    now = repeat.server_time_ms()
    seed = Seed(now + 7_000, paused=True, fired=41, last_fired_ms=now - 53_000)
    plan = ImportPlan("import:old", [imported("a", "1m", seed)], [Refusal("old b", "solar")])
    result = apply_import(repeat, plan)
    assert ([e.declaration.name for e in result.created], result.refused) == (["a"], plan.refused)
    a = repeat.get("q", "a")
    assert a is not None and a.paused and a.next_run_ms == now + 7_000
    assert (a.fired, a.last_fired_ms, a.source) == (41, now - 53_000, "import:old")

    repeat.resume("q", "a")
    live = repeat.get("q", "a")
    other = Seed(now + 1, paused=True, fired=1)
    changed = ImportPlan("import:old", [imported("a", "1m", other, task="app.renamed")])
    [updated] = apply_import(repeat, changed).updated
    after = repeat.get("q", "a")
    assert after is not None and not after.paused  # the new seed is not applied
    assert (after.next_run_ms, after.fired) == (live.next_run_ms, 41)
    # Its line says what the registry keeps, not the seed's "paused (next ...)", and that
    # the old scheduler has it disabled (session 33), with the command that pauses it here.
    assert updated.line().endswith(
        f"  next {_utc(after.next_run_ms)} (as stored); disabled in the old scheduler but "  # type: ignore[arg-type]
        "active here (an import leaves a registration's pause as it is): emq-bridge pause q a"
        "  <- old a"
    )
    assert after.definition.template["task"] == "app.renamed"


def test_a_cadence_changed_in_the_old_scheduler_goes_on_from_the_registrations_own_runs(
    repeat: Repeat,
) -> None:
    # Before: an update with a new cadence took the seed's next slot, derived from the old
    # scheduler's last run (stale once emq-bridge fires it): a 20 s entry fired here at
    # `fired_ms`, changed to 15 s there, was next due 10 s after that run, not 15.
    now = repeat.server_time_ms()
    seed = Seed(now + 5_000, fired=3, last_fired_ms=now - 15_000)
    apply_import(repeat, ImportPlan("import:old", [imported("a", "20s", seed)]))
    fired_ms = now - 1_000  # emq-bridge's own run since the import
    repeat.client.hset(repeat.keys("q").record("a"), "last_fired_ms", fired_ms)
    repeat.client.hset(repeat.keys("q").record("a"), "last_due_ms", fired_ms)
    stale = Seed(now - 10_000, fired=3, last_fired_ms=now - 25_000)  # the old one's last run
    apply_import(repeat, ImportPlan("import:old", [imported("a", "15s", stale)]))
    after = repeat.get("q", "a")
    assert after is not None and after.next_run_ms is not None
    assert after.next_run_ms >= fired_ms + 15_000


def test_two_schedules_of_one_registration_are_each_refused_and_the_rest_imported(
    repeat: Repeat,
) -> None:
    # Names the old scheduler keeps apart ('report a', 'report_a') may read as one. Before,
    # the whole import stopped on the first such pair, naming only one of them.
    seed = Seed(repeat.server_time_ms() + 1000)
    a1, a2 = imported("a", "1m", seed), replace(imported("a", "2m", seed), origin="old a2")
    plan = ImportPlan("import:old", [a1, a2, imported("b", "1m", seed)])
    with pytest.raises(ConfigError, match="2 schedule\\(s\\) cannot be imported"):
        apply_import(repeat, plan, strict=True)
    assert repeat.queues() == []
    result = apply_import(repeat, plan)
    assert [e.declaration.name for e in result.created] == ["b"]
    assert [r.line() for r in result.refused] == [
        "old a: q/a would also be the registration of old a2; rename one of them",
        "old a2: q/a would also be the registration of old a; rename one of them",
    ]
    assert repeat.names("q") == ["b"]


def test_strict_writes_nothing_when_a_name_is_another_sources(repeat: Repeat) -> None:
    # Before, --strict checked only what the importer refused, not the names another source
    # owns, which were refused at the write: the rest was written, exit 0.
    repeat.register("q", "taken", every="1h", template={"task": "other.t"})
    seed = Seed(repeat.server_time_ms() + 1000)
    plan = ImportPlan("import:old", [imported("taken", "1m", seed), imported("ok", "1m", seed)])
    with pytest.raises(ConfigError, match="q/taken is owned by no source"):
        apply_import(repeat, plan, strict=True)
    assert repeat.names("q") == ["taken"]


def test_an_import_never_takes_over_another_sources_schedule(repeat: Repeat) -> None:
    # celery-redbeat also stores the beat's own beat_schedule entries, and django-celery-beat
    # Celery's celery.backend_cleanup: once the beat (or anyone else) owns such a name, a
    # re-run of the import leaves it alone, in a dry run too, and says so.
    from emq_bridge.sync import sync

    now = repeat.server_time_ms()
    mine = define(every="20s", template=TaskTemplate("app.tick", ["tick-v2"]).to_dict())
    sync(repeat, [Declaration("q", "tick", mine)], "celery.app")
    repeat.upsert("q", "manual", every="1h", template={"task": "app.t"})  # no source
    before = {n: repeat.get("q", n) for n in ("tick", "manual")}
    plan = ImportPlan(
        "import:redbeat",
        [
            imported("tick", "20s", Seed(now)),
            imported("manual", "1m", Seed(now)),
            imported("new", "1m", Seed(now + 60_000)),
        ],
    )
    dry = apply_import(repeat, plan, dry_run=True)
    result = apply_import(repeat, plan)
    for outcome in (dry, result):
        assert [e.declaration.name for e in outcome.created] == ["new"]
        assert outcome.updated == []
        assert sorted(r.line() for r in outcome.refused) == [
            "old manual: q/manual is owned by no source (added at runtime): left alone (an "
            "import never takes over another source's schedule)",
            "old tick: q/tick is owned by the source 'celery.app': left alone (an import "
            "never takes over another source's schedule)",
        ]
    assert {n: repeat.get("q", n) for n in ("tick", "manual")} == before
    assert apply_import(repeat, plan).created == []  # and a re-run changes nothing either
    assert {n: repeat.get("q", n) for n in ("tick", "manual")} == before
