"""Sync stamps: what lets an unchanged boot skip converting and reading its schedules.

A sync given a fingerprint of its declarations (a digest of everything they were built
from: `sync.Stamp`) stamps each queue it read with it once it has applied them, through
`stamp.lua`. Each queue's `synced` hash counts, per source that stamps there, the writes of
that source's records (`upsert.lua`, `register.lua`, `cancel.lua` add one per record of it
they write or remove); a stamp holds only while that counter is the one the sync left, i.e.
while nobody but that sync wrote the source's records. A later boot whose fingerprint is the
same, and that finds every stamp holding, knows the registry is what a full sync would leave
it, and reads three things instead of every record.

The counters see writes, not losses: a registry sorted set evicted, or deleted by hand, with
its `synced` hash kept, loses the members of the source's records without a write. So the
stamp also records how many of the source's schedules the sync left in each queue (every
registration keeps one member, a paused or completed one at +inf), and holds only while
each such queue's registry has at least that many members (one `ZCARD` per queue, in the
pipeline of the stamp reads). Other sources' and runtime schedules only add members, so a
queue they share never fails it; a loss they outnumber is not seen (a full sync finds it).

Part of `Repeat` (a base class of it, as `HeartbeatMoves` is).
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from .errors import EmqError
from .keys import QueueKeys, synced_key
from .replies import redis_errors, text
from .scripts import Scripts

__all__ = ["StampMoves", "code_versions"]


def code_versions(*packages: str) -> tuple[str, ...]:
    """Return the installed version of each of `packages` ('' for one not installed): what
    a fingerprint mixes in, so that an upgrade syncs in full once."""
    found = []
    for package in packages:
        try:
            found.append(metadata.version(package))
        except metadata.PackageNotFoundError:
            found.append("")
    return tuple(found)


def _counter(source: str) -> str:
    return "{w}" + source  # source names hold no braces: never a stamp's field


def _count(raw: Any) -> int:
    """A counter as read; -1 for one edited by hand into something else, which no stamp
    then matches (the next write of the source restarts it: upsert.lua)."""
    value = text(raw) if raw is not None else ""
    return int(value) if value.isdigit() else -1


class StampMoves:
    """The sync-stamp moves of `Repeat` (see the module docstring)."""

    client: Any
    prefix: str
    scripts: Scripts

    def keys(self, queue: str) -> QueueKeys:  # pragma: no cover - Repeat's
        raise NotImplementedError

    def queues(self) -> builtins.list[str]:  # pragma: no cover - Repeat's
        raise NotImplementedError

    def _script_calls(
        self,
        script: Any,
        calls: Sequence[tuple[builtins.list[str], builtins.list[Any]]],
        what: str,
        names: Sequence[str],
    ) -> builtins.list[Any]:  # pragma: no cover - Repeat's
        raise NotImplementedError

    def begin_stamp(self, source: str, queues: Sequence[str]) -> dict[str, int]:
        """Start counting the writes of `source`'s records in each of `queues` (if not
        counted yet) and return each count: what a sync reads before its plan. One round
        trip (one per master on a cluster)."""
        if not queues:
            return {}
        field = _counter(source)
        with redis_errors(f"stamp {source}"):
            pipe = self.client.pipeline(transaction=False)
            for queue in queues:
                pipe.hsetnx(self.keys(queue).synced, field, 0)
                pipe.hget(self.keys(queue).synced, field)
            replies = pipe.execute()
        return {q: _count(replies[2 * i + 1]) for i, q in enumerate(queues)}

    def write_stamps(
        self,
        source: str,
        fingerprint: str,
        expected: Mapping[str, int],
        summary: Mapping[str, Any],
        declared: Mapping[str, int] | None = None,
    ) -> bool:
        """Stamp each queue of `expected` with `fingerprint` if its count of `source`'s writes
        is the one given (`stamp.lua`), then record the stamp, `summary` (JSON) and
        `declared` (how many of the source's schedules the sync left per queue; `stamp_of`
        checks the registry still has as many members) under the source. True if every
        queue took it; a queue that refused drops its stamp, so the next boot syncs in
        full."""
        queues = sorted(expected)
        calls = [([self.keys(q).synced], [source, fingerprint, expected[q]]) for q in queues]
        replies = self._script_calls(self.scripts.stamp, calls, "stamp", queues)
        for reply in replies:
            if isinstance(reply, EmqError):
                raise reply
        held = all(int(reply) == 1 for reply in replies)
        counted = {q: n for q, n in sorted((declared or {}).items()) if n > 0}
        record = json.dumps(
            {
                "fingerprint": fingerprint,
                "queues": queues,
                "summary": dict(summary),
                "declared": counted,
            },
            separators=(",", ":"),
        )
        key = synced_key(self.prefix, source)
        with redis_errors(f"stamp {source}"):
            # Only the per-queue stamps decide (stamp_of checks them all against the
            # record's fingerprint): an unchanged record is not written again, so an
            # unchanged full sync writes nothing.
            if not held:
                self.client.delete(key)
            elif self.client.get(key) != record.encode():
                self.client.set(key, record)
        return held

    def stamp_of(self, source: str, fingerprint: str) -> dict[str, Any] | None:
        """Return the summary of `source`'s last stamped sync if its fingerprint is
        `fingerprint` and every stamp still holds, in the queues it read and in every queue
        there is now (a new one may hold what a full sync would prune), and every queue the
        source declared schedules in has at least as many registry members as the sync left
        of them (a registry evicted or deleted by hand: the module docstring); else None.
        Reads only: the record, the queues (SCAN), and one field pair per queue and one
        `ZCARD` per queue of the source's schedules, in one pipeline."""
        with redis_errors(f"stamp {source}"):
            raw = self.client.get(synced_key(self.prefix, source))
        if raw is None:
            return None
        try:
            record = json.loads(text(raw))
            stamped = set(record["queues"])
            summary = record["summary"]
            # A record of an earlier version has no counts: a full sync writes them.
            declared = record["declared"]
            if record["fingerprint"] != fingerprint or not isinstance(summary, dict):
                return None
            if not all(isinstance(queue, str) for queue in stamped):
                return None
            if not isinstance(declared, dict) or not all(
                queue in stamped and type(n) is int for queue, n in declared.items()
            ):
                return None
        except (ValueError, TypeError, KeyError, RecursionError):  # edited by hand: in full
            return None
        queues = sorted(stamped | set(self.queues()))
        counted = sorted(declared.items())
        field = _counter(source)
        with redis_errors(f"stamp {source}"):
            pipe = self.client.pipeline(transaction=False)
            for queue in queues:
                pipe.hmget(self.keys(queue).synced, [source, field])
            for queue, _ in counted:
                pipe.zcard(self.keys(queue).registry)
            # A registry key of another type (edited by hand) fails its ZCARD alone: no stamp
            # holds over it, and the full sync says what is wrong.
            replies = pipe.execute(raise_on_error=False)
            for reply in replies[: len(queues)]:
                if isinstance(reply, Exception):
                    raise reply
        for stamp, counter in replies[: len(queues)]:
            if stamp is None or counter is None or text(stamp) != f"{fingerprint} {text(counter)}":
                return None
        for (_, left), members in zip(counted, replies[len(queues) :], strict=True):
            if isinstance(members, Exception) or int(members) < left:  # lost, unwritten
                return None
        return summary
