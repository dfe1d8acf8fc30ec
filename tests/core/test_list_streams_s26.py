"""`emq-bridge list` prints its table as it reads the registry, a thousand rows at a time, as
its help says (found by a probe, session 26: it held every row and printed nothing until
the end, 123 MB and 17 s at 100,000 schedules). Real server, the CLI as a process."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from processes import run_cli

from emq_bridge import Repeat, define
from emq_bridge.cli.render import table, table_lines


def test_the_table_comes_a_chunk_at_a_time_from_rows_never_all_read() -> None:
    def endless() -> Iterator[list[str]]:
        for i in itertools.count():
            yield [f"q{i % 3}", f"name-{i}", "every 1s"]

    first = list(itertools.islice(table_lines(["queue", "name", "cadence"], endless()), 5))
    assert first[0].split() == ["QUEUE", "NAME", "CADENCE"] and len(first) == 5


def test_a_chunk_aligns_as_the_whole_table_does() -> None:
    rows = [["q", f"n{i}", "x" * (i % 7)] for i in range(40)]
    assert "\n".join(table_lines(["queue", "name", "cadence"], rows)) == table(
        ["queue", "name", "cadence"], rows
    )


def test_list_prints_every_schedule_once_under_one_header(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    every = define(every="1h", template={"task": "t"})
    repeat.upsert_many([("q", f"job-{i:05d}", every) for i in range(2_300)])
    done = run_cli(redis_url, prefix, "list", "q")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["QUEUE", "NAME"]
    names = [line.split()[1] for line in lines[1:]]
    assert len(names) == 2_300 and len(set(names)) == 2_300
    assert sum(line.startswith("QUEUE") for line in lines) == 1
