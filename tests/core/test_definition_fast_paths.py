"""The shortcuts a boot's conversion and sync take give what the plain computations give:
the definition digest from a cached frame, the template's C encoding and its shallow
structure check, and an ASCII template cut into pieces by characters."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emq_bridge.definition import _digest, define
from emq_bridge.errors import ScheduleError
from emq_bridge.template import _COMPACT, encode_template
from emq_bridge.template_pieces import MAX_PIECES, PIECE_BYTES, PIECES_FIELD, split_template

CADENCES: list[dict[str, Any]] = [
    {"every": 60},
    {"every": "15m", "offset": "5m"},
    {"every": 60, "anchor": "release"},
    {"cron": "0 9 * * 1", "tz": "Europe/Paris"},
    {"cron": "H * * * *", "day_and": True},
    {"at": "2031-01-01T00:00:00+00:00"},
    {"every": 60, "jitter": 5},
]
POLICIES: list[dict[str, Any]] = [
    {},
    {"misfire": "all", "catchup_max": 7, "catchup_window": 30},
    {"overlap": "skip", "pause_after_failures": 3},
    {"limit": 5, "end_at": "2040-01-01T00:00:00+00:00"},
    {"labels": {"team": "ops"}},
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@pytest.mark.parametrize("cadence", CADENCES)
@pytest.mark.parametrize("policies", POLICIES)
def test_the_digest_is_the_canonical_json_of_the_fields(
    cadence: dict[str, Any], policies: dict[str, Any]
) -> None:
    for i in range(3):  # the first builds the frame, the others read it
        template = {"task": "t", "args": [i, 'é"\\\x00'], "kwargs": {"k": "\u2028" * i}}
        definition = define(template=template, **cadence, **policies).for_name(f"n{i}")
        assert definition.digest == _digest(definition.to_fields())


@given(st.dictionaries(st.text(), json_values, max_size=5))
def test_a_template_encodes_as_the_compact_encoder_writes_it(template: dict[str, Any]) -> None:
    # Its own keys in the order of their names, the objects inside in their given order
    # (session 28: earlier releases sorted the keys at every depth, a deliberate change).
    try:
        expected = _COMPACT.encode({key: template[key] for key in sorted(template)})
        expected.encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        with pytest.raises(ScheduleError):
            encode_template(template)
        return
    if len(expected.encode("utf-8")) <= 64 * 1024:
        assert encode_template(template) == expected


def nested(depth: int) -> list[Any]:
    value: list[Any] = ["deep"]
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "template",
    [
        {"args": [{1: 2}]},  # a non-string key below a list
        {"kwargs": {"a": {1: 2}}},  # ... below a dict
        {1: "x"},
        {"kwargs": {"a": nested(40)}},  # deeper than the rules allow
    ],
)
def test_a_template_past_the_shallow_check_is_still_refused(template: dict[Any, Any]) -> None:
    with pytest.raises(ScheduleError):
        encode_template(template)


def test_a_cycle_is_refused_as_before() -> None:
    looped: dict[str, Any] = {"task": "t"}
    looped["self"] = looped
    with pytest.raises(ScheduleError, match="Circular reference"):
        encode_template(looped)


def byte_pieces(text: str) -> list[str]:
    data = text.encode()
    return [data[i : i + PIECE_BYTES].decode() for i in range(0, len(data), PIECE_BYTES)]


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 127, 128, 129, 200, 2047, 2048, 2049, 5000])
def test_an_ascii_template_is_cut_as_its_bytes_are(size: int) -> None:
    text = "".join(chr(33 + i % 90) for i in range(size))
    fields = split_template(text)
    pieces = byte_pieces(text)
    if size <= PIECE_BYTES or len(pieces) > MAX_PIECES:
        assert fields == {"template": text}
        return
    assert fields[PIECES_FIELD] == str(len(pieces))
    assert [fields["template"], *(fields[f"template.{n}"] for n in range(2, len(pieces) + 1))] == (
        pieces
    )
    assert len(fields) == len(pieces) + 1


@pytest.mark.parametrize(
    ("cadence", "policies"),
    [
        (cadence, policies)
        for cadence in CADENCES
        for policies in [*POLICIES, {"immediately": True}]
        if not ("at" in cadence and "immediately" in policies)  # refused: add the instant
    ],
)
def test_upsert_items_of_one_shape_share_what_they_would_each_hold(
    repeat: Any, cadence: dict[str, Any], policies: dict[str, Any]
) -> None:
    # An upsert call computes the fields, the fields to delete and the first run once per
    # shape of definition; each record is what an upsert of that definition alone writes.
    # Then each is updated to another's template: one stored in pieces or not, as before.
    sizes = [1, 80, 1, 200, 80]
    now = 1_899_936_000_000
    for step, result in enumerate(["created", "updated"]):
        templates = [{"task": "t", "args": ["x" * size]} for size in sizes[step:] + sizes[:step]]
        definitions = [define(**cadence, **policies, template=t) for t in templates]
        batch = repeat.upsert_many(
            [("together", f"s{i}", d) for i, d in enumerate(definitions)], source="src", now_ms=now
        )
        for i, definition in enumerate(definitions):
            repeat.upsert("alone", f"s{i}", definition=definition, source="src", now_ms=now)
        assert batch == [result] * len(definitions)
    for i in range(len(sizes)):
        together = repeat.client.hgetall(repeat.keys("together").record(f"s{i}"))
        alone = repeat.client.hgetall(repeat.keys("alone").record(f"s{i}"))
        assert together == alone
        assert repeat.client.zscore(repeat.keys("together").registry, f"s{i}") == (
            repeat.client.zscore(repeat.keys("alone").registry, f"s{i}")
        )
