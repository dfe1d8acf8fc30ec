"""Bad input found by session 39's input probe: each refused with a clear line naming what is
wrong (or shown escaped), nothing written."""

from __future__ import annotations

import pytest
from cli_runs import Run, cli_runner, key_count, one_error_line

from emq_bridge import Repeat, ScheduleError, define


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


def test_a_task_name_too_long_is_refused_naming_the_task(
    run: Run, repeat: Repeat, prefix: str
) -> None:
    # It was refused as a template too big, naming args, kwargs and options.
    line = one_error_line(run("add", "q", "z", "--task", "t" * 70_000, "--every", "1m"), 1)
    assert "field 'task'" in line and "the limit is 1,000" in line, line
    assert key_count(repeat.client, prefix) == 0
    with pytest.raises(ScheduleError, match="task name is 1,001 characters"):
        define(every="1m", template={"task": "t" * 1_001})
    define(every="1m", template={"task": "t" * 1_000})


def test_a_bidirectional_override_in_a_note_is_shown_escaped(run: Run, repeat: Repeat) -> None:
    # Refused in names and tasks, it was taken in a pause note and printed raw by `show`: a
    # right-to-left override reorders what the terminal shows of the rest of the line.
    repeat.register("q", "x", every="1h", template={"task": "t"})
    assert run("pause", "q", "x", "--note", "ok \u202eevil").exit_code == 0
    shown = run("show", "q", "x")
    assert shown.exit_code == 0, shown.output
    assert "ok \\u202eevil" in shown.stdout and "\u202e" not in shown.stdout
    line = one_error_line(run("add", "q", "x\u202ey", "--task", "t", "--every", "1m"), 1)
    assert "\u202e" not in line and "x\\u202ey" in line, line


@pytest.mark.parametrize("every", ["1m1m", "1s1m", "1h1h1h", "30m1h"])
def test_an_interval_that_repeats_or_disorders_its_units_is_refused(
    run: Run, repeat: Repeat, prefix: str, every: str
) -> None:
    # They were summed: "1m1m" ran every 2 minutes, "1s1m" every 61 seconds.
    line = one_error_line(run("add", "q", "z", "--task", "t", "--every", every), 1)
    assert "each unit once, the largest first" in line, line
    assert key_count(repeat.client, prefix) == 0
    with pytest.raises(ScheduleError, match="each unit once"):
        define(every=every, template={"task": "t"})
    assert define(every="1h30m", template={"task": "t"}).cadence.describe() == "every 90m"


@pytest.mark.parametrize("importer", ["redbeat", "django-celery-beat"])
def test_an_import_with_a_bad_source_is_bad_usage(run: Run, redis_url: str, importer: str) -> None:
    # It exited 1 (bad input) after reading the rows; a bad option is bad usage: exit 2.
    where = ["--from", redis_url] if importer == "redbeat" else ["--database-url", "sqlite://"]
    line = one_error_line(run("import", importer, *where, "--source", ""), 2)
    assert "Invalid value for '--source': source must not be empty" in line, line
