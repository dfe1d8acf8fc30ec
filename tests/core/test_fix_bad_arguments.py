"""Bad arguments found by feeding every surface strange input: each is now refused with an
`emq_bridge.errors` exception (or one line and exit 2) before anything is written.

Before: `now_ms=nan` stored `nan` as a record's times (the record then read as corrupt) and
a trigger with `now_ms=1.5` wrote a lease no pump could read (the trigger was dropped); a
URL's db of 5,000 digits fell back to db 0; a 1 MB interval string took minutes in a regex;
`day_and="no"` switched the rule on; `resume(catchup="x")` caught up; `at=5`,
`exclude=5`, `upsert_many` of a short tuple, `names(offset=1.5)`, `history(n=10**20)`,
`next_runs(n=nan)`, `Pump(lease_ms="x")` raised `TypeError`s, plain `ValueError`s or a
Redis "out of range" told as a registry failure.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from registry_state import snapshot

from emq_bridge import ConfigError, Repeat, ScheduleError, define
from emq_bridge.cadence import parse_every, parse_span
from emq_bridge.pump import Pump
from emq_bridge.testing import RecordingDispatcher
from emq_bridge.urls import check_url

TEMPLATE = {"task": "t"}
BAD_NOW = [1.5, "1", float("nan"), True, -1, 2**60, None.__class__]


@pytest.mark.parametrize("now_ms", BAD_NOW, ids=repr)
def test_a_bad_now_ms_is_refused_before_any_write(repeat: Repeat, now_ms: Any) -> None:
    repeat.register("q", "base", every="1h", template=TEMPLATE, now_ms=1_000_000)
    before = snapshot(repeat)
    with pytest.raises(ScheduleError, match="now_ms must be an int of epoch ms"):
        repeat.register("q", "other", every="1m", template=TEMPLATE, now_ms=now_ms)
    with pytest.raises(ScheduleError, match="now_ms"):
        repeat.trigger("q", "base", now_ms=now_ms)
    with pytest.raises(ScheduleError, match="now_ms"):
        repeat.pause("q", "base", now_ms=now_ms)
    with pytest.raises(ScheduleError, match="now_ms"):
        repeat.scan("q", 10, now_ms=now_ms)
    with pytest.raises(ScheduleError, match="now_ms"):
        repeat.scan_many(["q"], 10, now_ms=now_ms)
    with pytest.raises(ScheduleError, match="now_ms"):
        Pump(repeat, ["q"], RecordingDispatcher()).run_once(now_ms)
    assert snapshot(repeat) == before


def test_a_trigger_at_a_given_instant_still_fires(repeat: Repeat) -> None:
    repeat.register("q", "base", every="1h", template=TEMPLATE, now_ms=1_000_000)
    repeat.trigger("q", "base", now_ms=2_000_000)
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once(2_000_001)
    assert [o.name for o in sent.occurrences] == ["base"]


def test_resume_refuses_a_catchup_that_is_not_a_bool(repeat: Repeat) -> None:
    repeat.register("q", "base", every="1h", template=TEMPLATE)
    repeat.pause("q", "base")
    before = snapshot(repeat)
    with pytest.raises(ScheduleError, match="catchup must be True or False"):
        repeat.resume("q", "base", catchup="x")  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="now_ms"):
        repeat.resume("q", "base", now_ms=1.5)  # type: ignore[arg-type]
    assert snapshot(repeat) == before


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda r: r.names("q", offset=-1), "offset must be a whole number"),
        (lambda r: r.names("q", offset=1.5), "offset must be a whole number"),
        (lambda r: r.list("q", limit=2**60), "limit must be a whole number"),
        (lambda r: r.list("q", offset=True), "offset must be a whole number"),
        (lambda r: r.history("q", "base", n=10**20), "n must be a whole number"),
        (lambda r: r.history("q", "base", n=-1), "n must be a whole number"),
        (lambda r: r.next_runs("q", "base", n=float("nan")), "n must be a whole number"),
        (lambda r: r.next_runs("q", "base", n=10**6), "n must be a whole number"),
        # A batch of 0 scanned nothing, so a pump given it never fired (a negative one: all).
        (lambda r: r.scan("q", 0), "batch must be a whole number from 1"),
        (lambda r: r.scan("q", -1), "batch must be a whole number from 1"),
        (lambda r: r.scan_many(["q"], 0), "batch must be a whole number from 1"),
        (lambda r: r.scan_many(["q"], "5"), "batch must be a whole number from 1"),
    ],
)
def test_reads_refuse_bad_counts_with_a_config_error(repeat: Repeat, call: Any, match: str) -> None:
    repeat.register("q", "base", every="1h", template=TEMPLATE)
    with pytest.raises(ConfigError, match=match):
        call(repeat)


def test_reads_take_their_counts_as_before(repeat: Repeat) -> None:
    repeat.register("q", "base", every="1h", template=TEMPLATE)
    assert repeat.names("q", offset=0, limit=0) == []
    assert [r.name for r in repeat.list("q", offset=0, limit=10)] == ["base"]
    assert repeat.history("q", "base", n=0) == []
    assert len(repeat.next_runs("q", "base", n=3)) == 3
    found = repeat.scan("q", 1, now_ms=repeat.server_time_ms() + 2 * 3600 * 1000)
    assert [name for name, _ in found.due] == ["base"]


@pytest.mark.parametrize(
    "items",
    [[("q", "ok", define(every="1m", template=TEMPLATE)), ("q", "short")], [("q", "d", {})]],
    ids=["a short tuple", "a dict for a definition"],
)
def test_upsert_many_refuses_a_malformed_item_before_any_write(repeat: Repeat, items: Any) -> None:
    with pytest.raises(ScheduleError, match=r"takes \(queue, name, Definition\) tuples"):
        repeat.upsert_many(items)
    assert snapshot(repeat) == {}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"lease_ms": "x"}, "lease_ms must be a whole number from 1 to 86400000"),
        ({"lease_ms": 0}, "lease_ms must be a whole number"),
        ({"lease_ms": 10**30}, "lease_ms must be a whole number"),
        ({"batch_size": 1.5}, "batch_size must be a whole number"),
        ({"max_sleep_s": float("nan")}, "max_sleep_s must be a number of seconds"),
        ({"max_sleep_s": float("inf")}, "max_sleep_s must be a number of seconds"),
        ({"max_sleep_s": "x"}, "max_sleep_s must be a number of seconds"),
        ({"start_timeout_ms": 0}, "start_timeout_ms must be a positive int"),
    ],
)
def test_a_pump_refuses_bad_options(repeat: Repeat, options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Pump(repeat, ["q"], RecordingDispatcher(), **options)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"cron": "0 0 13 * 5", "day_and": "no"}, "day_and must be True or False, got 'no'"),
        ({"every": "1m", "exclude": 5}, "exclude must be a list of rules"),
        ({"at": 5}, "at must be a datetime or an ISO 8601 string, got int"),
        ({"cron": "0 0 * * *", "tz": "UTC!"}, "unknown time zone"),
    ],
)
def test_define_refuses_wrong_types_it_took_or_crashed_on(
    options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ScheduleError, match=match):
        define(template=TEMPLATE, **options)


def test_define_names_a_zoneinfo_given_for_tz_and_its_key() -> None:
    from zoneinfo import ZoneInfo

    with pytest.raises(ScheduleError, match=r"got ZoneInfo \(its key: 'Europe/Paris'\)"):
        define(template=TEMPLATE, cron="0 0 * * *", tz=ZoneInfo("Europe/Paris"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "parse", [parse_every, lambda v: parse_span(v, "jitter")], ids=["every", "jitter"]
)
@pytest.mark.parametrize("text", ["1" * 1_000_000, "0" * 40_000 + "x"], ids=["digits", "zeros"])
def test_a_long_interval_string_is_refused_at_once(parse: Any, text: str) -> None:
    started = time.process_time()
    with pytest.raises(ScheduleError, match="more than 256 characters"):
        parse(text)
    # Not a timing assertion of speed: the old regex took minutes here; one CPU second is
    # a bound no machine misses unless the quadratic scan is back.
    assert time.process_time() - started < 1.0


def test_the_longest_interval_written_out_still_parses() -> None:
    assert parse_every("1w 6d 23h 59m 59s 999ms") == 2 * 604_800_000 - 1


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis://127.0.0.1:6379/" + "1" * 5000, "the path must be a db number"),
        ("redis://127.0.0.1:6379/99999999999999999999", "the path must be a db number"),
        ("redis://127.0.0.1:6379/?db=1111111111111", "db must be a db number"),
        ("redis://127.0.0.1:6379/0?socket_timeout=99999999999", "below 1e9"),
        ("redis+sentinel://127.0.0.1:26379/mymaster/" + "1" * 50, "malformed|invalid"),
    ],
)
def test_urls_with_numbers_redis_py_cannot_use_are_refused(url: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/15",
        "redis://127.0.0.1:6379/015/",
        "redis://127.0.0.1:6379/0?socket_timeout=999999999&socket_connect_timeout=0.5",
        "redis+sentinel://127.0.0.1:26379/mymaster/3",
    ],
)
def test_usable_urls_still_pass(url: str) -> None:
    check_url(url)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("null", "a schedule file is one JSON object, got null"),
        (
            '{"queue": "q", "schedule": [{"name": "a", "task": "", "every": "1m"}]}',
            "must be a non-empty string, got an empty string",
        ),
        (
            '{"queue": "q", "schedule": [{"name": "a", "task": "t", "every": "1m", '
            '"exclude": [5]}]}',
            "must be an array of rule strings, got an array holding an integer",
        ),
    ],
)
def test_schedule_file_errors_say_what_was_wrong(tmp_path: Any, text: str, match: str) -> None:
    from emq_bridge.config import load_schedule_file

    path = tmp_path / "schedules.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_schedule_file(path)
