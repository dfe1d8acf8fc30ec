"""`export --source S` refused because a file cannot carry some of S's schedules names each
of them on a `!` line (stderr) with the reason, before its one-line error; nothing is
written."""

from __future__ import annotations

from pathlib import Path

from cli_run import Run
from registry_state import snapshot

from emq_bridge import Repeat
from emq_bridge.template import TaskTemplate

TASK = TaskTemplate("app.t").to_dict()


def test_a_refused_source_export_lists_each_schedule_it_cannot_carry_before_the_error(
    run: Run, repeat: Repeat, tmp_path: Path
) -> None:
    repeat.upsert("q", "plain", every="1m", template=TASK, source="ops")
    repeat.upsert("q", "raw", every="1m", template={"task": "app.t"}, source="ops")
    repeat.upsert("q", "null-arg", every="1m", template={**TASK, "args": [None]}, source="ops")
    repeat.upsert("other", "custom", every="1m", template={**TASK, "schedule": "x"}, source="ops")
    repeat.upsert("q", "theirs", every="1m", template={"task": "app.t"}, source="else")
    before = snapshot(repeat)
    out = tmp_path / "ops.toml"

    result = run("export", "--source", "ops", "-o", str(out))
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[:-1] == [
        "! other/custom: its template holds schedule besides task/args/kwargs/options "
        "(a custom Celery schedule is declared in beat_schedule, not in a file)",
        "! q/null-arg: it holds a null, which TOML cannot write: export it with --format json",
        "! q/raw: its template has no args, kwargs, options (written through the API); a file "
        "always declares them, so its sync would rewrite the template",
    ]
    assert lines[-1].startswith(
        "Error: --source ops: 3 of its schedules would be left out (3 this file cannot carry)"
    )
    assert result.stdout == "" and not out.exists()
    assert snapshot(repeat) == before

    # With queues left out as well, the `!` lines are the ones a file cannot carry; the
    # schedules of the queues not exported are counted in the error.
    partial = run("export", "q", "--source", "ops", "--format", "json")
    assert partial.exit_code == 1, partial.output
    lines = partial.stderr.strip().splitlines()
    assert lines[:-1] == [
        "! q/raw: its template has no args, kwargs, options (written through the API); a file "
        "always declares them, so its sync would rewrite the template",
    ]  # a null is carried in JSON
    assert lines[-1].startswith(
        "Error: --source ops: 2 of its schedules would be left out (1 in queues not exported, "
        "1 this file cannot carry)"
    )
    assert partial.stdout == ""


def test_a_source_export_refused_only_for_queues_left_out_prints_the_one_line_error(
    run: Run, repeat: Repeat
) -> None:
    repeat.upsert("a", "x", every="1m", template=TASK, source="ops")
    repeat.upsert("b", "y", every="1m", template=TASK, source="ops")
    result = run("export", "a", "--source", "ops")
    assert result.exit_code == 1, result.output
    [line] = result.stderr.strip().splitlines()  # nothing it cannot carry: no `!` line
    assert line.startswith("Error: --source ops: 1 of its schedules would be left out")
