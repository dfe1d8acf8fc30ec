"""The task template: one builder, one reader, and rules that no nesting can get around."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emq_bridge import MAX_TEMPLATE_DEPTH, Pump, Repeat, ScheduleError, TaskTemplate, define
from emq_bridge.config import declaration_from_entry
from emq_bridge.template import (
    FrozenDict,
    FrozenList,
    decode_frozen,
    decode_template,
    encode_template,
    freeze,
)
from emq_bridge.testing import RecordingDispatcher

T0 = 1_900_000_000_000


def nested(depth: int) -> dict[str, object]:
    """A template whose containers nest `depth` deep, the template itself counting as 1."""
    value: object = []
    for _ in range(depth - 2):
        value = [value]
    return {"args": value}


def test_the_builder_writes_what_the_reader_reads() -> None:
    built = TaskTemplate("reports.digest", [1, "a"], {"full": True}, {"priority": 5})
    stored = built.to_dict()
    assert stored == {
        "task": "reports.digest",
        "args": [1, "a"],
        "kwargs": {"full": True},
        "options": {"priority": 5},
    }
    assert TaskTemplate.read(stored) == built
    assert TaskTemplate.read({"task": "t"}) == TaskTemplate("t")  # the parts default to empty


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ({}, "'task' must be a non-empty string"),
        ({"task": ""}, "'task' must be a non-empty string"),
        ({"task": 7}, "'task' must be a non-empty string"),
        ({"task": "t", "args": "abc"}, "args must be a list"),
        ({"task": "t", "kwargs": [1]}, "kwargs must be a dict"),
        ({"task": "t", "options": "x"}, "options must be a dict"),
    ],
)
def test_the_reader_refuses_what_no_adapter_could_send(
    template: dict[str, object], says: str
) -> None:
    with pytest.raises(ScheduleError, match=says):
        TaskTemplate.read(template)


def test_the_schedule_file_and_the_cli_build_the_same_template_as_the_builder() -> None:
    entry = {"queue": "q", "name": "n", "task": "t", "every": "1m", "args": [1]}
    declaration = declaration_from_entry(entry)
    assert dict(declaration.definition.template) == TaskTemplate("t", [1]).to_dict()


def test_a_template_as_deep_as_the_limit_is_accepted_and_one_level_more_is_refused() -> None:
    define(every="1m", template=nested(MAX_TEMPLATE_DEPTH))
    with pytest.raises(ScheduleError, match=f"nested more than {MAX_TEMPLATE_DEPTH} levels"):
        define(every="1m", template=nested(MAX_TEMPLATE_DEPTH + 1))


@pytest.mark.parametrize("depth", [500, 990, 1500, 10_000, 100_000])
def test_every_depth_beyond_the_limit_is_a_schedule_error_never_a_recursion_error(
    depth: int,
) -> None:
    with pytest.raises(ScheduleError, match="nested more than"):
        encode_template(nested(depth))


def test_freezing_is_iterative_and_keeps_every_value() -> None:
    value: object = {"leaf": 1}
    for _ in range(50_000):  # far past the interpreter's recursion limit
        value = [value, "x"]
    frozen = freeze({"a": value, "b": [1, {"c": None}]})
    assert isinstance(frozen, FrozenDict) and isinstance(frozen["a"], FrozenList)
    assert frozen["b"] == [1, {"c": None}]
    probe = frozen["a"]
    for _ in range(50_000):
        assert isinstance(probe, FrozenList) and probe[1] == "x"
        probe = probe[0]
    assert probe == {"leaf": 1} and isinstance(probe, FrozenDict)


@pytest.mark.parametrize("depth", [600, 2_000])
def test_a_record_edited_into_a_deep_template_is_parked_and_its_neighbour_still_fires(
    any_repeat: Repeat, depth: int, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("poison", "healthy"):
        any_repeat.register("q", name, every="1m", template={"task": "t"}, now_ms=T0)
    deep = '{"task":"t","args":' + "[" * depth + "]" * depth + "}"
    any_repeat.client.hset(any_repeat.keys("q").record("poison"), "template", deep)
    recorder = RecordingDispatcher()
    with caplog.at_level(logging.ERROR, logger="emq_bridge.pump"):
        tick = Pump(any_repeat, ["q"], recorder).run_once(now_ms=T0 + 60_000)
    assert recorder.names() == ["healthy"]
    assert tick.parked == ["poison"]
    assert "q/poison: parked for 60s: corrupt record" in caplog.text


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _frozen_all_the_way(value: object) -> bool:
    if isinstance(value, dict):
        return type(value) is FrozenDict and all(map(_frozen_all_the_way, value.values()))
    if isinstance(value, list):
        return type(value) is FrozenList and all(map(_frozen_all_the_way, value))
    return True


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), _JSON, max_size=5))
def test_a_template_decodes_to_the_same_read_only_value_by_either_path(
    template: dict[str, object],
) -> None:
    """`decode_frozen` takes a shortcut for templates with few brackets (the decoder builds
    the read-only objects); it gives what decoding and freezing give, deep or shallow."""
    raw = json.dumps(template)
    decoded = decode_frozen(raw)
    assert decoded == freeze(decode_template(raw)) == template
    assert _frozen_all_the_way(decoded)


_DEEP = "[" * (MAX_TEMPLATE_DEPTH + 1)  # inside a string: more brackets than the shortcut takes


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[1, 2]", "a JSON list, not an object"),
        (f'["{_DEEP}"]', "a JSON list, not an object"),
        ("7", "a JSON int, not an object"),
        (f'"{_DEEP}"', "a JSON str, not an object"),
        ('{"a": NaN}', "not JSON"),
        (f'{{"b": "{_DEEP}", "a": NaN}}', "not JSON"),
        ('{"a": ', "not JSON"),
        (f'{{"b": "{_DEEP}", "a": ', "not JSON"),
        ('\ufeff{"a": 1}', "not JSON"),
    ],
)
def test_a_record_template_that_is_no_json_object_is_refused_by_either_path(
    raw: str, message: str
) -> None:
    """Shallow texts take `decode_frozen`'s shortcut, those with `_DEEP` (or a BOM) the
    checked decode: both refuse with the same message."""
    with pytest.raises(ScheduleError, match=message):
        decode_frozen(raw)
