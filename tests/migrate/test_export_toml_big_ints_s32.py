"""A TOML export cannot hold an integer outside the signed 64-bit range (session 32).

The TOML spec says a parser must refuse such an integer (an "arbitrary 64-bit signed
integer" is what TOML holds); Python's tomllib reads it, so the export wrote
`args = [18446744073709551617]` and read it back as its own check, leaving a file other
parsers refuse. Such a schedule is now listed with `!` and left out, as one holding a null
is, pointing to `--format json`, which carries it; the range's own ends are written.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from cli_run import Run

from emq_bridge import Repeat
from emq_bridge.template import TaskTemplate

EDGES = [2**63 - 1, -(2**63)]  # the ends of the range: TOML holds them


def test_an_integer_beyond_64_bits_is_left_out_of_a_toml_export_and_kept_in_json(
    run: Run, repeat: Repeat, prefix: str, tmp_path: Path
) -> None:
    edges = TaskTemplate("app.t", EDGES, {"n": {"m": EDGES}}).to_dict()
    above = TaskTemplate("app.t", [2**64 + 1], {}).to_dict()
    below = TaskTemplate("app.t", [], {"n": {"m": [-(2**63) - 1]}}).to_dict()
    repeat.upsert("q", "edges", every="1m", template=edges, source="ops")
    repeat.upsert("q", "above", every="1m", template=above, source="ops")
    repeat.upsert("q", "below", every="1m", template=below, source="ops")

    path = tmp_path / "s.toml"
    toml = run("export", "-o", str(path))
    assert toml.exit_code == 0, toml.output
    assert "exported 1 schedule(s), 2 left out" in toml.stderr
    for name in ("above", "below"):
        assert (
            f"! q/{name}: it holds an integer outside the signed 64-bit range, which TOML "
            "cannot write (a TOML parser must refuse it): export it with --format json"
        ) in toml.stderr
    text = path.read_text()
    assert str(2**64 + 1) not in text and str(2**63 + 1) not in text
    (entry,) = tomllib.loads(text)["schedule"]
    assert entry["name"] == "edges" and entry["args"] == EDGES
    synced = run("--prefix", f"{prefix}t", "sync", str(path))
    assert synced.exit_code == 0, synced.output
    back = Repeat(repeat.client, f"{prefix}t").get("q", "edges").definition.template
    assert back["kwargs"]["n"]["m"] == EDGES

    as_json = run("export", "--format", "json", "-o", str(tmp_path / "s.json"))
    assert as_json.exit_code == 0, as_json.output
    assert "3 schedule(s), 0 left out" in as_json.stderr
    synced = run("--prefix", f"{prefix}j", "sync", str(tmp_path / "s.json"))
    assert synced.exit_code == 0, synced.output
    kept = Repeat(repeat.client, f"{prefix}j")
    assert kept.get("q", "above").definition.template["args"] == [2**64 + 1]
    assert json.dumps(kept.get("q", "below").definition.template["kwargs"]) == json.dumps(
        {"n": {"m": [-(2**63) - 1]}}
    )
