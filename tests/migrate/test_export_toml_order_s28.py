"""A TOML export cannot keep an object's key order when a table comes before a plain key
(TOML writes an object's tables after its plain keys): such a schedule is listed and left
out, as one holding a null is, and a JSON export carries it in order. Without the refusal,
the templates now keep the user's key order (the task receives it), and the TOML round trip
silently reordered them."""

from __future__ import annotations

import json
from pathlib import Path

from cli_run import Run

from emq_bridge import Repeat
from emq_bridge.template import TaskTemplate


def test_a_template_toml_would_reorder_is_left_out_of_a_toml_export(
    run: Run, repeat: Repeat, prefix: str, tmp_path: Path
) -> None:
    kept = TaskTemplate("app.t", [], {"n": 1, "flag": True, "nested": {"b": 1, "a": 2}}).to_dict()
    reordered = TaskTemplate("app.t", [], {"n": 1, "nested": {"b": 1}, "flag": True}).to_dict()
    repeat.upsert("q", "kept", every="1m", template=kept, source="ops")
    repeat.upsert("q", "reordered", every="1m", template=reordered, source="ops")

    toml = run("export", "-o", str(tmp_path / "s.toml"))
    assert toml.exit_code == 0, toml.output
    assert "exported 1 schedule(s), 1 left out" in toml.stderr
    assert "! q/reordered: TOML would give its args, kwargs or options back" in toml.stderr
    synced = run("--prefix", f"{prefix}t", "sync", str(tmp_path / "s.toml"))
    assert synced.exit_code == 0, synced.output
    back = Repeat(repeat.client, f"{prefix}t").get("q", "kept").definition.template
    assert json.dumps(back["kwargs"]) == json.dumps(kept["kwargs"])  # in order

    as_json = run("export", "--format", "json", "-o", str(tmp_path / "s.json"))
    assert as_json.exit_code == 0 and "2 schedule(s), 0 left out" in as_json.stderr
    synced = run("--prefix", f"{prefix}j", "sync", str(tmp_path / "s.json"))
    assert synced.exit_code == 0, synced.output
    back = Repeat(repeat.client, f"{prefix}j").get("q", "reordered").definition.template
    assert list(back["kwargs"]) == ["n", "nested", "flag"]
