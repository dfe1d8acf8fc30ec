"""A template stored in pieces of at most 64 bytes: the record stays a compact listpack, and
everything that reads it sees the whole template."""

from __future__ import annotations

import redis
from hypothesis import given
from hypothesis import strategies as st

from emq_bridge import Pump, Repeat
from emq_bridge.template_pieces import (
    MAX_PIECES,
    PIECE_BYTES,
    PIECES_FIELD,
    join_template,
    split_template,
)
from emq_bridge.testing import RecordingDispatcher

T0 = 1_900_000_000_000
HOUR_MS = 3_600_000


def long_template(i: int, width: int = 1) -> dict[str, object]:
    """A template of about 100 bytes per `width`, with args of its own."""
    return {
        "task": "reports.nightly",
        "args": [i, "é" * 20 * width],
        "kwargs": {"report": "daily" * width, "limit": 100},
        "options": {"queue": "reports"},
    }


def compact_encoding(client: redis.Redis) -> bytes:
    """The compact encoding of a small hash: a listpack since Redis 7.0 (and on Valkey, which
    says 7.2), a ziplist on 6.2."""
    major = int(str(client.info("server")["redis_version"]).split(".")[0])
    return b"listpack" if major >= 7 else b"ziplist"


@given(st.text(max_size=PIECE_BYTES * (MAX_PIECES + 2)))
def test_split_then_join_gives_the_text_back(text: str) -> None:
    fields = split_template(text)
    assert join_template(fields) == text
    if PIECES_FIELD in fields:
        pieces = [fields["template"]] + [
            fields[f"template.{n}"] for n in range(2, int(fields[PIECES_FIELD]) + 1)
        ]
        assert len(pieces) == int(fields[PIECES_FIELD]) <= MAX_PIECES
        assert all(0 < len(piece.encode()) <= PIECE_BYTES for piece in pieces)
        assert set(fields) == {
            "template",
            PIECES_FIELD,
            *(f"template.{n}" for n in range(2, len(pieces) + 1)),
        }
    else:
        assert fields == {"template": text}


def test_short_and_very_long_templates_stay_whole() -> None:
    assert split_template("x" * PIECE_BYTES) == {"template": "x" * PIECE_BYTES}
    huge = "y" * (PIECE_BYTES * MAX_PIECES + 1)
    assert split_template(huge) == {"template": huge}
    assert PIECES_FIELD in split_template("z" * (PIECE_BYTES + 1))


def test_a_record_with_a_long_template_is_a_listpack_and_fires_it_whole(
    repeat: Repeat, client: redis.Redis
) -> None:
    template = long_template(7)
    repeat.register("q", "nightly", every="1h", template=template, now_ms=T0)
    record = repeat.keys("q").record("nightly")
    assert client.object("encoding", record) == compact_encoding(client)
    assert client.hget(record, PIECES_FIELD) is not None
    assert repeat.get("q", "nightly").definition.template == template
    recording = RecordingDispatcher()
    Pump(repeat, ["q"], recording).run_once(now_ms=T0 + HOUR_MS)
    assert [dict(o.template) for o in recording.occurrences] == [template]


def test_an_update_to_a_shorter_template_leaves_no_old_piece(
    repeat: Repeat, client: redis.Redis
) -> None:
    from emq_bridge import Declaration, define, sync

    def declared(template: dict[str, object]) -> list[Declaration]:
        return [Declaration("q", "nightly", define(every="1h", template=template))]

    sync(repeat, declared(long_template(1, width=4)), "app")
    record = repeat.keys("q").record("nightly")
    many = int(client.hget(record, PIECES_FIELD) or 0)
    assert many > 4
    sync(repeat, declared(long_template(1)), "app")
    fields = {k.decode(): v.decode() for k, v in client.hgetall(record).items()}
    assert int(fields[PIECES_FIELD]) < many
    assert not [
        f for f in fields if f.startswith("template.") and int(f[9:]) > int(fields[PIECES_FIELD])
    ]
    assert repeat.get("q", "nightly").definition.template == long_template(1)
    sync(repeat, declared({"task": "short"}), "app")
    fields = {k.decode(): v.decode() for k, v in client.hgetall(record).items()}
    assert fields["template"] == '{"task":"short"}'
    assert not [f for f in fields if f.startswith("template.") or f == PIECES_FIELD]
    assert repeat.get("q", "nightly").definition.template == {"task": "short"}


def test_a_pieced_template_reads_and_fires_whole_on_both_servers(any_repeat: Repeat) -> None:
    # fakeredis (the helpers users test with) runs the same Lua joins as the server.
    template = long_template(3, width=3)
    any_repeat.register("q", "nightly", every="1h", template=template, now_ms=T0)
    assert any_repeat.client.hget(any_repeat.keys("q").record("nightly"), PIECES_FIELD)
    assert any_repeat.get("q", "nightly").definition.template == template
    recording = RecordingDispatcher()
    Pump(any_repeat, ["q"], recording).run_once(now_ms=T0 + HOUR_MS)
    assert [dict(o.template) for o in recording.occurrences] == [template]


def test_a_piece_count_edited_by_hand_is_a_corrupt_record_not_a_loop(any_repeat: Repeat) -> None:
    """`template_pieces` past MAX_PIECES (even 'inf', which Lua's `tonumber` reads): every
    reader calls the record corrupt at once (the pump parks it, sends nothing) instead of
    reading pieces until the script times out; a sync writes it right again."""
    from emq_bridge import Declaration, define, sync

    template = long_template(5)
    for count in ("inf", "1000000000", str(MAX_PIECES + 1)):
        any_repeat.cancel("q", "nightly")
        sync(any_repeat, [Declaration("q", "nightly", define(every="1h", template=template))], "a")
        record = any_repeat.keys("q").record("nightly")
        any_repeat.client.hset(record, PIECES_FIELD, count)
        assert join_template({"template": "{", PIECES_FIELD: count}) == "{\0"
        recording = RecordingDispatcher()
        Pump(any_repeat, ["q"], recording).run_once(now_ms=T0 + 10 * HOUR_MS)
        assert recording.occurrences == []
        assert any_repeat.get("q", "nightly") is None  # a corrupt record: skipped, one line
        parked = any_repeat.client.zscore(any_repeat.keys("q").registry, "nightly")
        assert parked is not None and parked > T0 + 10 * HOUR_MS  # parked for a while
        sync(any_repeat, [Declaration("q", "nightly", define(every="2h", template=template))], "a")
        assert any_repeat.get("q", "nightly").definition.template == template
        pieces = int(any_repeat.client.hget(record, PIECES_FIELD) or 0)
        fields = {k.decode() for k in any_repeat.client.hkeys(record)}
        assert not [f for f in fields if f.startswith("template.") and int(f[9:]) > pieces]
