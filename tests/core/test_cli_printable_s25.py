"""Text from outside printed raw (found by a probe): a pause note holding a newline printed
as a line of its own in `show` (it could pass for another field), and control characters
(an escape sequence) in a pause note, a task's error or a name quoted by an error reached
the terminal as they were (click strips them only off a stream that is no terminal). They
are printed as `\\xNN` escapes now, each on its line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import Run, cli_runner, one_error_line

from emq_bridge import Pump, Repeat
from emq_bridge.lifecycle import report_of
from emq_bridge.testing import RecordingDispatcher

ESC = "\x1b[31m"


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    return cli_runner(redis_url, prefix)


def test_a_pause_note_with_a_newline_stays_on_its_line_in_show(repeat: Repeat, run: Run) -> None:
    repeat.register("q", "x", every="1h", template={"task": "t"})
    repeat.pause("q", "x", note=f"fixed\n  state     active{ESC}", by="al\rice")
    shown = run("show", "q", "x")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert "  note      fixed\\x0a  state     active\\x1b[31m" in lines
    assert not any(line.startswith("  state     active") for line in lines)
    assert any(line.startswith("  paused by al\\x0dice") for line in lines)
    assert "\x1b" not in shown.stdout and "\r" not in shown.stdout


def test_a_task_error_with_control_characters_is_escaped_in_show_and_history(
    repeat: Repeat, run: Run
) -> None:
    repeat.register("q", "x", every="1h", template={"task": "t"})
    repeat.trigger("q", "x")
    sent = RecordingDispatcher()
    Pump(repeat, ["q"], sent).run_once()
    (occurrence,) = sent.occurrences
    repeat.report([report_of("failed", occurrence, error=f"bad{ESC}\x07")])
    for command in (("show", "q", "x"), ("history", "q", "x")):
        result = run(*command)
        assert result.exit_code == 0, result.output
        assert "bad\\x1b[31m\\x07" in result.stdout
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout


def test_an_error_quoting_a_control_character_is_one_escaped_line(run: Run, tmp_path: Path) -> None:
    schedules = tmp_path / "schedules.toml"
    schedules.write_text('queue = "q"\n[[schedule]]\nname = "bad\\u001b[31mname"\ntask = "t"\n')
    line = one_error_line(run("sync", str(schedules)), 1)
    # Not stripped either (click strips escape sequences off a stream that is no terminal,
    # and writes them to one as they are).
    assert "\x1b" not in line and "(q/bad\\x1b[31mname)" in line
