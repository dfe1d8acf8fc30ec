"""A sync whose only change is the order of a template's keys (which the task receives, so
it is an update) says `template changed` in its diff: it compared the templates as dicts,
equal whatever their order, and printed the update with no reason."""

from __future__ import annotations

from pathlib import Path

from cli_runs import cli_runner

FILE = """
queue = "q"
[[schedule]]
name = "n"
task = "app.t"
every = "1h"
kwargs = {{ {kwargs} }}
"""


def test_a_reordered_template_is_an_update_that_says_template_changed(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    run = cli_runner(redis_url, prefix)
    path = tmp_path / "s.toml"
    path.write_text(FILE.format(kwargs="a = 1, b = 2"))
    assert run("sync", str(path)).exit_code == 0
    path.write_text(FILE.format(kwargs="b = 2, a = 1"))
    result = run("sync", str(path))
    assert result.exit_code == 0, result.output
    assert "~ q/n" in result.output and "template changed" in result.output, result.output
