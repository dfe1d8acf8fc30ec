"""A schedule whose exclusions leave it no run is refused naming it, whichever check finds
it (found by a probe, session 26).

The schedule file's check (on this host's clock) skipped entries with `immediately`, and the
registry's own refusal (on the server's clock: the one that counts when the two disagree)
named no schedule: `Error: the exclusions cover every run ...`. Real server, the CLI as a
process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from processes import run_cli

from emq_bridge import Declaration, Repeat, define
from emq_bridge.errors import ScheduleError
from emq_bridge.registry import UPSERT_CHUNK
from emq_bridge.sync import sync

FILE = """\
source = "s"
queue = "q"

[[schedule]]
name = "ok"
task = "t"
every = "1h"

[[schedule]]
name = "never"
task = "t"
cron = "0 9 * * *"
immediately = true
exclude = ["cron:* * * * *"]
"""


def test_a_files_immediately_entry_with_no_run_left_is_refused_naming_entry_and_field(
    tmp_path: Path, redis_url: str, prefix: str, any_repeat: Repeat
) -> None:
    path = tmp_path / "never.toml"
    path.write_text(FILE)
    result = run_cli(redis_url, prefix, "sync", str(path))
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert f"{path}: schedule #2 (q/never), field 'exclude': the exclusions cover every run" in line
    assert run_cli(redis_url, prefix, "list", "q").stdout.strip() == "", "nothing written"


@pytest.mark.parametrize("immediately", [False, True])
def test_the_registrys_refusal_names_the_schedule(any_repeat: Repeat, immediately: bool) -> None:
    # Past the host's check (a declaration made in code, or a host clock behind the
    # server's): the registry refuses it on the server's clock, naming it.
    never = define(
        cron="0 9 * * *",
        template={"task": "t"},
        exclude=["cron:* * * * *"],
        immediately=immediately,
    )
    fine = define(every="1h", template={"task": "t"})
    # More than one upsert call's worth before it: none of them is written either.
    declared = [Declaration("q", f"fine-{i}", fine) for i in range(UPSERT_CHUNK + 1)]
    declared.append(Declaration("q", "never", never))
    with pytest.raises(ScheduleError, match=r"^q/never: the exclusions cover every run"):
        sync(any_repeat, declared, "s")
    assert any_repeat.list("q", limit=5) == []


def test_a_cadence_excluded_by_its_own_cron_in_a_zone_is_refused_saying_why(
    any_repeat: Repeat,
) -> None:
    # Session 34 (a DST probe): a cron excluded by itself outside UTC (no 400-year cycle
    # check there) was refused as "the exclusions skip more than 20000 runs in a row",
    # which said neither from when nor that the schedule would never run.
    never = define(
        cron="30 1 * * *",
        tz="America/New_York",
        template={"task": "t"},
        exclude=["cron:30 1 * * *"],
    )
    with pytest.raises(ScheduleError) as refused:
        any_repeat.upsert("q", "own-cron", definition=never)
    message = str(refused.value)
    assert "skip more than 20000 runs in a row from " in message
    assert "would run rarely if ever" in message and "the cadence's own cron" in message
