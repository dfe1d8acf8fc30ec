"""Permanent dispatch failures park their registration; transient ones are retried.

A `PermanentDispatchError` (an unknown task or actor, a template the framework refuses) can
never succeed, so retrying it every lease only grows leases and logs: the pump drops its
lease and parks the registration (paused, with the reason) in one move, logs once, and
`list`/`show` say why until `resume`. Any other failure (a broker that is down) keeps its
lease and is re-sent with the same id. `fired` counts what a broker accepted, triggers too.
"""

from __future__ import annotations

import logging

import pytest
import redis
from click.testing import CliRunner
from quiet import quiet_offset

from emq_bridge import Declaration, Occurrence, Pump, PumpEvents, Repeat, define
from emq_bridge.cli import cli
from emq_bridge.errors import DispatchError, PermanentDispatchError
from emq_bridge.sync import sync

T0 = 1_900_000_000_000
SECOND = 1000
GHOST = "no_such_actor"


class Broker:
    """Knows every task but `GHOST`; refuses everything while `down`."""

    def __init__(self) -> None:
        self.down = False
        self.sent: list[Occurrence] = []
        self.tries: list[Occurrence] = []

    def dispatch(self, occurrence: Occurrence) -> None:
        self.tries.append(occurrence)
        if occurrence.template["task"] == GHOST:
            raise PermanentDispatchError(
                f"{occurrence.queue}/{occurrence.name}: actor {GHOST!r} is not declared"
            )
        if self.down:
            raise DispatchError("the broker is down")
        self.sent.append(occurrence)


class Failed(PumpEvents):
    def __init__(self) -> None:
        self.failed: list[tuple[Occurrence, BaseException]] = []

    def on_registration_failed(self, occurrence: Occurrence, error: BaseException) -> None:
        self.failed.append((occurrence, error))


def pump_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"/{name}" in r.getMessage()]


def test_an_unknown_actor_parks_its_registration_after_one_failure_with_one_log_line(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    any_repeat.register("q", "ghost", every="1s", template={"task": GHOST}, now_ms=T0)
    any_repeat.register("q", "healthy", every="1s", template={"task": "t"}, now_ms=T0)
    broker, failed = Broker(), Failed()
    pump = Pump(any_repeat, ["q"], broker, lease_ms=10 * SECOND, listeners=[failed])

    with caplog.at_level(logging.INFO, logger="emq_bridge"):
        first = pump.run_once(now_ms=T0 + SECOND)
        for step in range(2, 22):  # 20 s more, past the lease: nothing of the ghost again
            pump.run_once(now_ms=T0 + step * SECOND)

    assert [o.name for o in first.failed] == ["ghost"] and first.parked == ["ghost"]
    assert [o.name for o in broker.tries].count("ghost") == 1
    assert [o.name for o, _ in failed.failed] == ["ghost"]
    [line] = pump_lines(caplog, "ghost")
    assert "parked" in line and "not declared" in line and "resume q ghost" in line
    assert not any(r.exc_info for r in caplog.records if "/ghost" in r.getMessage())
    assert [name for name, _, _ in any_repeat.leases("q")] == []
    ghost = any_repeat.get("q", "ghost")
    assert ghost is not None and ghost.paused
    assert ghost.parked_reason == f"actor {GHOST!r} is not declared"
    assert ghost.parked_ms == T0 + SECOND
    assert (ghost.fired, ghost.last_fired_ms) == (0, None)
    assert ghost.next_run_ms == T0 + 2 * SECOND  # kept for resume
    healthy = any_repeat.get("q", "healthy")
    assert healthy is not None and healthy.fired == 21


def test_resume_brings_a_parked_registration_back_and_clears_its_reason(
    any_repeat: Repeat,
) -> None:
    any_repeat.register("q", "ghost", every="1s", template={"task": GHOST}, now_ms=T0)
    broker = Broker()
    pump = Pump(any_repeat, ["q"], broker)
    pump.run_once(now_ms=T0 + SECOND)
    # The actor is deployed, the template fixed: resume, and it fires again.
    any_repeat.upsert("q", "ghost", every="1s", template={"task": "t"}, now_ms=T0 + 2 * SECOND)
    assert any_repeat.resume("q", "ghost", now_ms=T0 + 5 * SECOND)
    resumed = any_repeat.get("q", "ghost")
    assert resumed is not None
    assert (resumed.paused, resumed.parked_reason, resumed.parked_ms) == (False, None, None)
    pump.run_once(now_ms=T0 + 6 * SECOND)
    assert [o.due_ms for o in broker.sent] == [T0 + 6 * SECOND]
    again = any_repeat.get("q", "ghost")
    assert again is not None and again.fired == 1


def test_a_transient_failure_keeps_one_lease_per_slot_and_is_re_sent_with_the_same_id(
    any_repeat: Repeat,
) -> None:
    any_repeat.register("q", "job", every="1s", template={"task": "t"}, now_ms=T0)
    broker = Broker()
    broker.down = True
    pump = Pump(any_repeat, ["q"], broker, lease_ms=10 * SECOND)
    for step in range(1, 6):  # the broker is down for five slots
        pump.run_once(now_ms=T0 + step * SECOND)
    down = [T0 + step * SECOND for step in range(1, 6)]
    # Bounded: one lease per slot that came due while it was down, each tried once so far.
    assert sorted(due for _, due, _ in any_repeat.leases("q")) == down
    assert [o.due_ms for o in broker.tries] == down
    job = any_repeat.get("q", "job")
    assert job is not None and (job.fired, job.paused, job.parked_reason) == (0, False, None)

    broker.down = False
    pump.run_once(now_ms=T0 + 16 * SECOND)  # the leases expired: re-sent, same ids
    retried = {o.due_ms: o for o in broker.sent if o.redelivered}
    assert sorted(retried) == down
    first_ids = {o.due_ms: o.id for o in broker.tries[:5]}
    assert {due: o.id for due, o in retried.items()} == first_ids
    assert any_repeat.leases("q") == []
    job = any_repeat.get("q", "job")
    assert job is not None and job.fired == len(broker.sent) == 6  # 5 retried + the slot due now
    assert job.last_fired_ms == T0 + 16 * SECOND


def test_a_trigger_is_counted_when_the_broker_accepts_it(any_repeat: Repeat) -> None:
    any_repeat.register("q", "job", every="1h", template={"task": "t"}, now_ms=T0)
    any_repeat.trigger("q", "job", now_ms=T0 + SECOND)
    broker = Broker()
    broker.down = True
    pump = Pump(any_repeat, ["q"], broker, lease_ms=10 * SECOND)
    pump.run_once(now_ms=T0 + SECOND)
    refused = any_repeat.get("q", "job")
    assert refused is not None and (refused.fired, refused.last_fired_ms) == (0, None)
    broker.down = False
    pump.run_once(now_ms=T0 + 20 * SECOND)
    [sent] = broker.sent
    assert sent.triggered and sent.redelivered
    job = any_repeat.get("q", "job")
    assert job is not None and (job.fired, job.last_fired_ms) == (1, T0 + 20 * SECOND)


def test_a_trigger_of_a_parked_registration_is_dropped_with_one_error(
    any_repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    any_repeat.register("q", "ghost", every="1h", template={"task": GHOST}, now_ms=T0)
    pump = Pump(any_repeat, ["q"], Broker())
    pump.run_once(now_ms=T0 + 3_600_000)
    any_repeat.trigger("q", "ghost", now_ms=T0 + 3_700_000)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="emq_bridge"):
        tick = pump.run_once(now_ms=T0 + 3_700_000)
    assert [o.triggered for o in tick.failed] == [True] and tick.parked == []
    [line] = [r.getMessage() for r in caplog.records]
    assert "dropped" in line and "parked" in line
    assert any_repeat.leases("q") == []


def test_park_writes_nothing_when_the_template_changed_since_the_failure(
    repeat: Repeat, client: redis.Redis
) -> None:
    repeat.register("q", "job", every="1h", template={"task": GHOST}, now_ms=T0)
    read = client.hget(repeat.keys("q").record("job"), "template")
    assert isinstance(read, bytes)
    repeat.upsert("q", "job", every="1h", template={"task": "t"}, now_ms=T0)
    parked = repeat.park(
        "q", "job", [], deadline_ms=1, template=read.decode(), reason="gone", now_ms=T0
    )
    assert parked == -2
    job = repeat.get("q", "job")
    assert job is not None and (job.paused, job.parked_reason) == (False, None)


def cli_run(redis_url: str, prefix: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--redis-url", redis_url, "--prefix", prefix, *args])
    return result.exit_code, result.stdout, result.stderr


def test_show_and_list_print_the_parked_state_and_its_reason_and_resume_clears_them(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    now = repeat.server_time_ms()
    repeat.register("q", "ghost", every="1s", template={"task": GHOST}, now_ms=now - 2 * SECOND)
    Pump(repeat, ["q"], Broker()).run_once()

    code, shown, _ = cli_run(redis_url, prefix, "show", "q", "ghost")
    assert code == 0, shown
    assert "state     parked since" in shown
    assert f"reason    actor {GHOST!r} is not declared" in shown
    assert "emq-bridge resume q ghost" in shown
    assert "fired     0" in shown and "last run  never" in shown
    code, listed, _ = cli_run(redis_url, prefix, "list", "q")
    assert code == 0 and f"parked: actor {GHOST!r} is not declared" in listed, listed
    code, data, _ = cli_run(redis_url, prefix, "show", "q", "ghost", "--json")
    assert '"state": "parked"' in data and '"parked_reason": "actor' in data

    code, out, _ = cli_run(redis_url, prefix, "resume", "q", "ghost")
    assert code == 0 and "resumed q/ghost" in out
    code, listed, _ = cli_run(redis_url, prefix, "list", "q")
    assert listed.rstrip().endswith("active"), listed


def test_show_counts_a_trigger_and_its_last_run(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    # A top of the hour before the pump would fire the hour's slot too: fired 2.
    add = ["add", "q", "job", "--task", "t", "--every", "1h", "--offset", quiet_offset()]
    code, _, _ = cli_run(redis_url, prefix, *add)
    assert code == 0
    code, _, _ = cli_run(redis_url, prefix, "trigger", "q", "job")
    assert code == 0
    Pump(repeat, ["q"], Broker()).run_once()
    code, shown, _ = cli_run(redis_url, prefix, "show", "q", "job")
    assert code == 0
    assert "fired     1" in shown, shown
    assert "last run  never" not in shown


def test_add_without_an_app_says_on_stderr_that_the_task_name_was_not_checked(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    code, out, err = cli_run(
        redis_url, prefix, "add", "q", "ghost", "--task", GHOST, "--every", "1s"
    )
    assert code == 0 and "added q/ghost" in out
    [note] = err.strip().splitlines()
    assert f"task {GHOST!r} was not checked" in note and "--dramatiq SPEC" in note


def test_a_registration_whose_template_is_stored_in_pieces_is_parked_too(
    any_repeat: Repeat,
) -> None:
    # park.lua compares the template the pump read with the record's, joined from its
    # pieces (template_pieces.py): a long template must not look changed.
    template = {"task": GHOST, "args": ["x" * 150], "kwargs": {"tenant": "t0000001"}}
    any_repeat.register("q", "ghost", every="1s", template=template, now_ms=T0)
    assert any_repeat.client.hget(any_repeat.keys("q").record("ghost"), "template_pieces")
    tick = Pump(any_repeat, ["q"], Broker()).run_once(now_ms=T0 + SECOND)
    assert tick.parked == ["ghost"]
    ghost = any_repeat.get("q", "ghost")
    assert ghost is not None and ghost.paused and ghost.parked_reason


def test_a_corrupt_template_beside_records_that_share_its_other_fields_is_parked_alone(
    any_repeat: Repeat,
) -> None:
    # The pump decodes the fields registrations share once (only their templates differ);
    # a template edited by hand into a non-object is still refused, for its record only.
    for i in range(3):
        template = {"task": "t", "args": [i]}
        any_repeat.register("q", f"job-{i}", every="1s", template=template, now_ms=T0)
    any_repeat.client.hset(any_repeat.keys("q").record("job-1"), "template", "[1, 2]")
    broker = Broker()
    tick = Pump(any_repeat, ["q"], broker).run_once(now_ms=T0 + SECOND)
    assert sorted(o.name for o in broker.sent) == ["job-0", "job-2"]
    assert [dict(o.template)["args"] for o in sorted(broker.sent, key=lambda o: o.name)] == [
        [0],
        [2],
    ]
    assert tick.parked == ["job-1"]


class NewBroker(Broker):
    """The broker of the new version of the code: it declares `GHOST` (an added actor)."""

    def dispatch(self, occurrence: Occurrence) -> None:
        self.tries.append(occurrence)
        self.sent.append(occurrence)


def test_an_old_worker_of_a_rolling_deploy_leaves_what_it_cannot_send_to_the_new_one(
    any_repeat: Repeat,
) -> None:
    # Version 2 of source "app" adds a schedule on an actor version 1 does not declare.
    declared = [Declaration("q", "added", define(every="1s", template={"task": GHOST}))]
    sync(any_repeat, declared, "app", generation=2)
    old, new = Broker(), NewBroker()
    old_pump = Pump(any_repeat, ["q"], old, lease_ms=10 * SECOND, code=("app", 1))
    first = old_pump.run_once(now_ms=T0 + SECOND)
    assert [o.name for o in first.failed] == ["added"] and first.parked == []
    added = any_repeat.get("q", "added")
    assert added is not None and not added.paused and added.parked_reason is None
    [(_, due, _)] = any_repeat.leases("q")  # kept, for whichever pump re-takes it

    new_pump = Pump(any_repeat, ["q"], new, lease_ms=10 * SECOND, code=("app", 2))
    new_pump.run_once(now_ms=T0 + 12 * SECOND)  # past the lease: the new code sends it
    resent = [o for o in new.sent if o.due_ms == due]
    assert [o.id for o in resent] == [old.tries[0].id] and resent[0].redelivered
    # The same generation, or a process with no generation, still parks what it cannot send.
    for code in [("app", 2), None]:
        name = f"typo{code is None}"
        any_repeat.register("q", name, every="1s", template={"task": GHOST}, now_ms=T0)
    for code in [("app", 2), None]:
        name = f"typo{code is None}"
        pump = Pump(any_repeat, ["q"], old, lease_ms=10 * SECOND, code=code)
        pump.run_once(now_ms=T0 + 13 * SECOND)
        typo = any_repeat.get("q", name)
        assert typo is not None and typo.parked_reason is not None, code


def test_without_generations_a_record_its_source_rewrote_after_the_pumps_sync_is_not_parked(
    any_repeat: Repeat,
) -> None:
    # A rolling deploy with no generation: version 2 of source "app" renamed the actor of
    # schedule "renamed" and synced after the old worker's boot. The old worker's pump
    # cannot send it: before, it parked the schedule, which stayed stopped once every worker
    # ran version 2; now it leaves it to the new code, as with generations.
    old_synced_ms = any_repeat.server_time_ms() - 1
    sync(
        any_repeat,
        [Declaration("q", "renamed", define(every="1s", template={"task": GHOST}))],
        "app",
    )
    old, new = Broker(), NewBroker()
    old_pump = Pump(
        any_repeat,
        ["q"],
        old,
        lease_ms=10 * SECOND,
        code=("app", None),
        code_synced_ms=old_synced_ms,
    )
    first = old_pump.run_once(now_ms=T0 + SECOND)
    assert [o.name for o in first.failed] == ["renamed"] and first.parked == []
    renamed = any_repeat.get("q", "renamed")
    assert renamed is not None and not renamed.paused and renamed.parked_reason is None
    [(_, due, _)] = any_repeat.leases("q")
    Pump(any_repeat, ["q"], new, lease_ms=10 * SECOND, code=("app", None)).run_once(
        now_ms=T0 + 12 * SECOND
    )
    assert [o.id for o in new.sent if o.due_ms == due] == [old.tries[0].id]

    # What the pump's own code synced (before its boot), and what another source wrote
    # after it (a runtime add of a typo), are still parked.
    sync(
        any_repeat, [Declaration("q", "own", define(every="1s", template={"task": GHOST}))], "mine"
    )
    mine_synced_ms = any_repeat.server_time_ms()
    any_repeat.register("q", "typo", every="1s", template={"task": GHOST}, now_ms=T0)
    pump = Pump(
        any_repeat,
        ["q"],
        old,
        lease_ms=10 * SECOND,
        code=("mine", None),
        code_synced_ms=mine_synced_ms,
    )
    pump.run_once(now_ms=T0 + 13 * SECOND)
    for name in ("own", "typo"):
        parked = any_repeat.get("q", name)
        assert parked is not None and parked.parked_reason is not None, name
