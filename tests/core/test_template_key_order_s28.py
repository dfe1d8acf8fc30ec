"""Session 28: a template keeps the key order its user wrote, at every depth of `args`,
`kwargs` and `options`, from the API or a schedule file through the registry to the
dispatcher; its digest follows what would be sent.

Earlier releases stored the template with its keys sorted at every depth (`sort_keys=True`),
so a task reading its columns or steps from a dict got them sorted, unlike under Celery's
own beat. The rules held here: a reorder of a sent dict's keys is a change (`updated`, the
template rewritten, the next run and the cadence kept); the same declaration gives the same
digest in every process; the template's own keys (the envelope) are stored in the order of
their names, so their order is no change; a record an earlier release stored sorted keeps
working as it is until a sync rewrites it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from emq_bridge import Repeat, define
from emq_bridge.config import sync_file
from emq_bridge.migrate.export import export_registry, render
from emq_bridge.pump import Pump
from emq_bridge.template_pieces import join_template
from emq_bridge.testing import RecordingDispatcher

T0 = 1_899_936_000_000  # 2030-03-17T00:00:00Z: on the grid of every interval up to a day
HOUR = 3_600_000


def template() -> dict[str, Any]:
    """A template whose dicts are all out of sorted order, at several depths."""
    return {
        "task": "app.report",
        "args": [{"name": "Name", "email": "E-mail", "age": "Age"}, [{"z": 1, "a": 2}]],
        "kwargs": {
            "options": {"zeta": 1, "alpha": 2, "mid": {"y": [{"q": 0, "b": 1}], "b": None}},
            "b": 1,
            "a": 2,
        },
        "options": {"priority": 5, "expires": 60, "headers": {"zeta": "z", "alpha": "a"}},
    }


def deep_sorted(value: Any) -> Any:
    """`value` with the keys of every dict sorted: what an earlier release stored."""
    if isinstance(value, dict):
        return {key: deep_sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [deep_sorted(item) for item in value]
    return value


def sent(value: Any) -> str:
    """JSON text of `value` in its own key order: equal texts, equal orders."""
    return json.dumps(value, ensure_ascii=False)


def parts(tmpl: Any) -> str:
    return sent([tmpl["args"], tmpl["kwargs"], tmpl["options"]])


def stored_text(repeat: Repeat, queue: str, name: str) -> str:
    fields = {
        k.decode(): v.decode()
        for k, v in repeat.client.hgetall(repeat.keys(queue).record(name)).items()
    }
    text = join_template(fields)
    assert text is not None
    return text


def fire(repeat: Repeat, queue: str, now_ms: int) -> dict[str, Any]:
    """Fire what is due in `queue` at `now_ms`; return the templates sent, by name."""
    recorder = RecordingDispatcher()
    tick = Pump(repeat, [queue], recorder).run_once(now_ms=now_ms)
    assert not tick.failed
    return {o.name: o.template for o in recorder.occurrences}


def score(repeat: Repeat, queue: str, name: str) -> float | None:
    return repeat.client.zscore(repeat.keys(queue).registry, name)


def test_the_api_stores_and_sends_the_dicts_in_the_order_given(repeat: Repeat) -> None:
    given = template()
    assert repeat.upsert("q", "report", every="1h", template=given, now_ms=T0) == "created"
    text = stored_text(repeat, "q", "report")
    assert parts(json.loads(text)) == parts(given)
    registration = repeat.get("q", "report")
    assert registration is not None
    assert parts(registration.definition.template) == parts(given)
    [(name, tmpl)] = fire(repeat, "q", T0 + HOUR).items()
    assert name == "report"
    assert parts(tmpl) == parts(given)
    assert list(tmpl["args"][0]) == ["name", "email", "age"]
    assert list(tmpl["kwargs"]["options"]) == ["zeta", "alpha", "mid"]


TOML = """\
source = "s28"

[[schedule]]
queue = "q"
name = "report"
task = "app.report"
every = "1h"
args = [{ name = "Name", email = "E-mail", age = "Age" }, [{ z = 1, a = 2 }]]
kwargs = { options = { zeta = 1, alpha = 2, mid = { y = [{ q = 0, b = 1 }] } }, b = 1, a = 2 }
options = { priority = 5, expires = 60, headers = { zeta = "z", alpha = "a" } }
"""

FILE_ARGS = [{"name": "Name", "email": "E-mail", "age": "Age"}, [{"z": 1, "a": 2}]]
FILE_KWARGS = {"options": {"zeta": 1, "alpha": 2, "mid": {"y": [{"q": 0, "b": 1}]}}, "b": 1, "a": 2}
FILE_OPTIONS = {"priority": 5, "expires": 60, "headers": {"zeta": "z", "alpha": "a"}}


def json_file() -> str:
    entry = {
        "queue": "q",
        "name": "report",
        "task": "app.report",
        "every": "1h",
        "args": FILE_ARGS,
        "kwargs": FILE_KWARGS,
        "options": FILE_OPTIONS,
    }
    return json.dumps({"source": "s28", "schedule": [entry]}, indent=2)


@pytest.mark.parametrize("kind", ["toml", "json"])
def test_a_schedule_file_keeps_the_order_it_declares_and_its_export_reads_back_the_same(
    client: redis.Redis, prefix: str, tmp_path: Path, kind: str
) -> None:
    repeat = Repeat(client, prefix, clock=lambda: T0)
    path = tmp_path / f"schedules.{kind}"
    path.write_text(TOML if kind == "toml" else json_file(), encoding="utf-8")
    plan = sync_file(repeat, path)
    assert [d.name for d in plan.create] == ["report"]
    expected = sent([FILE_ARGS, FILE_KWARGS, FILE_OPTIONS])
    assert parts(json.loads(stored_text(repeat, "q", "report"))) == expected
    assert parts(fire(repeat, "q", T0 + HOUR)["report"]) == expected
    assert sync_file(repeat, path).changes == 0  # the same file again: unchanged

    # Exported (as JSON, which keeps any order) and synced into an empty registry: the same
    # text and digest.
    export = export_registry(repeat, fmt="json")
    assert export.refused == []
    again = tmp_path / "exported.json"
    again.write_text(render(export, "json"), encoding="utf-8")
    empty = Repeat(client, f"{prefix}x", clock=lambda: T0)
    sync_file(empty, again)
    assert stored_text(empty, "q", "report") == stored_text(repeat, "q", "report")
    assert empty.digests("q") == repeat.digests("q")


def test_a_reorder_of_a_sent_dict_is_an_update_that_keeps_the_next_run(repeat: Repeat) -> None:
    first = template()
    assert repeat.upsert("q", "r", every="1h", template=first, now_ms=T0) == "created"
    before = repeat.get("q", "r")
    assert before is not None
    next_run = score(repeat, "q", "r")
    reordered = template()
    mid = {"b": None, "y": [{"b": 1, "q": 0}]}
    reordered["kwargs"]["options"] = {"alpha": 2, "mid": mid, "zeta": 1}
    assert reordered == first  # equal as dicts: only the order tells them apart
    later = T0 + 20 * 60_000
    assert repeat.upsert("q", "r", every="1h", template=reordered, now_ms=later) == "updated"
    after = repeat.get("q", "r")
    assert after is not None
    assert after.definition.digest != before.definition.digest
    assert after.definition.cadence_digest == before.definition.cadence_digest
    assert score(repeat, "q", "r") == next_run  # the cadence kept its slot
    assert parts(json.loads(stored_text(repeat, "q", "r"))) == parts(reordered)
    assert parts(fire(repeat, "q", T0 + HOUR)["r"]) == parts(reordered)
    # Declared again as it is now: nothing to write.
    assert repeat.upsert("q", "r", every="1h", template=reordered, now_ms=later) == "unchanged"


def test_the_order_of_the_templates_own_keys_is_no_change(repeat: Repeat) -> None:
    given = template()
    envelope_reversed = {key: given[key] for key in reversed(list(given))}
    one = define(every="1h", template=given)
    other = define(every="1h", template=envelope_reversed)
    assert one.template_json == other.template_json
    assert one.digest == other.digest
    assert list(json.loads(one.template_json)) == ["args", "kwargs", "options", "task"]
    assert repeat.upsert("q", "e", definition=one, now_ms=T0) == "created"
    assert repeat.upsert("q", "e", definition=other, now_ms=T0) == "unchanged"


DIGEST_SCRIPT = """
import json
from emq_bridge import define
template = {
    "task": "app.report",
    "args": [{"name": "Name", "email": "E-mail", "age": "Age"}],
    "kwargs": {"options": {"zeta": 1, "alpha": 2}, "b": 1, "a": 2},
    "options": {"priority": 5, "expires": 60},
}
definition = define(cron="H 9 * * *", tz="Europe/Paris", template=template).for_name("n")
print(json.dumps([definition.digest, definition.template_json]))
"""


def test_one_declaration_gives_one_digest_in_every_process() -> None:
    found = set()
    for seed in ("0", "1", "4242", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", DIGEST_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        found.add(out.stdout.strip())
    assert len(found) == 1
    digest, text = json.loads(found.pop())
    assert json.loads(text)["kwargs"] == {"options": {"zeta": 1, "alpha": 2}, "b": 1, "a": 2}
    assert list(json.loads(text)["kwargs"]) == ["options", "b", "a"]
    exec_globals: dict[str, Any] = {}
    exec(DIGEST_SCRIPT.replace("print(", "result = ("), exec_globals)  # this process too
    assert json.loads(exec_globals["result"]) == [digest, text]


def test_a_record_an_earlier_release_stored_sorted_works_until_a_sync_rewrites_it(
    repeat: Repeat,
) -> None:
    given = template()
    old = define(every="1h", template=deep_sorted(given))
    # What an earlier release stored for `given`: its keys sorted at every depth.
    assert old.template_json == json.dumps(
        given, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert repeat.upsert("q", "old", definition=old, now_ms=T0) == "created"
    next_run = score(repeat, "q", "old")
    # It fires as it is stored.
    assert parts(fire(repeat, "q", T0 + HOUR)["old"]) == parts(deep_sorted(given))
    fired_next = score(repeat, "q", "old")
    assert fired_next == (next_run or 0) + HOUR
    # The first sync after the upgrade rewrites it in the order given, on its slot.
    later = T0 + HOUR + 60_000
    assert repeat.upsert("q", "old", every="1h", template=given, now_ms=later) == "updated"
    assert score(repeat, "q", "old") == fired_next
    assert parts(json.loads(stored_text(repeat, "q", "old"))) == parts(given)
    assert parts(fire(repeat, "q", T0 + 2 * HOUR)["old"]) == parts(given)
