"""An option given no value named the top-level help (`(see 'emq-bridge --help')`), though the
exit-code section promises the command's: click's parser raises that error with no context,
so the hint now names the command the group was invoking."""

from __future__ import annotations

import pytest
from cli_runs import cli_runner, one_error_line


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["add", "q", "n", "--task", "t", "--every", "1m", "--misfire"], "add"),
        (["add", "q", "n", "--task"], "add"),
        (["history", "q", "n", "-n"], "history"),
        (["list", "--label"], "list"),
        (["import", "redbeat", "--source"], "import redbeat"),
    ],
)
def test_an_option_given_no_value_names_its_commands_help(
    redis_url: str, prefix: str, args: list[str], command: str
) -> None:
    line = one_error_line(cli_runner(redis_url, prefix)(*args), 2)
    assert line.endswith(f"requires an argument. (see 'emq-bridge {command} --help')"), line


def test_a_group_option_given_no_value_still_names_the_groups_help(
    redis_url: str, prefix: str
) -> None:
    line = one_error_line(cli_runner(redis_url, prefix)("--prefix"), 2)
    assert line == "Error: Option '--prefix' requires an argument. (see 'emq-bridge --help')"
