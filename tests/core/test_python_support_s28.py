"""The Python versions emq-bridge supports are the ones it is tested on: 3.11 and newer.

It said `requires-python >=3.10`, where the suite could not run (two tests import
`datetime.UTC`) and the package behaved otherwise: `--start-at 2027-01-07T09:00:00+0100`
and other ISO 8601 forms Python 3.11's `datetime.fromisoformat` reads were refused on 3.10
as "not an ISO 8601 date and time" (a probe on 3.10.13). Python 3.10 reached its end of life
in October 2026."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from emq_bridge.bounds import epoch_ms

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_requires_the_pythons_it_is_tested_on() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=3.11"
    assert sys.version_info >= (3, 11)
    assert project["tool"]["mypy"]["python_version"] == "3.11"
    assert project["tool"]["ruff"]["target-version"] == "py311"


def test_the_iso_8601_forms_python_311_reads_are_read() -> None:
    expected = epoch_ms("2027-01-07T08:00:00Z", "start_at")
    for text in ("2027-01-07T09:00:00+0100", "20270107T080000Z", "2027-01-07T08:00:00.000Z"):
        assert epoch_ms(text, "start_at") == expected, text
