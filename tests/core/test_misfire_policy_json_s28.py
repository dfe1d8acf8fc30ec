"""`show --json` and `list --json` say what a misfire policy means (`misfire_policy`): a
schedule left at the default said `"misfire": "coalesce"` and one given `--misfire latest`
`"latest"`, which behave alike, so `jq 'select(.misfire == "latest")'` missed the defaults."""

from __future__ import annotations

import json

from cli_runs import cli_runner


def test_the_json_says_the_policy_a_misfire_name_means(redis_url: str, prefix: str) -> None:
    run = cli_runner(redis_url, prefix)
    for name, extra in (("a", []), ("b", ["--misfire", "latest"]), ("c", ["--misfire", "all"])):
        added = run("add", "q", name, "--task", "t", "--every", "1h", *extra)
        assert added.exit_code == 0, added.output
    rows = json.loads(run("list", "q", "--json").stdout)
    by_name = {row["name"]: (row["misfire"], row["misfire_policy"]) for row in rows}
    assert by_name == {"a": ("coalesce", "latest"), "b": ("latest", "latest"), "c": ("all", "all")}
    shown = json.loads(run("show", "q", "a", "--json").stdout)
    assert shown["misfire_policy"] == "latest"
