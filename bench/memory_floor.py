"""What issue 17's memory aim (≤ 350 B of Redis memory a registration) needs, layout by layout.

    python -m bench.memory_floor --out bench/runs/2026-12-05-memory-floor
    python -m bench.memory_floor --quick   # N = 1,000, one repetition, a few seconds

One embedded valkey server; N registrations with the realistic bench's distinct ~100-byte
templates (`realistic_workload.declarations`). First the real thing: `sync()` of those
declarations into a settled, empty server, as `memory_emq` drives it. Then the very records
that sync wrote are read back and written again raw (HSET + ZADD, pipelined) in other
layouts, each labelled with what it drops or changes relative to today's record. Each is
measured the same way, per registration: `used_memory`'s Δ with the writers' connections
closed (what the keys hold: the figure judged) and right after the writes (the writer's
buffers included, as `memory_emq` reads it); `python -m bench.realistic`'s `stored` figure
(`realistic_scenarios.stored_bytes`); `MEMORY USAGE` of one record, of all of them
(`key_breakdown`) and of the registry's sorted set. Layouts outside the shared contract's
keys (one hash per queue, EchoMQ's field names changed) or that need a server setting
changed (a raised `hash-max-listpack-value`) are rows for comparison only, and say so.
celery-redbeat storing the same schedules is measured the same way. Every figure is the
median of the repetitions (all of them are in the JSON). Output as `python -m bench`:
`--out PATH` writes `PATH.json` and `PATH.md`, else a new pair in `bench/results/`.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from emq_bridge.embedded import EmbeddedServer
from emq_bridge.keys import QueueKeys
from emq_bridge.sync import sync
from emq_bridge.template_pieces import PIECES_FIELD, join_template, split_template

from . import realistic_scenarios as sc
from .common import QUEUE, Server, name_of, poll_until
from .output import describe_server, output_paths, portable_command
from .realistic_report import Medians, _fmt, _table
from .realistic_workload import SOURCE, declarations, redbeat_app, template_bytes
from .run import Results, log, machine, publish, step
from .systems import EMQ_PREFIX, REDBEAT_PREFIX, Emq

SCENARIO = "memory-floor"
AIM_BYTES = 350
SYNCED = "today's record, through sync()"
REDBEAT = "celery-redbeat (its own layout)"
CONTRACT = "contract"
SETTING = "contract keys; server setting changed"
OUTSIDE = "outside the contract"

Fields = dict[str, str]


@dataclass(frozen=True)
class Plan:
    n: int
    reps: int
    quick: bool = False
    raised_listpack_value: int = 128  # above the longest template here (97 B)


def plan_for(quick: bool) -> Plan:
    return Plan(n=1000, reps=1, quick=True) if quick else Plan(n=10_000, reps=3)


# -- the layouts: each made from a record as sync() wrote it ----------------------------

# Short names for every field but EchoMQ's `every_ms` and `template` (the contract's).
SHORT = {
    "digest": "d",
    "cadence_digest": "cd",
    "updated_ms": "u",
    "source": "s",
    "created_ms": "c",
    "anchor": "a",
    "misfire": "m",
    PIECES_FIELD: "tn",
}
# The record's fields besides the template, in the order a packed value holds them.
PACKED_ORDER = (
    "digest",
    "cadence_digest",
    "updated_ms",
    "source",
    "created_ms",
    "every_ms",
    "anchor",
    "misfire",
)
SEPARATOR = "\x1f"  # ASCII unit separator: in no value here


def _short(field: str) -> str:
    if field.startswith("template."):  # template.2 -> t2
        return "t" + field.removeprefix("template.")
    return SHORT.get(field, field)


def today(record: Fields) -> Fields:
    return dict(record)


def short_names(record: Fields) -> Fields:
    return {_short(field): value for field, value in record.items()}


def merged_digests(record: Fields) -> Fields:
    out = short_names(record)
    out.pop("cd")
    out["d"] = record["digest"][:16] + record["cadence_digest"][:16]
    return out


def one_timestamp(record: Fields) -> Fields:
    out = merged_digests(record)
    out.pop("c")
    return out


def no_timestamps(record: Fields) -> Fields:
    out = one_timestamp(record)
    out.pop("u")
    return out


def no_defaults(record: Fields) -> Fields:
    out = no_timestamps(record)
    if out.get("a") == "grid":
        out.pop("a")
    if out.get("m") == "coalesce":
        out.pop("m")
    return out


def _whole(record: Fields) -> str:
    template = join_template(record)
    if template is None:
        raise ValueError("the record has no template")
    return template


def minimal(record: Fields) -> Fields:
    pieces = split_template(_whole(record))
    out = {"every_ms": record["every_ms"], "template": pieces["template"]}
    out.update({_short(f): v for f, v in pieces.items() if f.startswith("template.")})
    out["d"] = record["digest"][:12] + record["cadence_digest"][:12]
    out["s"] = record["source"]
    return out


def minimal_renamed(record: Fields) -> Fields:
    out = minimal(record)
    out["e"] = out.pop("every_ms")
    out["t"] = out.pop("template")
    return out


def whole_template(record: Fields) -> Fields:
    out = {f: v for f, v in record.items() if f != PIECES_FIELD and not f.startswith("template.")}
    out["template"] = _whole(record)
    return out


def minimal_whole(record: Fields) -> Fields:
    return {
        "every_ms": record["every_ms"],
        "template": _whole(record),
        "d": record["digest"][:12] + record["cadence_digest"][:12],
        "s": record["source"],
    }


def packed_today(record: Fields) -> str:
    return SEPARATOR.join([*(record[f] for f in PACKED_ORDER), _whole(record)])


def packed_minimal(record: Fields) -> str:
    digest = record["digest"][:12] + record["cadence_digest"][:12]
    return SEPARATOR.join([record["every_ms"], digest, record["source"], _whole(record)])


@dataclass(frozen=True)
class Layout:
    """One way to store the registrations: a hash per registration made by `record`, or one
    hash per queue whose values `packed` makes; the registry's sorted set either way."""

    label: str
    keys: str  # CONTRACT, SETTING or OUTSIDE
    change: str  # what it drops or changes relative to today's record
    record: Callable[[Fields], Fields] | None = None
    packed: Callable[[Fields], str] | None = None
    raise_listpack_value: bool = False


LAYOUTS = (
    Layout("today, written raw", CONTRACT, "nothing (checks the raw writes against sync)", today),
    Layout(
        "short names",
        CONTRACT,
        "nothing: the same values, 9 fields renamed (`d`, `cd`, `u`, `s`, `c`, `a`, `m`, `tn`, "
        "`t2`); `every_ms`, `template` kept",
        short_names,
    ),
    Layout(
        "+ digests merged",
        CONTRACT,
        "+ both digests in one 32-char field, each cut to 16 hex chars (64 bits)",
        merged_digests,
    ),
    Layout(
        "+ one timestamp", CONTRACT, "+ `created_ms` dropped (`updated_ms` kept)", one_timestamp
    ),
    Layout("+ no timestamps", CONTRACT, "+ `updated_ms` dropped too", no_timestamps),
    Layout(
        "+ defaults omitted",
        CONTRACT,
        "+ `anchor` (grid) and `misfire` (coalesce) omitted at their defaults",
        no_defaults,
    ),
    Layout(
        "minimal",
        CONTRACT,
        "`every_ms`, `template`, `t2`, both digests in one 24-char field (12 + 12 hex), `s`: "
        "+ no pieces count",
        minimal,
    ),
    Layout(
        "minimal, EchoMQ's names shortened",
        OUTSIDE,
        "the minimal record with `every_ms` → `e`, `template` → `t`",
        minimal_renamed,
    ),
    Layout(
        "template whole, default limit",
        CONTRACT,
        "nothing: today's fields, the template in one field (the record before pieces: a "
        "hashtable)",
        whole_template,
    ),
    Layout(
        "template whole, raised limit",
        SETTING,
        "nothing: today's fields, the template in one field; `hash-max-listpack-value` raised",
        whole_template,
        raise_listpack_value=True,
    ),
    Layout(
        "minimal, template whole, raised limit",
        SETTING,
        "the minimal record with the template in one field; `hash-max-listpack-value` raised",
        minimal_whole,
        raise_listpack_value=True,
    ),
    Layout(
        "one hash per queue, today's values",
        OUTSIDE,
        "no key per registration: field = name, value = today's 9 values joined (nothing "
        "dropped but the field names)",
        packed=packed_today,
    ),
    Layout(
        "one hash per queue, minimal values",
        OUTSIDE,
        "no key per registration: field = name, value = `every_ms`, 24-char digest, source, "
        "template joined",
        packed=packed_minimal,
    ),
)


# -- measuring -------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """A registration as sync() wrote it: name, record fields, registry score."""

    name: str
    record: Fields
    score: float


def read_back(client: Any, keys: QueueKeys, n: int) -> list[Stored]:
    """Every record and score of registrations 0..n-1, in chunks of 1,000."""
    out: list[Stored] = []
    for start in range(0, n, 1000):
        names = [name_of(i) for i in range(start, min(n, start + 1000))]
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(keys.record(name))
        pipe.zmscore(keys.registry, names)
        *records, scores = pipe.execute()
        for name, raw, score in zip(names, records, scores, strict=True):
            record = {f.decode(): v.decode() for f, v in raw.items()}
            out.append(Stored(name, record, float(score)))
    return out


def key_tables(server: Server) -> tuple[int, int]:
    """`(tables, lut)` from MEMORY STATS: the databases' key tables
    (`overhead.hashtable.main` + `.expires`), and their bucket arrays, which `tables`
    already holds (`overhead.total` grows by `tables` alone), and which
    `realistic_scenarios.stored_bytes` adds to them once more."""
    stats: Any = server.admin.memory_stats()
    tables = sum(
        int(value.get("overhead.hashtable.main", 0))
        + int(value.get("overhead.hashtable.expires", 0))
        for key, value in stats.items()
        if key.startswith("db.") and isinstance(value, dict)
    )
    return tables, int(stats.get("overhead.db.hashtable.lut", 0))


def close_writers(server: Server, client: Any) -> None:
    """Close every connection but the bench's admin one (the writers': this client's pool,
    celery-redbeat's own), so the clients' buffers they hold leave used_memory."""
    client.connection_pool.disconnect()
    admin: Any = server.admin
    admin.client_kill_filter(_type="normal", skipme=True)
    poll_until(lambda: int(server.admin.info("clients")["connected_clients"]) <= 1, 5.0)


def footprint(
    server: Server, client: Any, n: int, write: Callable[[], str], family: str, registry: str
) -> dict[str, Any]:
    """Run `write` (it returns the key of one record) on a settled, empty server; what it
    left, per registration. used_memory's Δ twice: as `memory_emq` reads it (the writer
    still connected: its buffers count) and with the writers' connections closed (what the
    keys hold: the figure judged); `python -m bench.realistic`'s `stored` figure beside."""
    sc.settle(server)
    close_writers(server, client)
    before, stored_before, (tables_before, lut_before) = (
        server.raw().used_memory,
        sc.stored_bytes(server),
        key_tables(server),
    )
    key = write()
    connected = server.raw().used_memory
    close_writers(server, client)
    closed = server.raw().used_memory
    stored_after, (tables, lut) = sc.stored_bytes(server), key_tables(server)
    breakdown = sc.key_breakdown(client, n, stored_before, stored_after)
    anatomy = sc.record_anatomy(client, key)
    per_record = breakdown["families"].get(family, {}).get("bytes_per_registration")
    if anatomy.get("fields", 0) > 100:  # the queue's one hash: not a field list per name
        anatomy["value_bytes_mean"] = statistics.mean(anatomy.pop("field_bytes").values())
        per_record = None
    return {
        "closed_bytes_per_registration": (closed - before) / n,
        "bytes_per_registration": (connected - before) / n,
        "key_table_bytes_per_registration": (tables - tables_before) / n,
        "lut_bytes_per_registration": (lut - lut_before) / n,
        "record_bytes": server.memory_usage(key),
        "record_bytes_mean": per_record,
        "registry_zset_bytes_per_member": (server.memory_usage(registry) or 0) / n,
        "record": anatomy,
        **breakdown,  # its stored_bytes_per_registration: python -m bench.realistic's figure
    }


RECORDS = "emq:{bench}:repeat:<name>"  # the record family in key_breakdown's names


def measure_sync(server: Server, emq: Emq, n: int, kept: list[Stored]) -> dict[str, Any]:
    """sync() of n declarations, as `memory_emq` drives it; what it wrote is kept in `kept`
    (the raw layouts are made of it)."""
    declared = declarations(n)

    def write() -> str:
        sync(emq.repeat, declared, SOURCE)
        return emq.keys.record(name_of(0))

    out = footprint(server, emq.client, n, write, RECORDS, emq.keys.registry)
    kept[:] = read_back(emq.client, emq.keys, n)
    out["template_bytes"] = statistics.mean(template_bytes(i) for i in range(n))
    server.flush()
    return out


def write_layout(client: Any, layout: Layout, stored: list[Stored]) -> str:
    """Write `stored` in `layout`, pipelined in chunks of 1,000; return the key of record 0
    (the queue's hash for a packed layout)."""
    keys = QueueKeys(EMQ_PREFIX, QUEUE)
    packed_key = f"{keys.tag}:records"
    for start in range(0, len(stored), 1000):
        chunk = stored[start : start + 1000]
        pipe = client.pipeline(transaction=False)
        if layout.packed is not None:
            pipe.hset(packed_key, mapping={s.name: layout.packed(s.record) for s in chunk})
        elif layout.record is not None:
            for s in chunk:
                pipe.hset(keys.record(s.name), mapping=layout.record(s.record))
        pipe.zadd(keys.registry, {s.name: s.score for s in chunk})
        pipe.execute()
    return packed_key if layout.packed is not None else keys.record(stored[0].name)


def measure_layout(
    server: Server, client: Any, layout: Layout, stored: list[Stored], raised: int
) -> dict[str, Any]:
    """Write the layout into a settled, empty server and measure it as sync() is."""
    default = client.config_get("hash-max-listpack-value")["hash-max-listpack-value"]
    if layout.raise_listpack_value:
        client.config_set("hash-max-listpack-value", raised)
    try:
        write = partial(write_layout, client, layout, stored)
        registry = QueueKeys(EMQ_PREFIX, QUEUE).registry
        return footprint(server, client, len(stored), write, RECORDS, registry)
    finally:
        client.config_set("hash-max-listpack-value", default)
        server.flush()


def measure_redbeat(server: Server, client: Any, n: int) -> dict[str, Any]:
    """celery-redbeat storing the same schedules, as `memory_redbeat` drives it (the app
    made first, then `RedBeatScheduler(app=app, lazy=False)`), measured as our layouts."""
    from redbeat.schedulers import RedBeatScheduler  # type: ignore[import-untyped]

    app = redbeat_app(server.url, n)

    def write() -> str:
        RedBeatScheduler(app=app, lazy=False)
        return f"{REDBEAT_PREFIX}{name_of(0)}"

    try:
        family, registry = f"{REDBEAT_PREFIX}<name>", f"{REDBEAT_PREFIX}:schedule"
        return footprint(server, client, n, write, family, registry)
    finally:
        server.flush()


# -- the table -------------------------------------------------------------------------


def _aim(value: Any) -> str:
    return "—" if value is None else ("yes" if value <= AIM_BYTES else "no")


def render(meta: dict[str, Any], medians: Medians) -> str:
    m = meta.get("machine", {})
    plan = meta.get("plan", {})
    rows = []
    for label, sizes in medians.get(SCENARIO, {}).items():
        for slot in sizes.values():
            record = slot.get("record") or {}
            layout = meta.get("layouts", {}).get(label, {})
            usage = f"{_fmt(slot.get('record_bytes'))} / {_fmt(slot.get('record_bytes_mean'))}"
            if record.get("fields", 0) > 100:
                usage = f"the queue's hash / N: {_fmt((slot.get('record_bytes') or 0) / plan['n'])}"
            closed = slot.get("closed_bytes_per_registration")
            stored = slot.get("stored_bytes_per_registration")
            runs = slot.get("runs", 1)
            rows.append(
                [
                    label + (f" ⁽{runs}⁾" if runs > 1 else ""),
                    layout.get("keys", ""),
                    layout.get("change", ""),
                    f"{record.get('encoding', '—')}, {record.get('fields', '—')} fields",
                    usage,
                    _fmt(slot.get("registry_zset_bytes_per_member")),
                    _fmt(slot.get("key_table_bytes_per_registration")),
                    f"**{_fmt(closed)}**",
                    _fmt(slot.get("bytes_per_registration")),
                    _fmt(stored),
                    f"{_aim(closed)} / {_aim(stored)}",
                    slot.get("error", ""),
                ]
            )
    out = [
        f"# emq-bridge memory floor — {meta.get('started', '')}",
        "",
        f"`{meta.get('command', '')}` — {m.get('nproc')} CPUs ({m.get('cpu')}), "
        f"{meta.get('server')} (`hash-max-listpack-value` {meta.get('listpack_value')}, "
        f"{plan.get('raised_listpack_value')} where a row says it is raised), Python "
        f"{m.get('python')}, celery-redbeat {m.get('celery-redbeat')}; took "
        f"{meta.get('seconds')} s.",
        "",
        f"N = {plan.get('n', 0):,} registrations in one queue, distinct templates of "
        f"{meta.get('template_bytes_min')} to {meta.get('template_bytes_max')} B (compact "
        "JSON), no history. The first row is `sync()`; the raw rows write the records that "
        "sync wrote (HSET + ZADD, pipelined), changed as the row says. Each figure is per "
        "registration, on a settled empty server. **used_memory, writers closed**: its Δ "
        "once the writing connections are closed (what the keys hold; the figure judged); "
        "*writer connected*: its Δ right after the writes, as `memory_emq` reads it (the "
        "writer's buffers included); *stored*: `python -m bench.realistic`'s aim figure "
        "(`MEMORY STATS` dataset + key tables + `overhead.db.hashtable.lut`, which the key "
        "tables already hold). MEMORY USAGE: of `job-0000000` (the shortest template) / the "
        "mean of all records. Each figure is the median of the runs marked ⁽ⁿ⁾; every run "
        "is in the JSON.",
        "",
        *_table(
            [
                "layout",
                "keys",
                "drops or changes, relative to today's record",
                "record",
                "MEMORY USAGE: record 0 / mean",
                "registry zset B/member",
                "key table B/registration",
                "**used_memory, writers closed**",
                "used_memory, writer connected",
                "stored (realistic bench)",
                f"≤ {AIM_BYTES} B? closed / stored",
                "error",
            ],
            rows,
        ),
        "",
    ]
    return "\n".join(out)


# -- the run ---------------------------------------------------------------------------


def run(plan: Plan, results: Results, server: Server, emq: Emq) -> None:
    n = plan.n
    stored: list[Stored] = []
    for _ in range(plan.reps):
        step(results, SCENARIO, SYNCED, n, partial(measure_sync, server, emq, n, stored))
    if not stored:
        raise RuntimeError("sync() failed: no records to lay out (its error is in the JSON)")
    for _ in range(plan.reps):
        for layout in LAYOUTS:
            action = partial(
                measure_layout, server, emq.client, layout, stored, plan.raised_listpack_value
            )
            step(results, SCENARIO, layout.label, n, action)
    for _ in range(plan.reps):
        step(results, SCENARIO, REDBEAT, n, partial(measure_redbeat, server, emq.client, n))


def warm(server: Server, emq: Emq) -> None:
    """One-time server costs (scripts loaded, databases created) before any figure."""
    sync(emq.repeat, declarations(10), SOURCE)
    sc.memory_redbeat(server, 10)
    server.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.memory_floor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="N = 1,000, one repetition")
    parser.add_argument("--out", type=Path, metavar="PATH", help="write PATH.json and PATH.md")
    parser.add_argument("--n", type=int, help="registrations (default 10,000; --quick 1,000)")
    parser.add_argument("--reps", type=int, help="repetitions (default 3; --quick 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("celery").setLevel(logging.ERROR)
    logging.getLogger("emq_bridge").setLevel(logging.ERROR)  # sync plans: a line per schedule

    plan = plan_for(args.quick)
    plan = Plan(n=args.n or plan.n, reps=args.reps or plan.reps, quick=plan.quick)
    started = time.time()
    stem = args.out
    if stem is None:
        default = output_paths(None, None, None, started, args.quick, False)[0]
        stem = default.with_name(default.stem + "-memory-floor")
    figures_path, table_path = output_paths(stem, None, None, started, args.quick, False)
    sizes = [template_bytes(i) for i in range(plan.n)]
    with EmbeddedServer() as embedded:
        server = Server(embedded.url)
        argv_used = argv if argv is not None else sys.argv[1:]
        admin: Any = server.admin
        meta = {
            "command": portable_command(argv_used).replace("-m bench", "-m bench.memory_floor", 1),
            "quick": plan.quick,
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
            "server": describe_server(embedded.binary, server.name_and_version()),
            "listpack_value": int(
                admin.config_get("hash-max-listpack-value")["hash-max-listpack-value"]
            ),
            "machine": machine(),
            "plan": vars(plan),
            "template_bytes_min": min(sizes),
            "template_bytes_max": max(sizes),
            "template_bytes_mean": statistics.mean(sizes),
            "layouts": {
                layout.label: {"keys": layout.keys, "change": layout.change} for layout in LAYOUTS
            }
            | {
                SYNCED: {"keys": CONTRACT, "change": "— (what the code writes today)"},
                REDBEAT: {"keys": "—", "change": "— (celery-redbeat's `beat_schedule` store)"},
            },
        }
        results = Results(figures_path, meta)
        log(f"server {meta['server']} at {embedded.url}")
        emq = Emq(embedded.url)
        try:
            warm(server, emq)
            run(plan, results, server, emq)
        finally:
            emq.close()
        results.meta["seconds"] = round(time.time() - started, 1)
        results.save()
    publish(render(results.meta, results.medians()), table_path, figures_path, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
