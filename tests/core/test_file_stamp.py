"""A schedule file's fingerprint (file_stamp.py): its bytes and its source, read without
validating the file; the source must be the one `load_schedule_file` reads, or no stamp."""

from __future__ import annotations

from pathlib import Path

import pytest

from emq_bridge import Repeat
from emq_bridge.config import load_schedule_file
from emq_bridge.file_stamp import file_fingerprint, file_stamp
from emq_bridge.sync import sync

ENTRY = '[[schedule]]\nname = "digest"\ntask = "t"\nevery = "15m"\nqueue = "reports"\n'


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('source = "billing"\n\n' + ENTRY, id="a source key"),
        pytest.param("# no source\n" + ENTRY, id="the file name"),
        pytest.param(
            'source = "ops" # why\nqueue = "reports"\n  [[schedule]]\nname = "d"\n'
            'task = "t"\nevery = "1m"\n',
            id="an indented table",
        ),
        pytest.param(
            'source = "inline"\nschedule = [{name = "d", task = "t", every = "1m", queue = "q"}]\n',
            id="entries inline, no table",
        ),
        pytest.param(
            'source = "cal"\n[calendars]\nholidays = ["2026-12-25"]\n\n' + ENTRY,
            id="calendars first",
        ),
    ],
)
def test_the_source_is_the_one_the_loader_reads(tmp_path: Path, text: str) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text(text)
    found = file_fingerprint(path)
    assert found is not None
    assert found[0] == load_schedule_file(path).source


def test_the_fingerprint_follows_the_bytes_the_kind_and_the_generation(tmp_path: Path) -> None:
    toml = tmp_path / "a.toml"
    toml.write_text('source = "s"\n' + ENTRY)
    same = tmp_path / "b.toml"
    same.write_text('source = "s"\n' + ENTRY)
    first = file_fingerprint(toml)
    assert first is not None and first == file_fingerprint(same)  # the name is not in it
    assert file_fingerprint(toml, generation=3) not in (None, first)
    same.write_text('source = "s"\n' + ENTRY.replace("15m", "16m"))
    assert file_fingerprint(same) not in (None, first)
    as_json = tmp_path / "c.json"
    as_json.write_text('{"source": "s", "schedule": []}')
    found = file_fingerprint(as_json)
    assert found is not None and found[0] == "s"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('source = "bad name"\n' + ENTRY, id="an invalid source"),
        pytest.param("source = \n" + ENTRY, id="a header that does not parse"),
        pytest.param('note = """\n[not a table]\n"""\n' + ENTRY, id="a cut inside a string"),
        pytest.param(b"\xff\xfe", id="not UTF-8"),
    ],
)
def test_what_cannot_be_read_so_has_no_fingerprint(tmp_path: Path, text: str | bytes) -> None:
    path = tmp_path / "schedules.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    assert file_fingerprint(path) is None
    assert file_fingerprint(tmp_path / "missing.toml") is None


def test_a_stamp_is_found_only_for_the_bytes_it_was_made_of(
    any_repeat: Repeat, tmp_path: Path
) -> None:
    path = tmp_path / "schedules.toml"
    path.write_text('source = "s"\n' + ENTRY)
    found = file_stamp(any_repeat, path)
    assert found is not None and not found.holds
    loaded = load_schedule_file(path)
    sync(any_repeat, loaded.declarations, loaded.source, stamp=found.stamp_for(loaded))

    again = file_stamp(any_repeat, path)
    assert again is not None and again.holds
    assert again.queues == ("reports",) and again.declared == 1
    path.write_text('source = "s"\n' + ENTRY.replace("15m", "16m"))
    changed = file_stamp(any_repeat, path)
    assert changed is not None and not changed.holds
