"""The web view's pages and JSON API, read through Starlette's TestClient from a real server:
the table, its filters and pages, the schedule page, the timeline, errors, and mounting."""

from __future__ import annotations

import html
import json
import re
from datetime import timedelta

import pytest
import redis
from click.testing import CliRunner
from quiet import quiet_hour, quiet_offset
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient
from web_client import Client, table_rows

from emq_bridge import Occurrence, Pump, Repeat, define
from emq_bridge.cli import cli
from emq_bridge.cli.render import state
from emq_bridge.heartbeat import Heartbeat
from emq_bridge.testing import RecordingDispatcher
from emq_bridge.web import app, pages

HEADER = ["queue", "name", "cadence", "next run", "last outcome", "state", "owner", "labels"]


@pytest.fixture
def filled(repeat: Repeat) -> Repeat:
    """120 schedules in `alpha`, 30 in `beta` (every tenth owned by `app`, three paused)."""
    now = repeat.server_time_ms()
    # Hourly on a grid whose next slot is half an hour away, whatever the time of day: no
    # schedule comes due (nor overdue, `unserved`) while a test reads them.
    phase = timedelta(milliseconds=(now + 1_800_000) % 3_600_000)
    for queue, count in (("alpha", 120), ("beta", 30)):
        for i in range(count):
            definition = define(every="1h", offset=phase, template={"task": "t", "args": [i]})
            repeat.upsert(
                queue,
                f"job-{i:03d}",
                definition=definition,
                source="app" if i % 10 == 0 else None,
                now_ms=now - i * 1000,
            )
    for name in ("job-007", "job-070", "job-100"):
        repeat.pause("alpha", name)
    return repeat


def names(html: str) -> list[str]:
    return [f"{row[0]}/{row[1]}" for row in table_rows(html, "schedules")[1:] if len(row) > 1]


def in_order(repeat: Repeat, *queues: str) -> list[str]:
    """The registry's own order: queue by queue, next-run order within one, paused last."""
    return [f"{q}/{r.name}" for q in queues for r in repeat.list(q)]


def test_the_table_shows_cadence_next_run_in_the_schedules_zone_outcome_state_and_owner(
    repeat: Repeat, web: Client
) -> None:
    repeat.upsert(
        "reports",
        "nightly",
        cron="0 9 * * *",
        tz="Europe/Paris",
        template={"task": "n"},
        source="app",
    )
    # A slot far from now: one passing before the pump would be sent next to the trigger.
    offset = quiet_offset("15m")
    repeat.upsert("reports", "sync", every="15m", offset=offset, template={"task": "s"})
    recorder = RecordingDispatcher()
    repeat.trigger("reports", "sync")
    Pump(repeat, ["reports"], recorder).run_once()
    [occurrence] = recorder.clear()
    repeat.finished(occurrence, ok=False, error="boom")
    repeat.pause("reports", "nightly")

    page = web().get("/")
    assert page.status_code == 200
    rows = {row[1]: row for row in table_rows(page.text, "schedules")[1:]}
    assert table_rows(page.text, "schedules")[0] == HEADER
    nightly, sync = rows["nightly"], rows["sync"]
    assert nightly[0] == "reports"
    assert nightly[2] == "cron 0 9 * * * (Europe/Paris)"
    assert nightly[3] == "- (paused)"
    assert nightly[5:] == ["paused", "app", ""]
    assert sync[2] == define(every="15m", offset=offset).cadence.describe()
    assert sync[2].startswith("every 15m offset ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \((in \d+ (min|s)|now)\)", sync[3]), (
        sync[3]
    )
    assert sync[4:] == ["failed", "active", "(runtime)", ""]


def test_pages_follow_the_registry_order_across_queues(filled: Repeat, web: Client) -> None:
    client, expected = web(), in_order(filled, "alpha", "beta")
    first = client.get("/", params={"limit": 50})
    assert names(first.text) == expected[:50]
    assert "1-50 of 150" in first.text
    seen, url = [], "/?limit=50"
    while url:
        page = client.get(url)
        seen += names(page.text)
        found = re.search(r'id="next" href="([^"]+)"', page.text)
        url = found.group(1).replace("&amp;", "&") if found else ""
    assert seen == expected
    last = client.get("/", params={"start": 140, "limit": 50})
    assert names(last.text) == expected[140:]
    assert 'id="previous" href="/?start=90&amp;limit=50"' in last.text
    assert names(client.get("/", params={"start": 1000}).text) == []


def test_a_page_reads_only_its_records(
    filled: Repeat, web: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[int] = []
    original = Repeat._read

    def counted(self: Repeat, queue: str, batch: list[str]) -> list[object]:
        read.append(len(batch))
        return original(self, queue, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(Repeat, "_read", counted)
    assert len(names(web().get("/", params={"start": 110, "limit": 20}).text)) == 20
    assert sum(read) == 20  # ten from the end of alpha, ten from beta


def test_filters_by_queue_state_owner_and_name_page_without_gaps_or_repeats(
    filled: Repeat, web: Client
) -> None:
    client = web()
    everything = [r for q in ("alpha", "beta") for r in filled.list(q)]
    cases = {
        "queue=beta": [r for r in everything if r.queue == "beta"],
        "state=paused": [r for r in everything if r.paused],
        # Active ones with no owner nor labels: none of the fields the filter reads.
        "queue=beta&state=active": [r for r in everything if r.queue == "beta" and not r.paused],
        "source=app": [r for r in everything if r.source == "app"],
        "q=JOB-01": [r for r in everything if "job-01" in r.name],
        "queue=alpha&state=active&source=app": [
            r for r in everything if r.queue == "alpha" and not r.paused and r.source == "app"
        ],
    }
    for query, wanted in cases.items():
        seen, url = [], f"/?{query}&limit=4"
        while url:
            page = client.get(url)
            assert page.status_code == 200, page.text
            seen += names(page.text)
            found = re.search(r'id="next" href="([^"]+)"', page.text)
            url = found.group(1).replace("&amp;", "&") if found else ""
        assert seen == [f"{r.queue}/{r.name}" for r in wanted], query


def test_the_label_filter_keeps_what_holds_every_pair_in_the_table_and_the_api(
    repeat: Repeat, web: Client
) -> None:
    tags = {
        "a": {"team": "billing", "tier": "gold"},
        "b": {"team": "billing"},
        "c": {"team": "ops", "tier": "gold"},
        "d": None,
    }
    for name, labels in tags.items():
        repeat.upsert("reports", name, definition=define(every="1h", labels=labels))
    client = web()
    cases = {
        "team=billing": ["a", "b"],
        "team=billing,tier=gold": ["a"],  # every pair must match
        " tier=gold , team=ops ": ["c"],
        "team=nobody": [],
    }
    for selector, wanted in cases.items():
        page = client.get("/", params={"label": selector, "limit": 1})
        assert page.status_code == 200, page.text
        seen, url = names(page.text), None
        found = re.search(r'id="next" href="([^"]+)"', page.text)
        while found:  # the pages' links carry the filter
            url = html.unescape(found.group(1))
            assert "label=" in url
            page = client.get(url)
            seen += names(page.text)
            found = re.search(r'id="next" href="([^"]+)"', page.text)
        assert seen == [f"reports/{n}" for n in wanted], selector
        api = client.get("/api/schedules", params={"label": selector}).json()
        assert [item["name"] for item in api["items"]] == wanted
        assert all(item["labels"] == tags[item["name"]] for item in api["items"])
    table = {row[1]: row for row in table_rows(client.get("/").text, "schedules")[1:]}
    assert table["a"][7] == "team=billing, tier=gold" and table["d"][7] == ""
    assert 'id="filter-label" value="team=ops"' in client.get("/?label=team%3Dops").text
    one = client.get("/schedule", params={"queue": "reports", "name": "a"}).text
    assert '<dd class="mono" id="labels">team=billing, tier=gold</dd>' in one
    repeated = client.get(
        "/api/schedules", params=[("label", "team=billing"), ("label", "tier=gold")]
    )
    assert [item["name"] for item in repeated.json()["items"]] == ["a"]
    repeat.upsert("reports", "comma", definition=define(every="1h", labels={"k": "a,b"}))
    for selector in ("k=a,b", "team=nobody,k=a,b", "k=a,b,team=billing"):
        wanted = ["comma"] if selector == "k=a,b" else []
        api = client.get("/api/schedules", params={"label": selector})
        assert api.status_code == 200, api.text  # a comma in a value is the value's
        assert [item["name"] for item in api.json()["items"]] == wanted, selector
    bad = client.get("/", params={"label": "team"})
    assert bad.status_code == 400 and "label 'team' must be KEY=VALUE" in html.unescape(bad.text)
    # Before: a key no schedule can have was a filter matching nothing (200, no items),
    # where `emq-bridge list --label` refuses it (the same rules now).
    for selector in ("=b", "a\x01=b", "a b=c"):
        api = client.get("/api/schedules", params={"label": selector})
        assert api.status_code == 400, selector
        assert "label key" in api.json()["error"], api.text


def test_a_filtered_page_stops_reading_at_its_budget_and_offers_to_read_on(
    filled: Repeat, web: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "SCAN_BUDGET", 40)
    monkeypatch.setattr(pages, "READ_CHUNK", 15)
    client = web()
    page = client.get("/", params={"q": "job-14"})  # job-140.. do not exist: only beta's none
    assert names(page.text) == []
    assert "40 of 150 read (stopped reading: more may match further on)" in page.text
    # Paused schedules come last in their queue: the first requests read on to them.
    found, start, requests = [], 0, 0
    while start is not None and len(found) < 3:
        body = client.get("/api/schedules", params={"state": "paused", "start": start}).json()
        assert body["examined"] <= 40
        found += [i["name"] for i in body["items"]]
        start, requests = body["next_start"], requests + 1
    assert sorted(found) == ["job-007", "job-070", "job-100"] and requests == 3


def test_the_schedule_page_shows_definition_next_runs_history_streak_and_timeline(
    repeat: Repeat, web: Client
) -> None:
    # Slots far from now: one passing between two pump runs would be sent with a trigger.
    hour, quarter = quiet_offset(), quiet_offset("15m")
    repeat.upsert("reports", "hourly", every="1h", offset=hour, template={"task": "h", "args": [1]})
    repeat.upsert("reports", "quarter", every="15m", offset=quarter, template={"task": "q"})
    repeat.upsert(
        "reports", "digest", every="1h", offset=hour, template={"task": "d"}, pause_after_failures=5
    )
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["reports"], recorder)
    outcomes = [(True, None), (False, "ValueError: no rows"), (False, "ValueError: again")]
    for ok, error in outcomes:
        repeat.trigger("reports", "digest")
        pump.run_once()
        occurrence: Occurrence = recorder.clear()[-1]
        repeat.started(occurrence)
        repeat.finished(occurrence, ok=ok, error=error)

    page = web().get("/schedule", params={"queue": "reports", "name": "digest"})
    assert page.status_code == 200
    text = page.text
    assert "reports/digest" in text and "(pauses at 5)" in text
    assert re.search(r'id="failures">2\b', text)
    assert '"task": "d"' in html.unescape(text)
    assert len(re.findall(r"<li>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text)) == 10
    history = table_rows(text, "history")[1:]
    assert [row[1] for row in history] == ["failed", "failed", "succeeded"]
    assert history[0][6] == "ValueError: again" and "triggered" in history[0][5]
    assert all(re.fullmatch(r"\d+ ms|\d+\.\d s", row[4]) for row in history)
    assert 'id="timeline" src="/timeline.svg?queue=reports&amp;name=digest"' in text
    # The timeline: the quarter hours of a day from the current one; the runs in it from
    # now on: 23 or 24 of each hourly schedule, 95 or 96 of the quarter-hourly one.
    svg = web().get("/timeline.svg", params={"queue": "reports", "name": "digest"})
    assert svg.headers["content-type"].startswith("image/svg+xml")
    bars = re.findall(r'class="all"[^>]*><title>(\d+) runs</title>', svg.text)
    assert len(bars) == 96 and 141 <= sum(map(int, bars)) <= 144
    mine = re.findall(r"<title>(\d+) of this schedule's runs</title>", svg.text)
    assert 23 <= sum(map(int, mine)) <= 24
    assert "from 3 schedules due in the window; times in UTC" in svg.text

    body = web().get("/api/schedule", params={"queue": "reports", "name": "digest"}).json()
    assert [h["status"] for h in body["history"]] == ["failed", "failed", "succeeded"]
    assert len(body["next_runs_ms"]) == 10 and body["failures"] == 2
    assert 'id="paused-by"' not in text  # not paused: no pause lines

    assert repeat.pause("reports", "hourly", note="until <the fix> ships", by="ops")
    paused = web().get("/schedule", params={"queue": "reports", "name": "hourly"}).text
    assert re.search(r'id="paused-by">ops, \d{4}-\d\d-\d\d', paused), paused
    assert 'id="paused-note">until &lt;the fix&gt; ships</dd>' in paused  # as `show`, escaped


def test_the_schedule_page_says_a_last_error_is_an_earlier_runs_as_show_does(
    repeat: Repeat, web: Client
) -> None:
    repeat.upsert("reports", "flaky", every="1h", offset=quiet_offset(), template={"task": "f"})
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["reports"], recorder)
    for ok in (False, True):
        repeat.trigger("reports", "flaky")
        pump.run_once()
        occurrence: Occurrence = recorder.clear()[-1]
        repeat.finished(occurrence, ok=ok, error=None if ok else "ValueError: no rows")
    page = web().get("/schedule", params={"queue": "reports", "name": "flaky"}).text
    assert 'id="last-status" class="status-succeeded">succeeded' in page
    assert 'id="last-error">ValueError: no rows (from an earlier run)</dd>' in page


def test_the_schedule_page_prints_the_template_in_its_stored_order_as_show_does(
    repeat: Repeat, web: Client, redis_url: str
) -> None:
    template = {"task": "t", "kwargs": {"zone": "Zürich", "after": 1}, "args": [2]}
    repeat.upsert("reports", "ordered", every="1h", offset=quiet_offset(), template=template)
    shown = CliRunner().invoke(
        cli,
        [
            "--redis-url",
            redis_url,
            "--prefix",
            repeat.prefix,
            "show",
            "reports",
            "ordered",
            "--json",
        ],
    )
    assert shown.exit_code == 0, shown.output
    page = html.unescape(
        web().get("/schedule", params={"queue": "reports", "name": "ordered"}).text
    )
    printed = page[page.index('id="template">') :].split(">", 1)[1].split("</pre>", 1)[0]
    # The order `show` prints, the nested one kept (a reorder is a change), text as text.
    in_show = json.loads(shown.stdout)["template"]
    assert printed == json.dumps(in_show, indent=2, ensure_ascii=False)
    assert list(in_show["kwargs"]) == ["zone", "after"] and in_show == template


def test_the_json_api_gives_what_the_clis_json_gives(
    filled: Repeat, web: Client, redis_url: str
) -> None:
    def cli_json(*args: str) -> object:
        result = CliRunner().invoke(
            cli, ["--redis-url", redis_url, "--prefix", filled.prefix, *args, "--json"]
        )
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def timeless(item: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in item.items() if k not in ("now_ms", "next_run_in_ms")}

    api = web().get("/api/schedules", params={"queue": "alpha", "start": 5, "limit": 7}).json()
    listed = cli_json("list", "alpha", "--offset", "5", "--limit", "7")
    assert isinstance(listed, list)
    assert [timeless(i) for i in api["items"]] == [timeless(i) for i in listed]
    shown = cli_json("show", "alpha", "job-007")
    one = web().get("/api/schedule", params={"queue": "alpha", "name": "job-007"}).json()
    assert isinstance(shown, dict)
    assert timeless({k: v for k, v in one.items() if k not in ("next_runs_ms", "history")}) == (
        timeless(shown)
    )
    assert one["unserved"] == shown["unserved"] and api["items"][0]["unserved"] is False


@pytest.mark.parametrize(
    ("path", "status", "reason"),
    [
        ("/?state=sleeping", 400, "state must be one of active, paused, parked"),
        ("/?start=-1", 400, "start must not be negative"),
        ("/?limit=0", 400, "limit must be between 1 and 500"),
        ("/?limit=ten", 400, "limit must be a whole number"),
        ("/schedule?queue=alpha", 400, "queue and name are both required"),
        ("/schedule?queue=alpha&name=nope", 404, "no registration &#39;nope&#39;"),
        ("/schedule?queue=al%20pha&name=x", 400, "queue"),
        ("/api/schedule?queue=alpha&name=nope", 404, "no registration 'nope'"),
        ("/api/schedules?state=x", 400, "state must be one of"),
        ("/nowhere", 404, "Not Found"),
    ],
)
def test_bad_requests_get_a_one_line_reason(
    filled: Repeat, web: Client, path: str, status: int, reason: str
) -> None:
    response = web().get(path)
    assert response.status_code == status
    assert reason in response.text


def test_an_unreachable_redis_answers_503_without_the_url_or_its_password() -> None:
    repeat = Repeat(redis.Redis.from_url("redis://:s3cret@127.0.0.1:1/0", socket_timeout=1))
    with TestClient(app(repeat)) as client:
        for path in ("/", "/api/schedules"):
            response = client.get(path)
            assert response.status_code == 503
            assert "cannot reach Redis" in response.text
            assert "s3cret" not in response.text and "127.0.0.1:1" not in response.text


def test_mounted_in_a_host_app_its_links_and_cookies_stay_under_the_mount(
    filled: Repeat,
) -> None:
    host = Starlette(routes=[Mount("/ops/schedules", app=app(filled, token="t" * 16))])
    with TestClient(host) as client:
        page = client.get("/ops/schedules/", params={"queue": "beta", "limit": 10})
        assert page.status_code == 200
        assert 'href="/ops/schedules/schedule?queue=beta&amp;name=job-000"' in page.text
        assert 'action="/ops/schedules/unlock"' in page.text
        assert "Path=/ops/schedules/" in page.headers["set-cookie"]
        one = client.get("/ops/schedules/api/schedule?queue=beta&name=job-001")
        assert one.json()["name"] == "job-001"


def test_the_pumps_page_lists_live_pumps_and_the_queues_none_serves(
    filled: Repeat, web: Client
) -> None:
    heartbeat = Heartbeat(["alpha"], max_sleep_s=1.0)
    heartbeat.tick(filled, filled.server_time_ms() - 3000, 2)  # ended 3 s ago, sent 2
    client = web()
    rows = table_rows(client.get("/pumps").text, "pumps")
    assert rows[1] == [
        heartbeat.id,
        heartbeat.host,
        str(heartbeat.pid),
        "pump",
        "alpha",
        "3 s ago",
        "1",
        "2",
        heartbeat.version,
    ]
    assert "No live pump serves: beta" in client.get("/pumps").text
    body = client.get("/api/pumps").json()
    assert [p["id"] for p in body["pumps"]] == [heartbeat.id] and body["unserved_queues"] == [
        "beta"
    ]
    heartbeat.remove(filled)
    assert "no live pump" in client.get("/pumps").text


def test_an_overdue_schedule_of_a_queue_no_pump_serves_is_flagged(
    repeat: Repeat, web: Client
) -> None:
    now = repeat.server_time_ms()
    repeat.upsert("late", "job", every="1h", template={"task": "t"}, now_ms=now - 7_200_000)
    client = web()
    [row] = table_rows(client.get("/").text, "schedules")[1:]
    assert row[3].endswith("ago) · overdue: no pump serves it")
    assert client.get("/api/schedules").json()["items"][0]["unserved"] is True
    heartbeat = Heartbeat(["late"], max_sleep_s=1.0)
    heartbeat.write(repeat)
    [row] = table_rows(client.get("/").text, "schedules")[1:]
    assert "overdue" not in row[3]
    page = client.get("/api/schedule", params={"queue": "late", "name": "job"}).json()
    assert page["unserved"] is False


def test_the_timeline_estimates_what_fires_too_often_to_count_and_skips_the_paused(
    repeat: Repeat,
) -> None:
    repeat.upsert("fast", "every-second", every="1s", template={"task": "t"})
    # At an hour far from now: just after 04:30 its next run would be past the window's end.
    repeat.upsert("fast", "daily", cron=f"30 {quiet_hour()} * * *", template={"task": "t"})
    repeat.upsert("fast", "held", every="1m", template={"task": "t"})
    repeat.pause("fast", "held")
    now = repeat.server_time_ms()
    timeline = pages.read_timeline(repeat, ["fast"], now)
    assert timeline.saturated == 1 and timeline.schedules == 2
    assert abs(sum(timeline.counts) - 1 - 86_400) < 900  # the window starts up to 15 min back
    assert all(850 <= c <= 901 for c in timeline.counts[1:])  # 900 a quarter hour, bar the first
    daily, held = repeat.get("fast", "daily"), repeat.get("fast", "held")
    assert daily is not None and held is not None
    assert sum(timeline.share(daily)) == 1 and sum(timeline.share(held)) == 0


def test_the_filters_read_each_state_from_the_record_as_show_does(repeat: Repeat) -> None:
    repeat.upsert("states", "running", every="1h", template={"task": "t"})
    repeat.upsert("states", "held", every="1h", template={"task": "t"})
    repeat.pause("states", "held")
    # A top of the hour before the first pump run would fire `broken` twice.
    repeat.upsert(
        "states",
        "broken",
        every="1h",
        offset=quiet_offset(),
        template={"task": "t"},
        pause_after_failures=1,
    )
    repeat.upsert("states", "done", every="1s", limit=1, template={"task": "t"})
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["states"], recorder)
    repeat.trigger("states", "broken")
    pump.run_once()
    [failing] = [o for o in recorder.clear() if o.name == "broken"]
    repeat.finished(failing, ok=False, error="boom")  # parks it: a streak of one
    for _ in range(30):
        pump.run_once(now_ms=repeat.server_time_ms() + 5000)
        found = repeat.get("states", "done")
        if found is not None and found.completed is not None:
            break
    shown = {r.name: state(r) for r in repeat.list("states")}
    assert sorted(shown.values()) == ["active", "completed", "parked", "paused"]
    fields = repeat.load_records("states", list(shown), pages.FILTER_FIELDS)
    assert {name: pages.state_of_fields(fields[name]) for name in shown} == shown


def test_registry_names_page_through_lists_order_without_reading_records(filled: Repeat) -> None:
    order = [r.name for r in filled.list("alpha")]
    assert filled.names("alpha") == order
    assert filled.names("alpha", offset=115, limit=10) == order[115:]
    assert filled.names("alpha", offset=3, limit=2) == order[3:5]
    assert filled.names("alpha", limit=0) == [] and filled.names("alpha", offset=500) == []
    with pytest.raises(ValueError, match="offset must be a whole number from 0"):
        filled.names("alpha", offset=-1)


def test_a_parked_schedules_page_shows_its_whole_reason_the_table_cuts(
    repeat: Repeat, web: Client
) -> None:
    repeat.upsert("reports", "lost", every="1h", offset=quiet_offset(), template={"task": "t"})
    reason = "actor t is not declared on this broker; " + "declare it, or remove it; " * 4 + "end"
    template = repeat.load_records("reports", ["lost"], ("template",))["lost"]["template"]
    now = repeat.server_time_ms()
    repeat.park("reports", "lost", [], deadline_ms=0, template=template, reason=reason, now_ms=now)
    client = web()
    assert "..." in client.get("/?queue=reports").text  # the table's cell is cut
    page = client.get("/schedule?queue=reports&name=lost").text
    assert f"parked: {reason}" in page
