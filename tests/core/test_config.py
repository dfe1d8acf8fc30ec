"""The schedule file: its schema, its errors, and its sync into a real registry."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from registry_state import snapshot

from emq_bridge import ConfigError, Cron, Every, Repeat
from emq_bridge.config import declaration_from_entry, load_schedule_file, sync_file

HEADER = 'source = "billing"\n'
DIGEST = """
[[schedule]]
queue = "reports"
name = "digest"
task = "app.tasks.send_digest"
every = "15m"
kwargs = { audience = "staff" }
"""
NIGHTLY = """
[[schedule]]
queue = "reports"
name = "nightly"
task = "nightly_report"
cron = "0 9 * * 1-5"
tz = "Europe/Paris"
args = ["pdf", 2]
options = { priority = 5 }
"""
GOOD = HEADER + DIGEST + NIGHTLY


def write(tmp_path: Path, text: str, name: str = "schedules.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- the schema ---------------------------------------------------------------------------


def test_a_valid_file_gives_one_declaration_per_entry_with_the_template_convention(
    tmp_path: Path,
) -> None:
    loaded = load_schedule_file(write(tmp_path, GOOD))
    assert loaded.source == "billing"
    assert loaded.path == tmp_path / "schedules.toml"
    assert [(d.queue, d.name) for d in loaded.declarations] == [
        ("reports", "digest"),
        ("reports", "nightly"),
    ]
    digest, nightly = (d.definition for d in loaded.declarations)
    assert digest.cadence == Every(900_000, "grid")
    assert dict(digest.template) == {
        "task": "app.tasks.send_digest",
        "args": [],
        "kwargs": {"audience": "staff"},
        "options": {},
    }
    assert nightly.cadence == Cron("0 9 * * 1-5", "Europe/Paris")
    assert dict(nightly.template) == {
        "task": "nightly_report",
        "args": ["pdf", 2],
        "kwargs": {},
        "options": {"priority": 5},
    }
    assert loaded.queues == ("reports",)


def test_without_a_source_key_the_source_is_the_file_name_so_every_host_agrees(
    tmp_path: Path,
) -> None:
    first = tmp_path / "a"
    second = tmp_path / "b"
    first.mkdir()
    second.mkdir()
    body = DIGEST + NIGHTLY
    assert load_schedule_file(write(first, body)).source == "file:schedules.toml"
    assert load_schedule_file(write(second, body)).source == "file:schedules.toml"


def test_a_top_level_queue_is_the_default_for_entries_that_name_none(tmp_path: Path) -> None:
    text = """
queue = "emails"
[[schedule]]
name = "a"
task = "t"
every_ms = 1500
anchor = "release"
misfire = "catchup"
[[schedule]]
queue = "other"
name = "b"
task = "t"
cron = "@daily"
day_and = true
"""
    a, b = load_schedule_file(write(tmp_path, text)).declarations
    assert (a.queue, b.queue) == ("emails", "other")
    assert a.definition.cadence == Every(1500, "release")
    assert a.definition.misfire == "catchup"
    assert b.definition.cadence == Cron("@daily", "UTC", day_and=True)


def test_a_file_with_no_entries_declares_nothing(tmp_path: Path) -> None:
    assert load_schedule_file(write(tmp_path, 'source = "empty"\n')).declarations == ()


def test_one_entry_validates_through_the_same_schema_as_the_file() -> None:
    declaration = declaration_from_entry({"queue": "q", "name": "n", "task": "t", "every": "1h"})
    assert declaration.definition.cadence == Every(3_600_000)
    with pytest.raises(ConfigError, match=r"schedule q/n, field 'tz'"):
        declaration_from_entry({"queue": "q", "name": "n", "task": "t", "every": "1h", "tz": "UTC"})


ENTRY = 'queue = "reports"\nname = "digest"\ntask = "t"\n'

BAD_FILES = [
    pytest.param(
        "[[schedule]\nname = ", r"schedules\.toml: not valid TOML: .*line 1", id="malformed-toml"
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = '1m'\ncolour = 'red'\n",
        r"schedule #1 \(reports/digest\), field 'colour': unknown key",
        id="unknown-key",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = '1m'\ncron = '* * * * *'\n",
        r"schedule #1 \(reports/digest\), field 'cron': give only one of every, every_ms, cron "
        "and at",
        id="every-and-cron",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}",
        r"schedule #1 \(reports/digest\), field 'every': no cadence",
        id="no-cadence",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}cron = '61 * * * *'\n",
        r"schedule #1 \(reports/digest\), field 'cron': invalid cron '61 \* \* \* \*'",
        id="invalid-cron",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}cron = '0 9 * * *'\ntz = 'Mars/Olympus'\n",
        r"schedule #1 \(reports/digest\), field 'tz': unknown time zone 'Mars/Olympus'",
        id="unknown-tz",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = '1m'\n[[schedule]]\n{ENTRY}every = '2m'\n",
        r"schedule #2 \(reports/digest\), field 'name': duplicate of schedule #1",
        id="duplicate-name",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = '1m'\ntz = 'UTC'\n",
        r"field 'tz': applies to cron schedules only",
        id="tz-on-an-interval",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}cron = '@daily'\nanchor = 'release'\n",
        r"field 'anchor': applies to interval schedules only",
        id="anchor-on-a-cron",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = 'soon'\n",
        r"field 'every': every 'soon' is not an interval",
        id="bad-every",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = [90]\n",
        r"field 'every': must be seconds \(a number\) or a string like '15m', got an array",
        id="array-every",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = 0.0001\n",
        r"field 'every': every must be at least 1 ms",
        id="sub-ms-every",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every_ms = '15m'\n",
        r"field 'every_ms': must be an integer",
        id="string-every-ms",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = '1m'\nmisfire = 'drop'\n",
        r"field 'misfire': must be one of",
        id="bad-misfire",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = '1m'\nargs = {{ a = 1 }}\n",
        r"field 'args': must be an array",
        id="args-table",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = '1m'\nkwargs = [1]\n",
        r"field 'kwargs': must be a table",
        id="kwargs-array",
    ),
    pytest.param(
        f"[[schedule]]\n{ENTRY}every = '1m'\nargs = [1979-05-27]\n",
        r"field 'args': holds a value JSON cannot carry",
        id="date-in-args",
    ),
    pytest.param(
        "[[schedule]]\nqueue = 'reports'\nname = 'has space'\ntask = 't'\nevery = '1m'\n",
        r"schedule #1 \(reports/has space\), field 'name': .*whitespace",
        id="bad-name",
    ),
    pytest.param(
        "[[schedule]]\nname = 'x'\ntask = 't'\nevery = '1m'\n",
        r"schedule #1 \(x\), field 'queue': missing",
        id="no-queue",
    ),
    pytest.param(
        "[[schedule]]\nqueue = 'q'\nname = 'x'\nevery = '1m'\n",
        r"field 'task': missing",
        id="no-task",
    ),
    pytest.param(
        "[[schedules]]\nname = 'x'\n",
        r"unknown top-level key\(s\) 'schedules'",
        id="misspelt-table",
    ),
    pytest.param("source = 'has space'\n", r"field 'source': .*whitespace", id="bad-source"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_an_invalid_file_raises_a_config_error_naming_the_file_the_entry_and_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_schedule_file(path)
    assert str(caught.value).startswith(f"{path}: ")


def test_every_invalid_entry_is_reported_at_once(tmp_path: Path) -> None:
    text = f"""
[[schedule]]
{ENTRY}every = '1m'
[[schedule]]
queue = "reports"
name = "b"
task = "t"
cron = "nope"
[[schedule]]
queue = "reports"
name = "c"
task = "t"
"""
    with pytest.raises(ConfigError) as caught:
        load_schedule_file(write(tmp_path, text))
    message = str(caught.value)
    assert "schedule #2 (reports/b), field 'cron'" in message
    assert "schedule #3 (reports/c), field 'every'" in message
    assert "schedule #1" not in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "document",
    [
        '{"source": "a", "source": "b", "schedule": []}',
        '{"schedule": [{"queue": "q", "name": "n", "task": "t", "every": "1h", "every": "2h"}]}',
        '{"schedule": [{"queue": "q", "name": "n", "task": "t", "every": "1h",'
        ' "kwargs": {"x": 1, "x": 2}}]}',
    ],
)
def test_a_json_file_giving_a_key_twice_is_refused_as_toml_would_be(
    tmp_path: Path, document: str
) -> None:
    path = tmp_path / "twice.json"
    path.write_text(document)
    with pytest.raises(ConfigError, match=r"not valid JSON: the key '\w+' is given twice"):
        load_schedule_file(path)


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_byte_order_mark_is_read_in_toml_as_in_json(tmp_path: Path, suffix: str) -> None:
    text = (
        '{"source": "bom", "schedule": [{"queue": "q", "name": "n", "task": "t", "every": "1h"}]}'
        if suffix == ".json"
        else 'source = "bom"\n[[schedule]]\nqueue = "q"\nname = "n"\ntask = "t"\nevery = "1h"\n'
    )
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    loaded = load_schedule_file(path)
    assert loaded.source == "bom" and [d.name for d in loaded.declarations] == ["n"]


def test_a_missing_file_raises_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nowhere\.toml: cannot read the schedule file") as got:
        load_schedule_file(tmp_path / "nowhere.toml")
    assert "relative" not in str(got.value)


def test_a_missing_file_at_a_relative_path_names_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Session 35 (a probe of a Django project): `CELERY_EMQ_BRIDGE_SCHEDULE_FILE =
    # "schedules.toml"` read by a beat started from another directory said only "No such
    # file or directory".
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as got:
        load_schedule_file("schedules.toml")
    assert str(got.value) == (
        "schedules.toml: cannot read the schedule file: No such file or directory "
        f"(a relative path, looked for from {tmp_path})"
    )


# -- file -> sync -> registry -----------------------------------------------------------


def test_a_file_syncs_created_unchanged_updated_removed_and_runtime_schedules_survive(
    tmp_path: Path, repeat: Repeat
) -> None:
    assert (
        repeat.register("reports", "manual", every="1h", template={"task": "by_hand"})
        == "registered"
    )
    runtime_record = repeat.client.hgetall(repeat.keys("reports").record("manual"))
    runtime_score = repeat.client.zscore(repeat.keys("reports").registry, "manual")

    def runtime_untouched() -> None:
        assert repeat.client.hgetall(repeat.keys("reports").record("manual")) == runtime_record
        assert repeat.client.zscore(repeat.keys("reports").registry, "manual") == runtime_score

    path = write(tmp_path, GOOD)
    first = sync_file(repeat, path)
    assert sorted(d.name for d in first.create) == ["digest", "nightly"]
    assert {r.name: r.source for r in repeat.list("reports")} == {
        "digest": "billing",
        "nightly": "billing",
        "manual": None,
    }
    runtime_untouched()

    before = snapshot(repeat)
    second = sync_file(repeat, path)
    assert sorted(d.name for d in second.unchanged) == ["digest", "nightly"]
    assert second.changes == 0
    assert snapshot(repeat) == before  # no write at all: scores and records identical

    nightly_score = repeat.client.zscore(repeat.keys("reports").registry, "nightly")
    write(tmp_path, GOOD.replace('every = "15m"', 'every = "5m"'))
    third = sync_file(repeat, path)
    assert [d.name for d in third.update] == ["digest"]
    assert [d.name for d in third.unchanged] == ["nightly"]
    digest = repeat.get("reports", "digest")
    assert digest is not None
    assert digest.definition.cadence == Every(300_000)
    assert repeat.client.zscore(repeat.keys("reports").registry, "nightly") == nightly_score
    runtime_untouched()

    write(tmp_path, HEADER + DIGEST.replace('every = "15m"', 'every = "5m"'))
    fourth = sync_file(repeat, path)
    assert fourth.remove == [("reports", "nightly")]
    assert sorted(repeat.names("reports")) == ["digest", "manual"]
    runtime_untouched()


def test_a_dry_run_sync_of_a_file_writes_nothing(tmp_path: Path, repeat: Repeat) -> None:
    plan = sync_file(repeat, write(tmp_path, GOOD), dry_run=True)
    assert len(plan.create) == 2
    assert snapshot(repeat) == {}


def test_an_invalid_entry_leaves_the_registry_unchanged_even_when_other_entries_are_valid(
    tmp_path: Path, repeat: Repeat
) -> None:
    path = write(tmp_path, GOOD)
    sync_file(repeat, path)
    before = snapshot(repeat)
    broken = '[[schedule]]\nqueue = "reports"\nname = "x"\ntask = "t"\ncron = "bad"\n'
    write(tmp_path, GOOD.replace('every = "15m"', 'every = "1m"') + broken)
    with pytest.raises(ConfigError, match=r"schedule #3 \(reports/x\), field 'cron'"):
        sync_file(repeat, path)
    assert snapshot(repeat) == before


def test_five_concurrent_syncs_of_one_file_converge_on_one_entry_per_name(
    tmp_path: Path, redis_url: str, prefix: str
) -> None:
    entries = "".join(
        f'[[schedule]]\nqueue = "q{i % 3}"\nname = "job{i}"\ntask = "t{i}"\nevery = "{i + 1}m"\n'
        for i in range(30)
    )
    path = write(tmp_path, f'source = "fleet"\n{entries}')
    barrier = threading.Barrier(5)
    plans: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        client = redis.Redis.from_url(redis_url)
        try:
            barrier.wait(timeout=30)
            plan = sync_file(Repeat(client, prefix), path)
            with lock:
                plans.append(plan)
        except BaseException as exc:
            with lock:
                errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert len(plans) == 5
    # Each name was created by exactly one of the syncs; the others found it in place.
    assert sum(len(p.create) for p in plans) == 30
    assert sum(len(p.create) + len(p.unchanged) for p in plans) == 5 * 30
    repeat = Repeat(redis.Redis.from_url(redis_url), prefix)
    try:
        for q in range(3):
            names = repeat.names(f"q{q}")
            assert sorted(names) == sorted(f"job{i}" for i in range(30) if i % 3 == q)
            assert repeat.client.zcard(repeat.keys(f"q{q}").registry) == 10
        assert {r.source for q in range(3) for r in repeat.list(f"q{q}")} == {"fleet"}
        # One more sync from any host finds nothing to do.
        assert sync_file(repeat, path).changes == 0
    finally:
        repeat.client.close()


def test_the_shipped_example_schedule_file_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "schedules.toml"
    loaded = load_schedule_file(example)
    assert loaded.source == "example-app"
    assert {(d.queue, d.name) for d in loaded.declarations} == {
        ("reports", "digest"),
        ("reports", "nightly"),
        ("emails", "retry-bounces"),
    }


# -- the occurrence policies: overlap and pause_after_failures ------------------------------

POLICIES = f"""
[[schedule]]
{ENTRY}every = "1m"
overlap = "replace"
pause_after_failures = 1
[[schedule]]
queue = "reports"
name = "plain"
task = "t"
every = "1m"
"""


def test_overlap_and_pause_after_failures_land_in_the_definition_and_the_record(
    tmp_path: Path, repeat: Repeat
) -> None:
    digest, plain = load_schedule_file(write(tmp_path, POLICIES)).declarations
    assert (digest.definition.overlap, digest.definition.pause_after_failures) == ("replace", 1)
    assert (plain.definition.overlap, plain.definition.pause_after_failures) == ("allow", None)
    assert digest.definition.digest != plain.definition.digest  # part of what a sync compares
    sync_file(repeat, tmp_path / "schedules.toml")
    record = repeat.client.hgetall(repeat.keys("reports").record("digest"))
    assert (record[b"overlap"], record[b"pause_after_failures"]) == (b"replace", b"1")
    plain_record = repeat.client.hgetall(repeat.keys("reports").record("plain"))
    assert b"overlap" not in plain_record and b"pause_after_failures" not in plain_record
    for overlap in ("allow", "skip", "buffer_one", "replace"):
        entry = {"queue": "q", "name": "n", "task": "t", "every": "1h", "overlap": overlap}
        assert declaration_from_entry(entry).definition.overlap == overlap


WHOLE = r"must be a whole number of failures from 1 to 1000000, got"


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("overlap", "parallel", r"must be one of allow, skip, buffer_one, replace, got 'parallel'"),
        ("overlap", 2, r"must be one of allow, skip, buffer_one, replace, got an integer"),
        ("overlap", {"mode": "skip"}, r"must be one of .*, got a table"),
        ("pause_after_failures", False, rf"{WHOLE} a boolean"),
        ("pause_after_failures", 3.0, rf"{WHOLE} a number"),
        ("pause_after_failures", "3", rf"{WHOLE} a string"),
        ("pause_after_failures", [3], rf"{WHOLE} an array"),
        ("pause_after_failures", 0, rf"{WHOLE} 0; leave it out to never pause"),
        ("pause_after_failures", -5, rf"{WHOLE} -5; leave it out to never pause"),
        ("pause_after_failures", 10**15, rf"{WHOLE} 1000000000000000"),
    ],
)
def test_a_bad_overlap_or_pause_after_failures_is_one_config_error_naming_the_field(
    field: str, value: object, reason: str
) -> None:
    entry = {"queue": "q", "name": "n", "task": "t", "every": "1h", field: value}
    with pytest.raises(ConfigError, match=rf"^schedule q/n, field '{field}': {reason}$") as caught:
        declaration_from_entry(entry)
    assert "\n" not in str(caught.value)
