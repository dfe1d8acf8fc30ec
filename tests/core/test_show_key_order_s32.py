"""`show` and `show --json` print a template in its stored key order (session 32).

A template keeps the key order its user wrote, and a reorder is a change (docs/design.md):
`add --kwargs '{"a":2,"b":1}' --replace` over `{"b":1,"a":2}` says `updated`. `show` and
`show --json` printed the template with its keys sorted, the same before and after, so the
change it made could not be seen. They now print it as stored; `--json` still sorts the keys
of its own fields (only the template, the user's data, keeps its order), and `list --json`
prints the template as `show --json` does.

The CLI runs in-process with click's CliRunner against the real server of the fixtures.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cli_runs import Run, cli_runner

ADD = ("add", "reports", "order", "--task", "app.report", "--every", "1h")
# Nested dicts out of sorted order too: every depth keeps its order.
FIRST = {"b": 1, "a": 2, "cols": {"zeta": 1, "alpha": 2}}
REORDERED = {"a": 2, "b": 1, "cols": {"alpha": 2, "zeta": 1}}


@pytest.fixture
def run(redis_url: str, prefix: str) -> Run:
    """Invoke the CLI on the test server under the test's own prefix."""
    return cli_runner(redis_url, prefix)


def template_line(run: Run) -> str:
    """The `template` line `show` prints."""
    result = run("show", "reports", "order")
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    (line,) = [line for line in lines if line.startswith("template ")]
    return line.removeprefix("template").strip()


def shown_json(run: Run) -> tuple[str, dict[str, Any]]:
    result = run("show", "reports", "order", "--json")
    assert result.exit_code == 0, result.output
    return result.stdout, json.loads(result.stdout)


def keys(value: dict[str, Any]) -> list[Any]:
    """The keys of `value`, and of its dict values, in order, at every depth."""
    return [(k, keys(v)) if isinstance(v, dict) else k for k, v in value.items()]


def test_show_prints_the_template_in_its_stored_order_and_a_reorder_shows(run: Run) -> None:
    added = run(*ADD, "--kwargs", json.dumps(FIRST))
    assert added.exit_code == 0, added.output

    assert json.loads(template_line(run))["kwargs"] == FIRST
    assert keys(json.loads(template_line(run))["kwargs"]) == keys(FIRST)
    text, data = shown_json(run)
    assert keys(data["template"]["kwargs"]) == keys(FIRST)
    # The template's own keys are stored in the order of their names.
    assert list(data["template"]) == sorted(data["template"])
    # `--json`'s own fields are still printed with their keys sorted.
    assert list(data) == sorted(data)

    replaced = run(*ADD, "--kwargs", json.dumps(REORDERED), "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert "updated" in replaced.output

    assert keys(json.loads(template_line(run))["kwargs"]) == keys(REORDERED)
    after, data = shown_json(run)
    assert keys(data["template"]["kwargs"]) == keys(REORDERED)
    assert after != text

    listed = run("list", "reports", "--json")
    assert listed.exit_code == 0, listed.output
    (item,) = json.loads(listed.stdout)
    assert keys(item["template"]["kwargs"]) == keys(REORDERED)
    assert list(item) == sorted(item)
