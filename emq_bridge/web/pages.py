"""What the web view shows, read through the registry's own reads (no Starlette here).

A table page reads only the records it shows when unfiltered (`Repeat.list` with an offset,
one `ZCARD` per queue before it); a filtered page reads the registry from its start position
a `READ_CHUNK` at a time and stops when the page is full or `SCAN_BUDGET` records were
read, so no request reads more than that many records, whatever the registry's size.
Positions are raw positions in the registry's order (queue by queue, next-run order within
one, paused last), so a filtered page's next page starts where it stopped reading.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..cli.render import computed_by, registration_json
from ..errors import ScheduleError
from ..labels import decode_labels, matches, parse_filter
from ..outcome import HistoryEntry
from ..registry import READ_CHUNK, Registration, Repeat

__all__ = [
    "MAX_PAGE_SIZE",
    "PAGE_SIZE",
    "SCAN_BUDGET",
    "STATES",
    "Filters",
    "Page",
    "QueueList",
    "Timeline",
    "TimelineCache",
    "read_page",
    "read_timeline",
    "schedule_json",
    "state_of_fields",
]

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# Records a filtered page reads at most per request: a few pipelines of `READ_CHUNK`.
SCAN_BUDGET = 5000
STATES = ("active", "paused", "parked", "completed")
# The record fields the filters read (see `state_of_fields`).
# `digest`, which every record has, tells a record that has none of the others (an active
# schedule with no owner and no labels) from one that is gone (`load_records` gives {}).
FILTER_FIELDS = ("paused", "parked_reason", "completed", "source", "labels", "digest")
# The timeline: a day in quarter hours, from the schedules due within it (at most
# `TIMELINE_SCHEDULES` of them, earliest first) and at most `TIMELINE_RUNS` runs of each.
TIMELINE_HOURS = 24
TIMELINE_BUCKETS = 96
TIMELINE_SCHEDULES = 2000
TIMELINE_RUNS = 500


def state_of_fields(fields: Mapping[str, str]) -> str:
    """Return `render.state` of a registration from its raw record fields, without decoding
    it (the registry's `_registration` reads them the same way; tests hold the two equal)."""
    if fields.get("parked_reason"):
        return "parked"
    if fields.get("completed"):
        return "completed"
    return "paused" if fields.get("paused") == "1" else "active"


class BadQuery(ValueError):
    """A query parameter of the page is invalid: the reason, for a 400 reply."""


def label_pairs(given: Iterable[object]) -> list[str]:
    """The `KEY=VALUE` items of `label` parameters, each a comma-separated list. A piece
    without `=` continues the value before it (a label value may hold commas: `k=a,b` is the
    one label `k` = `a,b`); a first piece without one is left to be refused."""
    pairs: list[list[str]] = []  # each label's pieces, joined at the end (not re-joined
    for raw in given:  # for each piece: a long value of many commas stays linear)
        first = True
        for piece in str(raw).split(","):
            if not piece.strip():  # `a=b,` or `a=b,,c=d`: nothing there
                pass
            elif "=" not in piece and not first and pairs:
                pairs[-1].append(piece)
            else:
                pairs.append([piece.strip()])
            first = False
    return [",".join(pieces) for pieces in pairs]


@dataclass(frozen=True, slots=True)
class Filters:
    """The table's filters: queue (exact), state, source (the owner, exact), name (substring),
    labels (`label=team=billing,tier=gold`, as kubectl's `-l`: every KEY=VALUE must match)."""

    queue: str | None = None
    state: str | None = None
    source: str | None = None
    text: str | None = None
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Filters:
        """Read the filters from a page's query; empty values mean no filter."""
        values = {key: (query.get(key) or "").strip() or None for key in ("queue", "state")}
        wanted = values["state"]
        if wanted is not None and wanted not in STATES:
            raise BadQuery(f"state must be one of {', '.join(STATES)}, not {wanted!r}")
        source = query.get("source") or None
        # `label=a=b,c=d`, or the parameter repeated (a form's multi-dict has `getlist`).
        getlist = getattr(query, "getlist", None)
        given = getlist("label") if callable(getlist) else [query.get("label") or ""]
        pairs = label_pairs(given)
        try:
            selector = parse_filter(pairs, "label")
        except ScheduleError as exc:
            raise BadQuery(f"{exc} (e.g. label=team=billing,tier=gold)") from None
        return cls(
            queue=values["queue"],
            state=wanted,
            source=source.strip() if source else None,
            text=(query.get("q") or "").strip() or None,
            labels=tuple(sorted(selector.items())),
        )

    @property
    def label(self) -> str | None:
        """The label filter as the query gives it (`team=billing,tier=gold`), or None."""
        return ",".join(f"{k}={v}" for k, v in self.labels) or None

    @property
    def narrows(self) -> bool:
        """Whether records must be read to tell which rows match (all but the queue filter)."""
        return bool(self.labels) or any(
            value is not None for value in (self.state, self.source, self.text)
        )

    @property
    def reads_records(self) -> bool:
        """Whether matching needs record fields (state, owner, labels), not only the name."""
        return self.state is not None or self.source is not None or bool(self.labels)

    def matches(self, name: str, fields: Mapping[str, str] | None) -> bool:
        """Whether the registration `name`, whose record has `fields` (`FILTER_FIELDS`; None
        when they were not read, {} when the record is gone), passes the filters."""
        if self.text is not None and self.text.lower() not in name.lower():
            return False
        if not self.reads_records:
            return True
        if not fields:
            return False
        if self.state is not None and state_of_fields(fields) != self.state:
            return False
        if self.labels and not _labelled(fields, self.labels):
            return False
        return self.source is None or (fields.get("source") or "") == self.source

    def query(self) -> dict[str, str]:
        """Return the filters as a page query (what links to other pages carry)."""
        pairs = {
            "queue": self.queue,
            "state": self.state,
            "source": self.source,
            "q": self.text,
            "label": self.label,
        }
        return {key: value for key, value in pairs.items() if value is not None}


def _labelled(fields: Mapping[str, str], selector: tuple[tuple[str, str], ...]) -> bool:
    """Whether a record's raw `labels` field holds every pair of `selector`."""
    try:
        labels = decode_labels(fields.get("labels"))
    except ScheduleError:  # a record edited by hand: it matches no label filter
        return False
    return matches(labels, dict(selector))


class QueueList:
    """The queues under the prefix (a SCAN of the keyspace), kept for `ttl_s` seconds.

    Listing queues walks every key of the server, which is most of a first page's time at
    100,000 schedules; a few seconds' staleness only delays a brand-new queue's appearance.
    """

    def __init__(
        self, repeat: Repeat, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.repeat, self.ttl_s, self.clock = repeat, ttl_s, clock
        self._queues: list[str] = []
        self._read_at: float | None = None
        # The last read that failed, with when it ended: the requests that waited for it
        # fail with it, rather than each trying again in turn (a Redis that hangs held the
        # N-th of them N times the client's timeout).
        self._failed: tuple[float, Exception] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> list[str]:
        arrived = self.clock()
        read_at = self._read_at
        if read_at is not None and arrived - read_at < self.ttl_s:
            return self._queues
        # One request reads (others wait for it rather than each walking the keyspace).
        with self._lock:
            failed = self._failed
            if failed is not None and failed[0] >= arrived:
                raise failed[1]
            now = self.clock()
            if self._read_at is None or now - self._read_at >= self.ttl_s:
                try:
                    self._queues = self.repeat.queues()
                except Exception as exc:
                    self._failed = (self.clock(), exc)
                    raise
                self._read_at, self._failed = now, None
            return self._queues

    def forget(self) -> None:
        """Read the queues again on next use (after a removal emptied one, say)."""
        self._read_at = None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of the table: its rows, and where the pages around it start."""

    registrations: list[Registration]
    start: int
    limit: int
    total: int  # registrations in the filtered queues, matching or not
    next_start: int | None
    previous_start: int | None
    examined: int  # records read to fill this page (== len(rows) when unfiltered)
    budget_spent: bool  # a filtered page stopped reading before it was full


def _counts(repeat: Repeat, queues: Sequence[str]) -> list[int]:
    return [repeat.count(queue) for queue in queues]


def _positions(
    queues: Sequence[str], counts: Sequence[int], start: int
) -> Iterator[tuple[str, int, int]]:
    """Yield (queue, offset in it, its size) from the raw position `start` on."""
    for queue, size in zip(queues, counts, strict=True):
        if start >= size:
            start -= size
            continue
        yield queue, start, size
        start = 0


def read_page(
    repeat: Repeat, queues: Sequence[str], filters: Filters, start: int, limit: int
) -> Page:
    """Return the page of `limit` rows from the raw position `start` of `queues`."""
    if start < 0:
        raise BadQuery("start must not be negative")
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise BadQuery(f"limit must be between 1 and {MAX_PAGE_SIZE}")
    if filters.queue is not None:
        queues = [q for q in queues if q == filters.queue] or [filters.queue]
    counts = _counts(repeat, queues)
    total = sum(counts)
    if not filters.narrows:
        rows: list[Registration] = []
        for queue, offset, _ in _positions(queues, counts, start):
            rows += repeat.list(queue, offset=offset, limit=limit - len(rows))
            if len(rows) >= limit:
                break
        end = start + limit
        return Page(
            registrations=rows,
            start=start,
            limit=limit,
            total=total,
            next_start=end if end < total else None,
            previous_start=max(0, start - limit) if start > 0 else None,
            examined=len(rows),
            budget_spent=False,
        )
    found: list[tuple[str, str]] = []
    examined, position = 0, start
    full = spent = False
    for queue, offset, size in _positions(queues, counts, start):
        at = offset
        while at < size and not (full or spent):
            chunk = min(READ_CHUNK, size - at, SCAN_BUDGET - examined)
            names = repeat.names(queue, offset=at, limit=chunk)
            # Only the fields the filters look at, undecoded: a page reads its budget fast.
            records = (
                repeat.load_records(queue, names, FILTER_FIELDS) if filters.reads_records else {}
            )
            for index, name in enumerate(names):
                if filters.matches(name, records.get(name)):
                    found.append((queue, name))
                    if len(found) == limit:
                        # Resume right after this row (a record removed meanwhile shifts by one).
                        position += index + 1
                        full = True
                        break
            else:
                position += chunk
            at += chunk
            examined += chunk
            spent = examined >= SCAN_BUDGET
            if not names:  # the queue shrank under us: go on with the next one
                break
        if full or spent:
            break
    rows = [r for r in (repeat.get(queue, name) for queue, name in found) if r is not None]
    return Page(
        registrations=rows,
        start=start,
        limit=limit,
        total=total,
        next_start=position if position < total else None,
        previous_start=None,  # a filtered page cannot know where the page before it began
        examined=examined,
        budget_spent=spent and not full,
    )


@dataclass(frozen=True, slots=True)
class Timeline:
    """Runs per bucket (a quarter hour) over the next hours, across schedules."""

    start_ms: int
    bucket_ms: int
    counts: list[int]
    schedules: int  # schedules read (those due within the window, earliest first)
    truncated: bool  # more schedules were due within the window than were read
    saturated: int  # schedules with more than `TIMELINE_RUNS` runs: the rest estimated

    @property
    def end_ms(self) -> int:
        return self.start_ms + len(self.counts) * self.bucket_ms

    @property
    def peak(self) -> int:
        return max(self.counts, default=0)

    def labels(self, every: int = TIMELINE_BUCKETS // 8) -> list[tuple[int, int]]:
        """Return (bucket index, epoch ms) of every `every`-th bucket edge, both ends too."""
        return [
            (i, self.start_ms + i * self.bucket_ms) for i in range(0, len(self.counts) + 1, every)
        ]

    def share(self, registration: Registration) -> list[int]:
        """Return the runs of `registration` in each bucket of this timeline."""
        counts, _ = _per_bucket(registration, self.start_ms, self.bucket_ms, self.end_ms)
        return [round(c) for c in counts]


def _runs_within(registration: Registration, end_ms: int) -> tuple[list[int], bool]:
    """Return the runs of `registration` before `end_ms` (at most `TIMELINE_RUNS`), and
    whether they were cut there. A paused one has none; a custom schedule only its check."""
    first = registration.next_run_ms
    if registration.paused or first is None or first >= end_ms:
        return [], False
    if computed_by(registration) is not None:
        return [first], False
    cadence = registration.definition.cadence
    runs = [first]
    while len(runs) < TIMELINE_RUNS:
        after = cadence.next_after(runs[-1])
        if after <= runs[-1] or after >= end_ms:
            return runs, False
        runs.append(after)
    return runs, True


def _per_bucket(
    registration: Registration, start_ms: int, bucket_ms: int, end_ms: int
) -> tuple[list[float], bool]:
    """Return the runs of `registration` per bucket, and whether some were estimated: past
    `TIMELINE_RUNS`, the rest of the window is filled at the rate of the runs counted."""
    buckets = (end_ms - start_ms) // bucket_ms
    counts = [0.0] * buckets
    runs, cut = _runs_within(registration, end_ms)
    for run in runs:
        counts[max(0, (run - start_ms) // bucket_ms)] += 1
    if cut:
        gap = (runs[-1] - runs[0]) / (len(runs) - 1)
        last = runs[-1]
        for index in range(max(0, (last - start_ms) // bucket_ms), buckets):
            low = max(last, start_ms + index * bucket_ms)
            counts[index] += max(0, start_ms + (index + 1) * bucket_ms - low) / gap
    return counts, cut


def read_timeline(repeat: Repeat, queues: Sequence[str], now_ms: int) -> Timeline:
    """Count the runs of the next `TIMELINE_HOURS` hours per quarter hour across `queues`.

    Only the schedules whose next run falls in the window have runs in it; they come first
    in each queue's order, so each queue's read stops at the first one beyond it, and the
    whole read at `TIMELINE_SCHEDULES` schedules.
    """
    bucket_ms = TIMELINE_HOURS * 3_600_000 // TIMELINE_BUCKETS
    start_ms = now_ms - now_ms % bucket_ms
    end_ms = start_ms + TIMELINE_BUCKETS * bucket_ms
    counts = [0.0] * TIMELINE_BUCKETS
    read = saturated = 0
    truncated = False
    for queue in queues:
        offset = 0
        while True:
            if read >= TIMELINE_SCHEDULES:
                truncated = truncated or offset < repeat.count(queue)
                break
            chunk = repeat.list(
                queue, offset=offset, limit=min(READ_CHUNK, TIMELINE_SCHEDULES - read)
            )
            offset += len(chunk)
            beyond = False
            for registration in chunk:
                if registration.paused or (registration.next_run_ms or end_ms) >= end_ms:
                    beyond = True  # next-run order: the rest of the queue is later (or paused)
                    break
                read += 1
                spread, cut = _per_bucket(registration, start_ms, bucket_ms, end_ms)
                saturated += cut
                counts = [a + b for a, b in zip(counts, spread, strict=True)]
            if beyond or not chunk:
                break
    rounded = [round(c) for c in counts]
    return Timeline(start_ms, bucket_ms, rounded, read, truncated, saturated)


class TimelineCache:
    """The timeline, read again once it is `ttl_s` old: every schedule page shows the same
    picture, and reading it costs up to `TIMELINE_SCHEDULES` records."""

    def __init__(
        self,
        repeat: Repeat,
        queues: QueueList,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.repeat, self.queues, self.ttl_s, self.clock = repeat, queues, ttl_s, clock
        self._timeline: Timeline | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> Timeline:
        timeline = self._timeline
        if timeline is not None and self.clock() - self._read_at < self.ttl_s:
            return timeline
        # One request reads it afresh; the others meanwhile get the picture before (or, with
        # none yet, wait for that one): many requests at its expiry read it once, not each.
        if not self._lock.acquire(blocking=timeline is None):
            assert timeline is not None
            return timeline
        try:
            now = self.clock()
            if self._timeline is None or now - self._read_at >= self.ttl_s:
                self._timeline = read_timeline(
                    self.repeat, self.queues(), self.repeat.server_time_ms()
                )
                self._read_at = now
            return self._timeline
        finally:
            self._lock.release()


def schedule_json(
    registration: Registration, now_ms: int, runs: Sequence[int], history: Sequence[HistoryEntry]
) -> dict[str, Any]:
    """Return a schedule page's data: `show --json`'s, its next runs and its history."""
    return {
        **registration_json(registration, now_ms),
        "next_runs_ms": list(runs),
        "history": [entry.to_dict() for entry in history],
    }
