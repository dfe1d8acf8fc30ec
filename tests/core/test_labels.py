"""Labels (str -> str tags of a registration) through every surface: `define`, `Repeat`,
`Schedule`, the Celery `@recurring` and `beat_schedule` entries, the Dramatiq declarations,
the TOML file, the CLI (`add --label`, `list --label`, `show`, `--json`), sync's log, and
export -> sync; bad labels are refused and write nothing; a label edit never moves a run."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from celery import Celery
from click.testing import CliRunner, Result
from dramatiq.brokers.stub import StubBroker
from registry_state import snapshot

from emq_bridge import ConfigError, Repeat, ScheduleError, define
from emq_bridge.celery import app_schedule
from emq_bridge.celery import recurring as celery_recurring
from emq_bridge.celery.entries import convert_entry
from emq_bridge.cli import cli
from emq_bridge.config import load_schedule_file, sync_file
from emq_bridge.definition import DEFINITION_FIELDS, Definition, Schedule
from emq_bridge.dramatiq import RecurringMiddleware, broker_declarations, cron, every, recurring
from emq_bridge.dramatiq import register as dramatiq_register
from emq_bridge.labels import MAX_KEY_CHARS, MAX_LABELS, MAX_VALUE_CHARS, matches, parse_selector
from emq_bridge.sync import Declaration, sync

Run = Callable[..., Result]
BILLING = {"team": "billing", "tier": "gold"}

BAD_LABELS: list[tuple[Any, str]] = [
    ({"": "x"}, "a label key must not be empty"),
    ({"a b": "x"}, "must not hold whitespace, control characters or '='"),
    ({"a=b": "x"}, "must not hold whitespace, control characters or '='"),
    ({"a\x00": "x"}, "must not hold whitespace, control characters or '='"),
    ({"k": "line\nbreak"}, "has a value with a control character"),
    ({"k": "bell\x07"}, "has a value with a control character"),
    ({"k" * (MAX_KEY_CHARS + 1): "v"}, f"the limit is {MAX_KEY_CHARS}"),
    ({"k": "v" * (MAX_VALUE_CHARS + 1)}, f"the limit is {MAX_VALUE_CHARS}"),
    ({f"k{i}": "" for i in range(MAX_LABELS + 1)}, f"the limit is {MAX_LABELS}"),
    ({"k": 1}, "must have a string value, got int"),
    ({1: "v"}, "label keys must be strings, got int"),
    (["team"], "labels must be a mapping of strings to strings, got list"),
]


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    runner = CliRunner()

    def invoke(*args: str, **kwargs: Any) -> Result:
        return runner.invoke(cli, ["--redis-url", redis_url, "--prefix", prefix, *args], **kwargs)

    return invoke


# -- the definition ---------------------------------------------------------------------


def test_labels_are_one_canonical_json_field_in_the_digest_not_the_cadence_digest() -> None:
    plain = define(every="5m", template={"task": "t"})
    labelled = define(every="5m", template={"task": "t"}, labels={"tier": "gold", "team": "é"})
    assert "labels" in DEFINITION_FIELDS
    assert labelled.to_fields()["labels"] == '{"team":"é","tier":"gold"}'  # sorted, compact
    assert labelled.digest != plain.digest
    assert labelled.cadence_digest == plain.cadence_digest
    back = Definition.from_fields(labelled.to_fields())
    assert dict(back.labels) == {"team": "é", "tier": "gold"}
    assert back.digest == labelled.digest
    with pytest.raises(TypeError):  # shared between reads: read-only
        back.labels["team"] = "x"  # type: ignore[index]


def test_no_labels_add_no_field_and_keep_the_digest_of_a_definition_without_them() -> None:
    plain = define(every="5m", template={"task": "t"})
    assert define(every="5m", template={"task": "t"}, labels={}).to_fields() == plain.to_fields()
    fields = {"every_ms": "300000", "anchor": "grid", "template": '{"task":"t"}'}
    fields["misfire"] = "coalesce"
    assert plain.to_fields() == fields  # what every earlier version wrote
    canonical = json.dumps(dict(sorted(fields.items())), separators=(",", ":"))
    assert plain.digest == hashlib.sha256(canonical.encode()).hexdigest()[:32]


@pytest.mark.parametrize(("labels", "message"), BAD_LABELS)
def test_bad_labels_are_schedule_errors_and_register_writes_nothing(
    repeat: Repeat, labels: Any, message: str
) -> None:
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        define(every="5m", labels=labels)
    before = snapshot(repeat)
    with pytest.raises(ScheduleError):
        repeat.register("reports", "bad", every="5m", labels=labels)
    with pytest.raises(ScheduleError):
        repeat.upsert("reports", "bad", every="5m", labels=labels)
    assert snapshot(repeat) == before


def test_an_empty_value_and_unicode_are_labels() -> None:
    definition = define(every="1h", labels={"canary": "", "équipe": "facturation"})
    assert dict(definition.labels) == {"canary": "", "équipe": "facturation"}


def test_a_corrupt_labels_field_is_a_schedule_error() -> None:
    fields = define(every="5m").to_fields()
    for raw in ("{not json", '["a"]', '{"k":1}'):
        with pytest.raises(ScheduleError):
            Definition.from_fields({**fields, "labels": raw})


def test_selectors_need_every_pair() -> None:
    assert parse_selector(["team=billing", "url=a=b"]) == {"team": "billing", "url": "a=b"}
    assert matches(BILLING, {"team": "billing"}) and matches(BILLING, {})
    assert not matches(BILLING, {"team": "billing", "tier": "silver"})
    with pytest.raises(ScheduleError, match="must be KEY=VALUE"):
        parse_selector(["team"])
    with pytest.raises(ScheduleError, match="given twice with different values"):
        parse_selector(["team=a", "team=b"])


# -- the registry, sync -----------------------------------------------------------------


def test_register_and_upsert_keep_labels_and_a_label_edit_keeps_the_next_run(
    repeat: Repeat,
) -> None:
    assert repeat.register("reports", "digest", every="15m", labels=BILLING) == "registered"
    first = repeat.get("reports", "digest")
    assert first is not None and dict(first.definition.labels) == BILLING
    edited = {**BILLING, "tier": "silver"}
    assert repeat.upsert("reports", "digest", every="15m", labels=edited) == "updated"
    after = repeat.get("reports", "digest")
    assert after is not None and dict(after.definition.labels) == edited
    assert after.next_run_ms == first.next_run_ms  # not a cadence change
    assert repeat.upsert("reports", "digest", every="15m", labels=edited) == "unchanged"
    assert repeat.upsert("reports", "digest", every="15m") == "updated"  # labels removed
    raw = repeat.client.hgetall(repeat.keys("reports").record("digest"))
    assert b"labels" not in raw


def test_a_sync_that_changes_a_label_logs_one_update_and_keeps_the_score(
    repeat: Repeat, caplog: pytest.LogCaptureFixture
) -> None:
    def declare(labels: dict[str, str]) -> list[Declaration]:
        return [Declaration("reports", "digest", define(every="1h", labels=labels))]

    sync(repeat, declare({"team": "billing"}), "app")
    score = repeat.client.zscore(repeat.keys("reports").registry, "digest")
    with caplog.at_level(logging.WARNING, logger="emq_bridge.sync"):
        plan = sync(repeat, declare({"team": "payments"}), "app")
    assert (len(plan.update), plan.changes) == (1, 1)
    [line] = [r.getMessage() for r in caplog.records if "reports/digest" in r.getMessage()]
    assert line == ('sync app: ~ reports/digest  labels {"team":"billing"} -> {"team":"payments"}')
    assert repeat.client.zscore(repeat.keys("reports").registry, "digest") == score
    assert sync(repeat, declare({"team": "payments"}), "app").changes == 0


# -- declared schedules -----------------------------------------------------------------


def test_a_schedule_binds_its_labels_and_refuses_bad_ones() -> None:
    declaration = Schedule(every="1h", labels=BILLING).bind("app.task", "reports")
    assert dict(declaration.definition.labels) == BILLING
    with pytest.raises(ScheduleError, match="a label key must not be empty"):
        Schedule(every="1h", labels={"": "x"})


def record() -> None:
    return None


@pytest.fixture
def celery_app(redis_url: str, prefix: str) -> Iterator[Celery]:
    app = Celery(f"app-{prefix}", broker=redis_url, set_as_current=False)
    app.conf.update(task_default_queue="reports", emq_bridge_prefix=prefix, result_backend=None)
    app.task(name="t.record", shared=False)(record)
    yield app
    app.close()


def test_celery_beat_schedule_entries_and_recurring_take_labels(celery_app: Celery) -> None:
    celery_app.conf.beat_schedule = {
        "etl": {"task": "t.record", "schedule": 3600.0, "labels": BILLING},
        "plain": {"task": "t.record", "schedule": 60.0},
    }

    @celery_recurring(every="1h", name="poll", labels={"team": "ops"})
    @celery_app.task(name="t.poll", shared=False)  # type: ignore[untyped-decorator]
    def poll() -> None: ...

    found = {d.name: d.definition for d in app_schedule(celery_app).declarations}
    assert dict(found["etl"].labels) == BILLING
    assert dict(found["plain"].labels) == {}
    assert "labels" not in found["plain"].to_fields()
    assert dict(found["poll"].labels) == {"team": "ops"}
    with pytest.raises(ScheduleError, match="a label key must not be empty"):
        celery_recurring(every="1h", labels={"": "x"})


@pytest.mark.parametrize(("labels", "message"), [("team=billing", "mapping"), ({"k": "\x1b"}, "")])
def test_a_bad_labels_entry_key_is_a_config_error_naming_the_entry(
    celery_app: Celery, labels: Any, message: str
) -> None:
    raw = {"task": "t.record", "schedule": 60.0, "labels": labels}
    with pytest.raises(ConfigError, match=rf"beat_schedule\['bad'\]: .*{message}"):
        convert_entry(celery_app, "bad", raw)


def test_the_dramatiq_declarations_take_labels(repeat: Repeat, prefix: str) -> None:
    broker = StubBroker()
    broker.add_middleware(RecurringMiddleware(prefix=prefix))

    @recurring(every="1h", name="etl", labels={"team": "data"})
    @dramatiq.actor(broker=broker, queue_name="reports")
    def etl() -> None: ...

    @dramatiq.actor(
        broker=broker,
        queue_name="reports",
        recurring=[
            every("15m", labels={"tier": "gold"}),
            cron("0 6 * * *", name="daily", labels=BILLING),
        ],
    )
    def digest() -> None: ...

    declared = {d.name: d.definition for d in broker_declarations(broker)}
    assert dict(declared["etl"].labels) == {"team": "data"}
    assert dict(declared["digest"].labels) == {"tier": "gold"}
    assert dict(declared["daily"].labels) == BILLING
    assert dramatiq_register(repeat, etl, every="5m", name="adhoc", labels=BILLING) == "registered"
    registration = repeat.get("reports", "adhoc")
    assert registration is not None and dict(registration.definition.labels) == BILLING
    with pytest.raises(ScheduleError, match="must not hold whitespace"):
        every("1h", labels={"a b": "x"})
    with pytest.raises(ScheduleError, match="labels must be a mapping"):
        cron("0 * * * *", labels=["team"])  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="a label key must not be empty"):
        dramatiq_register(repeat, etl, every="5m", name="bad", labels={"": "x"})
    assert repeat.get("reports", "bad") is None


# -- the TOML file ----------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "schedules.toml"
    path.write_text('queue = "reports"\n' + text)
    return path


ENTRY = '[[schedule]]\nname = "digest"\ntask = "t"\nevery = "1h"\n'


def test_the_toml_file_declares_labels(tmp_path: Path, repeat: Repeat) -> None:
    path = write(tmp_path, ENTRY + 'labels = { team = "billing", tier = "gold" }\n')
    [declaration] = load_schedule_file(path).declarations
    assert dict(declaration.definition.labels) == BILLING
    sync_file(repeat, path)
    registration = repeat.get("reports", "digest")
    assert registration is not None and dict(registration.definition.labels) == BILLING


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"team=billing"', "must be a table like"),
        ("{ team = 1 }", "must have a string value, got int"),
        ('{ "" = "x" }', "a label key must not be empty"),
        ('{ team = "a\\u0000b" }', "control character"),
    ],
)
def test_bad_labels_in_the_file_name_the_field_and_write_nothing(
    tmp_path: Path, repeat: Repeat, value: str, message: str
) -> None:
    path = write(tmp_path, ENTRY + f"labels = {value}\n")
    before = snapshot(repeat)
    with pytest.raises(ConfigError, match=rf"field 'labels': .*{message}"):
        sync_file(repeat, path)
    assert snapshot(repeat) == before


# -- the CLI ----------------------------------------------------------------------------


def test_cli_add_label_list_label_show_and_json(run: Run, repeat: Repeat) -> None:
    base = ["add", "reports"]
    for name, labels in (
        ("a", ["team=billing", "tier=gold"]),
        ("b", ["team=billing"]),
        ("c", ["team=ops", "tier=gold"]),
    ):
        args = [*base, name, "--task", "t", "--every", "1h"]
        result = run(*args, *(x for label in labels for x in ("--label", label)))
        assert result.exit_code == 0, result.output
    registration = repeat.get("reports", "a")
    assert registration is not None and dict(registration.definition.labels) == BILLING

    def listed(*labels: str) -> list[str]:
        result = run(
            "list", "reports", "--json", *(x for label in labels for x in ("--label", label))
        )
        assert result.exit_code == 0, result.output
        return [item["name"] for item in json.loads(result.output)]

    assert listed() == ["a", "b", "c"]
    assert listed("team=billing") == ["a", "b"]
    assert listed("team=billing", "tier=gold") == ["a"]  # all must match
    assert listed("tier=gold") == ["a", "c"]
    assert listed("team=nobody") == []
    page = run("list", "--label", "tier=gold", "--offset", "1", "--limit", "5", "--json")
    assert [item["name"] for item in json.loads(page.output)] == ["c"]  # paged after the match
    text = run("list", "reports", "--label", "team=ops")
    assert text.exit_code == 0 and "c" in text.output.split() and "a" not in text.output.split()
    none = run("list", "reports", "--label", "team=nobody")
    assert none.exit_code == 0 and "with labels team=nobody" in none.stderr

    shown = run("show", "reports", "a")
    assert "  labels    team=billing, tier=gold" in shown.output.splitlines()
    assert "  labels    team=billing" in run("show", "reports", "b").output.splitlines()
    assert run("add", *base[1:], "d", "--task", "t", "--every", "1h").exit_code == 0
    assert "labels" not in run("show", "reports", "d").output  # none: no line
    assert json.loads(run("show", "reports", "d", "--json").output)["labels"] == {}
    data = json.loads(run("show", "reports", "a", "--json").output)
    assert data["labels"] == BILLING
    assert json.loads(run("show", "reports", "b", "--json").output)["labels"] == {"team": "billing"}


@pytest.mark.parametrize(
    ("label", "code", "message"),
    [
        ("team", 2, "must be KEY=VALUE"),
        ("=x", 1, "a label key must not be empty"),
        ("a b=x", 1, "must not hold whitespace"),
        ("k=\x07", 1, "control character"),
        ("k=" + "v" * (MAX_VALUE_CHARS + 1), 1, f"the limit is {MAX_VALUE_CHARS}"),
    ],
)
def test_cli_add_with_a_bad_label_exits_with_one_line_and_writes_nothing(
    run: Run, repeat: Repeat, label: str, code: int, message: str
) -> None:
    before = snapshot(repeat)
    result = run("add", "reports", "x", "--task", "t", "--every", "1h", "--label", label)
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert snapshot(repeat) == before
    if code == 1:
        assert len(result.stderr.strip().splitlines()) == 1


def test_cli_add_with_labels_the_options_alone_refuse_is_a_usage_error(
    run: Run, repeat: Repeat
) -> None:
    before = snapshot(repeat)
    base = ("add", "reports", "x", "--task", "t", "--every", "1h")
    many = [arg for i in range(33) for arg in ("--label", f"k{i}=v")]
    too_many = run(*base, *many)
    assert too_many.exit_code == 2 and "the limit is 32" in too_many.stderr, too_many.output
    twice = run(*base, "--label", "k=a", "--label", "k=b")
    assert twice.exit_code == 2, twice.output
    assert snapshot(repeat) == before


def test_cli_list_with_a_malformed_label_is_a_usage_error(run: Run) -> None:
    result = run("list", "--label", "team")
    assert result.exit_code == 2 and "must be KEY=VALUE" in result.stderr
    empty_key = run("list", "--label", "=a")  # as `add` refuses it
    assert empty_key.exit_code == 2 and "a label key must not be empty" in empty_key.stderr


# -- export -> sync ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["toml", "json"])
def test_an_export_carries_labels_and_syncs_back_unchanged(
    repeat: Repeat, client: redis.Redis, prefix: str, tmp_path: Path, fmt: str
) -> None:
    from emq_bridge.migrate.export import export_registry, render

    template = {"task": "t", "args": [], "kwargs": {}, "options": {}}
    for name, labels in (("a", BILLING), ("b", None), ("c", {"équipe": "", "k": "a=b, c"})):
        definition = define(every="1h", template=template, labels=labels)
        repeat.upsert("reports", name, definition=definition, source="app")
    exported = export_registry(repeat, fmt=fmt)  # type: ignore[arg-type]
    assert exported.refused == []
    entries = {e["name"]: e for e in exported.entries}
    assert entries["a"]["labels"] == BILLING and "labels" not in entries["b"]
    path = tmp_path / f"schedules.{fmt}"
    path.write_text(render(exported, fmt), encoding="utf-8")  # type: ignore[arg-type]
    if fmt == "toml":
        assert '[schedule.labels]\nteam = "billing"\ntier = "gold"\n' in path.read_text()
    empty = Repeat(client, f"{prefix}x")
    assert len(sync_file(empty, path).create) == 3
    assert empty.digests("reports") == repeat.digests("reports")


def test_cli_sync_says_a_label_changed_and_writes_it(
    run: Run, tmp_path: Path, repeat: Repeat
) -> None:
    path = write(tmp_path, 'source = "app"\n' + ENTRY + 'labels = { team = "billing" }\n')
    assert run("sync", str(path)).exit_code == 0
    before = repeat.get("reports", "digest")
    path = write(tmp_path, 'source = "app"\n' + ENTRY + 'labels = { team = "payments" }\n')
    dry = run("sync", str(path), "--dry-run")
    assert "~ reports/digest  every 1h, labels team=billing -> team=payments" in dry.stdout
    assert run("sync", str(path)).exit_code == 0
    after = repeat.get("reports", "digest")
    assert after is not None and before is not None
    assert dict(after.definition.labels) == {"team": "payments"}
    assert after.next_run_ms == before.next_run_ms
