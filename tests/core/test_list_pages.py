"""`list` pages and streams: a page reads only its records, and the whole list never sits
in memory at once, however large the registry."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from emq_bridge import Repeat, define
from emq_bridge.cli import cli
from emq_bridge.cli.render import registration_json, to_json

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day


@pytest.fixture
def filled(repeat: Repeat) -> Repeat:
    """1,200 schedules in `alpha` and 1,300 in `beta`, their next runs a second apart."""
    for queue, count in (("alpha", 1200), ("beta", 1300)):
        items = [
            (queue, f"job-{i:04d}", define(every="1h", template={"task": "t", "args": [i]}))
            for i in range(count)
        ]
        for index, (q, name, definition) in enumerate(items):
            repeat.register(q, name, definition=definition, now_ms=T0 + index * 1000)
    return repeat


def run(repeat: Repeat, redis_url: str, *args: str) -> str:
    result = CliRunner().invoke(
        cli, ["--redis-url", redis_url, "--prefix", repeat.prefix, "list", *args]
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_streamed_json_is_the_whole_list_in_order_and_formatted_as_one_document(
    filled: Repeat, redis_url: str
) -> None:
    out = run(filled, redis_url, "--json")
    items = json.loads(out)
    assert [(i["queue"], i["name"]) for i in items] == [
        (q, f"job-{i:04d}") for q, n in (("alpha", 1200), ("beta", 1300)) for i in range(n)
    ]
    now_ms = items[0]["now_ms"]
    whole = [registration_json(r, now_ms) for q in ("alpha", "beta") for r in filled.list(q)]
    assert out == to_json(whole) + "\n"  # byte for byte what one json.dumps would print


def test_pages_follow_one_another_across_queues(filled: Repeat, redis_url: str) -> None:
    def page(offset: int, limit: int) -> list[str]:
        out = run(filled, redis_url, "--json", "--offset", str(offset), "--limit", str(limit))
        return [f"{i['queue']}/{i['name']}" for i in json.loads(out)]

    assert page(0, 3) == ["alpha/job-0000", "alpha/job-0001", "alpha/job-0002"]
    assert page(1198, 4) == ["alpha/job-1198", "alpha/job-1199", "beta/job-0000", "beta/job-0001"]
    assert page(2499, 10) == ["beta/job-1299"]
    assert page(5000, 10) == []
    assert run(filled, redis_url, "beta", "--limit", "0", "--json") == "[]\n"


def test_a_table_page_has_its_header_and_only_its_rows(filled: Repeat, redis_url: str) -> None:
    lines = run(filled, redis_url, "beta", "--offset", "10", "--limit", "2").splitlines()
    assert lines[0].split()[:3] == ["QUEUE", "NAME", "CADENCE"]
    assert [line.split()[1] for line in lines[1:]] == ["job-0010", "job-0011"]


def test_the_registry_reads_one_page(filled: Repeat) -> None:
    assert [r.name for r in filled.list("beta", offset=1299, limit=5)] == ["job-1299"]
    assert [r.name for r in filled.list("alpha", offset=2, limit=2)] == ["job-0002", "job-0003"]
    assert filled.count("alpha") == 1200
    assert sum(1 for _ in filled.iter_list("beta")) == 1300
    with pytest.raises(ValueError, match="offset must be a whole number from 0"):
        filled.list("alpha", offset=-1)
