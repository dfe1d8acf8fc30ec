"""A record's template stored in pieces of at most 64 bytes, so its hash stays a listpack.

Redis and Valkey keep a small hash as one compact listpack only while every value is at
most `hash-max-listpack-value` bytes (64 by default); one longer value turns the whole record
into a hashtable, about twice the memory. Templates are usually longer than 64 bytes (a task
name, args, kwargs, options), so a template of up to `MAX_PIECES` pieces is stored as
`template` (its first piece), `template.2` ... `template.<n>` and `template_pieces` = n; a
shorter or a much longer one stays whole in `template`, as before. The pieces are cut at
UTF-8 character boundaries, so each is valid text on its own.

`fetch.lua` (what the pump reads) and `park.lua` join the pieces in the script; Python joins
them in `Definition.from_fields`. Whatever reads a record sees the whole template.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["PIECES_FIELD", "PIECE_BYTES", "PIECE_FIELDS", "join_template", "split_template"]

# Redis's and Valkey's default `hash-max-listpack-value`.
PIECE_BYTES = 64
# Longer templates stay whole: their record is a hashtable either way, whose few large
# values cost less than many small ones.
MAX_PIECES = 32
PIECES_FIELD = "template_pieces"
# Every field a pieced template may write but its first (which is `template`): the fields
# a new definition deletes when it leaves them out.
PIECE_FIELDS = (PIECES_FIELD, *(f"template.{n}" for n in range(2, MAX_PIECES + 1)))
# The field of piece n, and the text of a count n (index n), made once.
_PIECE_NAMES = ("", "template", *PIECE_FIELDS[1:])
_COUNTS = tuple(str(n) for n in range(MAX_PIECES + 1))


def split_template(text: str) -> dict[str, str]:
    """Return the record fields that store `text`: `template`, and its pieces if it has any."""
    size = len(text)
    if text.isascii():  # most templates: a character is a byte, any cut is at a character
        if size <= PIECE_BYTES or size > PIECE_BYTES * MAX_PIECES:
            return {"template": text}
        if size <= 2 * PIECE_BYTES:  # most of those: two pieces
            return {
                "template": text[:PIECE_BYTES],
                PIECES_FIELD: "2",
                "template.2": text[PIECE_BYTES:],
            }
        fields = {"template": text[:PIECE_BYTES], PIECES_FIELD: _COUNTS[-(-size // PIECE_BYTES)]}
        for number, start in enumerate(range(PIECE_BYTES, size, PIECE_BYTES), start=2):
            fields[_PIECE_NAMES[number]] = text[start : start + PIECE_BYTES]
        return fields
    data = text.encode()
    if len(data) <= PIECE_BYTES or len(data) > PIECE_BYTES * MAX_PIECES:
        return {"template": text}
    pieces: list[str] = []
    start = 0
    while start < len(data):
        end = min(start + PIECE_BYTES, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # inside a character: back off
            end -= 1
        pieces.append(data[start:end].decode())
        start = end
    if len(pieces) > MAX_PIECES:  # cuts backed off at characters may need one more
        return {"template": text}
    fields = {"template": pieces[0], PIECES_FIELD: str(len(pieces))}
    for number, piece in enumerate(pieces[1:], start=2):
        fields[f"template.{number}"] = piece
    return fields


def join_template(fields: Mapping[str, str]) -> str | None:
    """Return the whole template of a record's `fields` (None when it has none).

    A record whose pieces are missing or whose count is not a number gives what it has
    joined in order, so the template decoder reports it as corrupt rather than this."""
    first = fields.get("template")
    count = fields.get(PIECES_FIELD)
    if first is None or not count:
        return first
    try:
        total = int(count)
    except ValueError:
        return first + "\0"  # not JSON: the decoder calls the record corrupt
    if total > MAX_PIECES:  # edited by hand: corrupt too, not a billion lookups
        return first + "\0"
    return first + "".join(fields.get(f"template.{n}", "\0") for n in range(2, total + 1))
