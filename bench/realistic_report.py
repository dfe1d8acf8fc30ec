# ruff: noqa: RUF001  # the tables print the multiplication and minus signs on purpose
"""The tables of `python -m bench.realistic`: the aims of issue 17, then every scenario.

Every number comes from the run's medians; a status is computed against the aim's
threshold, never written by hand. No aim is judged on an identical-template row. Where the
run measured another size than the aim's (`--quick`), the status says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Medians = dict[str, dict[str, dict[str, dict[str, Any]]]]

DEFAULT = "emq drop-in, default"
PIPELINED = "emq drop-in, pipelined"
REDBEAT = "celery-redbeat"
BARE = "bare enqueue loop"


# The label's end that marks a sustained row at a lower rate (secondary, no aim judged).
LOWER_RATE = " (lower rate)"


def _percent(share: Any) -> str:
    return "—" if share is None else f"{100 * share:.0f}%"


def sustained_label(rate: int, pumps: int) -> str:
    """The label of a sustained row at a lower rate than the aim's."""
    return f"{rate:,}/s, {pumps} pump{'s' if pumps > 1 else ''}, pipelined Celery{LOWER_RATE}"


def _get(medians: Medians, scenario: str, system: str, n: int | None = None) -> dict[str, Any]:
    sizes = medians.get(scenario, {}).get(system, {})
    if n is None:  # the one size measured
        return next(iter(sizes.values()), {})
    return sizes.get(str(n), {})


def _sizes(medians: Medians, scenario: str, system: str) -> list[int]:
    return sorted(int(n) for n in medians.get(scenario, {}).get(system, {}))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if digits == 0 and abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:,.{max(digits, 1 if abs(value) < 100 else 0)}f}" if value else "0"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


@dataclass
class Aim:
    aim: str
    measured: str
    met: bool | None
    note: str = ""

    def status(self) -> str:
        if self.met is None:
            return "not measured"
        return ("met" if self.met else "not met") + (f" ({self.note})" if self.note else "")


def _at(n: int, aim_n: int) -> str:
    return "" if n == aim_n else f"measured at N={n:,}, the aim is at N={aim_n:,}"


def aims(medians: Medians, quick: bool) -> list[Aim]:
    out: list[Aim] = []
    # Celery drop-in, distinct args, due at once: >= 10x celery-redbeat.
    for aim_n in (10_000, 100_000):
        sizes = _sizes(medians, "celery", DEFAULT)
        n = aim_n if aim_n in sizes else (sizes[0] if quick and sizes else aim_n)
        peer = _get(medians, "celery", REDBEAT, n).get("rate")
        ratios = {
            label: _ratio(_get(medians, "celery", label, n).get("rate"), peer)
            for label in (DEFAULT, PIPELINED)
        }
        best = max((r for r in ratios.values() if r is not None), default=None)
        measured = ", ".join(
            f"{k.removeprefix('emq drop-in, ')} {_x(v)}" for k, v in ratios.items()
        )
        out.append(
            Aim(
                f"Celery drop-in (celery beat -S emq), distinct args, {aim_n:,} due at once: "
                "≥ 10× celery-redbeat",
                measured,
                None if best is None else best >= 10,
                _at(n, aim_n),
            )
        )
    # Dramatiq, distinct args: default >= 1.0x a bare enqueue loop, pipelined >= 2x.
    for label, floor in (("default", 1.0), ("pipelined", 2.0)):
        for n in _sizes(medians, "dramatiq", BARE):
            bare = _get(medians, "dramatiq", BARE, n).get("rate")
            middleware = _ratio(
                _get(medians, "dramatiq", f"RecurringMiddleware, {label}", n).get("rate"), bare
            )
            pump = _ratio(_get(medians, "dramatiq", f"Pump.run, {label}", n).get("rate"), bare)
            out.append(
                Aim(
                    f"Dramatiq {label} path, distinct args, N={n:,}: ≥ {floor:.1f}× a bare "
                    "broker.enqueue loop (judged on the worker's RecurringMiddleware)",
                    f"middleware {_x(middleware)}, Pump.run {_x(pump)}",
                    None if middleware is None else middleware >= floor,
                )
            )
    # Boot of a 100,000-entry beat_schedule <= 2 s; unchanged restart <= 1 s with 0 writes.
    for system in (
        "beat_schedule (RepeatScheduler)",
        "@recurring (RepeatScheduler)",
        "TOML file (emq-bridge sync)",
    ):
        for n in _sizes(medians, "boot", system):
            got = _get(medians, "boot", system, n)
            out.append(
                Aim(
                    f"boot from a {system}: conversion + sync ≤ 2 s",
                    f"{_fmt(got.get('boot_s'), 2)} s",
                    None if got.get("boot_s") is None else got["boot_s"] <= 2.0,
                    _at(n, 100_000),
                )
            )
            restart, writes = got.get("restart_s"), got.get("restart_writes")
            out.append(
                Aim(
                    f"unchanged restart, {system}: ≤ 1 s with 0 writes",
                    f"{_fmt(restart, 2)} s, {_fmt(writes)} writes",
                    None if restart is None else restart <= 1.0 and writes == 0,
                    _at(n, 100_000),
                )
            )
    for n in _sizes(medians, "boot", "sync() of prebuilt declarations"):
        got = _get(medians, "boot", "sync() of prebuilt declarations", n)
        out.append(
            Aim(
                "1,000,000 declarations synced (sync()) ≤ 5 s",
                f"{_fmt(got.get('boot_s'), 2)} s (unchanged: {_fmt(got.get('restart_s'), 2)} s, "
                f"{_fmt(got.get('restart_writes'))} writes)",
                None if got.get("boot_s") is None else got["boot_s"] <= 5.0,
                _at(n, 1_000_000),
            )
        )
    mem = _get(medians, "memory", "emq-bridge")
    peer_mem = _get(medians, "memory", REDBEAT)
    stored = mem.get("stored_bytes_per_registration")
    out.append(
        Aim(
            "≤ 350 B of Redis memory per registration, ~100-byte distinct template, no history "
            "(judged on the keys' bytes, MEMORY STATS; used_memory beside it)",
            f"{_fmt(stored)} B, used_memory {_fmt(mem.get('bytes_per_registration'))} B "
            f"(celery-redbeat {_fmt(peer_mem.get('stored_bytes_per_registration'))} B, "
            f"used_memory {_fmt(peer_mem.get('bytes_per_registration'))} B)",
            None if stored is None else stored <= 350,
        )
    )
    idle = _get(medians, "many-queues", "idle tick")
    out.append(
        Aim(
            "one pump over 1,000 queues, nothing due: ≤ 2 round trips per idle tick",
            f"{_fmt(idle.get('idle_tick_round_trips'))} round trips, "
            f"{_fmt(idle.get('idle_tick_ms'), 1)} ms",
            None
            if idle.get("idle_tick_round_trips") is None
            else idle["idle_tick_round_trips"] <= 2,
        )
    )
    wake = _get(medians, "many-queues", "wake-up")
    subs = wake.get("subscriptions")
    out.append(
        Aim(
            "wake-ups for all 1,000 queues on one subscription (a register on queue #999 wakes "
            "the pump)",
            f"{_fmt(subs)} channels/patterns on {_fmt(wake.get('subscribed_connections'))} "
            f"connection(s); register → message {_fmt(wake.get('wake_ms'), 1)} ms, "
            f"{_fmt(wake.get('wake_missed'))} missed",
            # One subscription: one pub/sub connection (one SUBSCRIBE of every queue's channel).
            None
            if subs is None
            else wake.get("subscribed_connections") == 1 and wake.get("wake_missed") == 0,
        )
    )
    sus = _get(medians, "sustained", "2 pumps, pipelined Celery")
    target = sus.get("target_rate")
    p99 = sus.get("lag_p99_ms")
    out.append(
        Aim(
            "sustained 10,000 occurrences/s across 2 pumps for 60 s: p99 (sent − nominal) "
            "< 50 ms, the rate kept, 0 duplicates",
            f"p99 {_fmt(p99, 1)} ms (p50 {_fmt(sus.get('lag_p50_ms'), 1)}), "
            f"{_fmt(sus.get('rate'))}/s, {_fmt(sus.get('duplicates'))} duplicates",
            None
            if p99 is None or target is None
            else p99 < 50 and sus["rate"] >= 0.99 * target and sus.get("duplicates") == 0,
            "10 s in --quick" if quick else "",
        )
    )
    for label in (PIPELINED, DEFAULT):
        sizes = _sizes(medians, "celery", label)
        if sizes:
            n = sizes[-1]
            first = _get(medians, "celery", label, n).get("first_ms")
            out.append(
                Aim(
                    f"first message of a 100k burst < 50 ms ({label})",
                    f"{_fmt(first, 1)} ms",
                    None if first is None else first < 50,
                    _at(n, 100_000),
                )
            )
    page = _get(medians, "list", "emq-bridge list --limit 50")
    for what, key in (
        ("the whole command (a new process)", "command_ms"),
        ("in-process (the CLI's list command)", "in_process_ms"),
    ):
        out.append(
            Aim(
                f"first page of `emq-bridge list --limit 50` at 100,000 schedules < 100 ms: {what}",
                f"{_fmt(page.get(key), 1)} ms",
                None if page.get(key) is None else page[key] < 100,
                _at(int(page.get("schedules") or 0), 100_000) if page else "",
            )
        )
    return out


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _runs(slot: dict[str, Any]) -> str:
    runs = slot.get("runs", 1)
    return f" ⁽{runs}⁾" if runs and runs > 1 else ""


def celery_table(medians: Medians) -> list[str]:
    rows = []
    for system, sizes in medians.get("celery", {}).items():
        for n, slot in sorted(sizes.items(), key=lambda kv: int(kv[0])):
            identical = "identical" in system
            peer_label = REDBEAT + (" · identical args (secondary)" if identical else "")
            peer = _get(medians, "celery", peer_label, int(n)).get("rate")
            capped = "" if slot.get("complete", True) else " (capped)"
            rows.append(
                [
                    system + _runs(slot),
                    f"{int(n):,}",
                    _fmt(slot.get("rate")) + capped,
                    _fmt(slot.get("first_ms"), 1),
                    _fmt(slot.get("drain_s") or slot.get("drain_s_extrapolated"), 2),
                    _fmt(slot.get("round_trips_per_occ"), 3),
                    _fmt(slot.get("server_commands_per_occ"), 2),
                    "1.00×" if system.startswith(REDBEAT) else _x(_ratio(slot.get("rate"), peer)),
                    slot.get("error", ""),
                ]
            )
    return _table(
        [
            "system",
            "N",
            "occurrences/s ↑",
            "first message ms ↓",
            "drain s ↓",
            "round trips/occ",
            "server commands/occ",
            "× redbeat",
            "error",
        ],
        rows,
    )


def dramatiq_table(medians: Medians) -> list[str]:
    rows = []
    for system, sizes in medians.get("dramatiq", {}).items():
        for n, slot in sorted(sizes.items(), key=lambda kv: int(kv[0])):
            bare = _get(medians, "dramatiq", BARE, int(n)).get("rate")
            rows.append(
                [
                    system + _runs(slot),
                    f"{int(n):,}",
                    _fmt(slot.get("rate")),
                    _fmt(slot.get("first_ms"), 1),
                    _fmt(slot.get("round_trips_per_occ", slot.get("round_trips")), 3),
                    _x(_ratio(slot.get("rate"), bare)),
                    slot.get("error", ""),
                ]
            )
    return _table(
        [
            "path",
            "N",
            "occurrences/s ↑",
            "first message ms ↓",
            "round trips/occ",
            "× bare loop",
            "error",
        ],
        rows,
    )


def boot_table(medians: Medians) -> list[str]:
    rows = []
    for system, sizes in medians.get("boot", {}).items():
        for n, slot in sizes.items():
            rows.append(
                [
                    system + _runs(slot),
                    f"{int(n):,}",
                    _fmt(slot.get("boot_s"), 2),
                    _fmt(slot.get("convert_s"), 2),
                    _fmt(slot.get("boot_writes")),
                    _fmt(slot.get("restart_s"), 2),
                    _fmt(slot.get("restart_writes")),
                    _fmt(slot.get("restart_round_trips")),
                    slot.get("error", ""),
                ]
            )
    return _table(
        [
            "declared as",
            "N",
            "boot s ↓",
            "of which conversion s",
            "boot writes",
            "unchanged restart s ↓",
            "restart writes",
            "restart round trips",
            "error",
        ],
        rows,
    )


def memory_table(medians: Medians) -> list[str]:
    rows = []
    for system, sizes in medians.get("memory", {}).items():
        for n, slot in sizes.items():
            record = slot.get("record") or {}
            families = slot.get("families") or {}
            where = "; ".join(
                f"`{family}` {info['bytes_per_registration']:.0f}"
                for family, info in families.items()
            )
            rows.append(
                [
                    system,
                    f"{int(n):,}",
                    _fmt(slot.get("stored_bytes_per_registration")),
                    _fmt(slot.get("bytes_per_registration")),
                    _fmt(slot.get("record_bytes")),
                    f"{record.get('encoding', '—')}, {record.get('fields', '—')} fields, largest "
                    f"value {record.get('largest_value', '—')} B",
                    where
                    + f"; keyspace tables {_fmt(slot.get('keyspace_per_registration'))}"
                    + f"; unattributed {_fmt(slot.get('unattributed_per_registration'))}",
                    slot.get("error", ""),
                ]
            )
    return _table(
        [
            "store",
            "N",
            "stored B/registration ↓ (MEMORY STATS)",
            "used_memory B/registration",
            "MEMORY USAGE of one record",
            "record",
            "where the bytes go (B per registration)",
            "error",
        ],
        rows,
    )


def rest_table(medians: Medians) -> list[str]:
    out = []
    idle = _get(medians, "many-queues", "idle tick")
    wake = _get(medians, "many-queues", "wake-up")
    if idle or wake:
        out += [
            "One `Pump` over 1,000 queues × 10 registrations, none due: idle tick "
            f"{_fmt(idle.get('idle_tick_ms'), 1)} ms, {_fmt(idle.get('idle_tick_round_trips'))} "
            f"round trips, {_fmt(idle.get('idle_tick_server_commands'))} server commands; "
            f"a register on queue #999 → its message {_fmt(wake.get('wake_ms'), 1)} ms "
            f"(max {_fmt(wake.get('wake_max_ms'), 1)}, {_fmt(wake.get('wake_missed'))} missed), "
            f"{_fmt(wake.get('subscriptions'))} channels/patterns subscribed on "
            f"{_fmt(wake.get('subscribed_connections'))} connection(s). "
            f"{idle.get('error', '')}{wake.get('error', '')}",
            "",
        ]
    sus = _get(medians, "sustained", "2 pumps, pipelined Celery")
    if sus:
        out += [
            f"Sustained: {_fmt(sus.get('target_rate'))} registrations every second (phases "
            f"spread), {_fmt(sus.get('pumps'))} `Pump.run` processes with "
            f"`PipelinedCeleryDispatcher`: {_fmt(sus.get('rate'))} occurrences/s, (sent − "
            f"nominal) p50 {_fmt(sus.get('lag_p50_ms'), 1)} ms, p99 "
            f"{_fmt(sus.get('lag_p99_ms'), 1)} ms, max {_fmt(sus.get('lag_max_ms'), 1)} ms; "
            f"{_fmt(sus.get('messages'))} messages read back, {_fmt(sus.get('duplicates'))} "
            f"duplicates; per occurrence sent, the pumps' CPU "
            f"{_fmt(sus.get('pump_cpu_us_per_occ'))} µs and the server's "
            f"{_fmt(sus.get('server_cpu_us_per_occ'))} µs; "
            f"{_percent(sus.get('lost_to_other_pumps'))} of what a pump's scans found due "
            f"went to the other pump's claim. {sus.get('error', '')}",
            "",
        ]
    low = [
        (label, figures)
        for label, sizes in medians.get("sustained", {}).items()
        if label.endswith(LOWER_RATE)
        for figures in sizes.values()
    ]
    if low:
        out += [
            "Secondary rows, at lower rates (no aim is judged on them): where the pumps, the "
            "server and this reader do not take every CPU.",
            "",
            "| rate, pumps | achieved /s | p50 ms | p99 ms | max ms | duplicates "
            "| pump CPU µs/occ | server CPU µs/occ | lost to the other pump |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for label, figures in low:
            out.append(
                f"| {label.removesuffix(LOWER_RATE)} | {_fmt(figures.get('rate'))} | "
                f"{_fmt(figures.get('lag_p50_ms'), 1)} | {_fmt(figures.get('lag_p99_ms'), 1)} | "
                f"{_fmt(figures.get('lag_max_ms'), 1)} | {_fmt(figures.get('duplicates'))} | "
                f"{_fmt(figures.get('pump_cpu_us_per_occ'))} | "
                f"{_fmt(figures.get('server_cpu_us_per_occ'))} | "
                f"{_percent(figures.get('lost_to_other_pumps'))} |"
            )
        out.append("")
    page = _get(medians, "list", "emq-bridge list --limit 50")
    if page:
        out += [
            f"`emq-bridge list --limit 50` at {_fmt(page.get('schedules'))} schedules: the "
            f"command {_fmt(page.get('command_ms'), 1)} ms (of which starting Python and "
            f"importing, `emq-bridge --version`: {_fmt(page.get('startup_floor_ms'), 1)} ms; "
            f"Python and `import redis` alone: {_fmt(page.get('import_redis_ms'), 1)} ms), "
            f"in-process {_fmt(page.get('in_process_ms'), 1)} ms, `Repeat.list(limit=50)` "
            f"{_fmt(page.get('list_page_ms'), 1)} ms. {page.get('error', '')}",
        ]
    return out


def render(meta: dict[str, Any], medians: Medians) -> str:
    m = meta.get("machine", {})
    quick = bool(meta.get("quick"))
    found = aims(medians, quick)
    out = [
        f"# emq-bridge realistic bench — {meta.get('started', '')}",
        "",
        f"`{meta.get('command', '')}` — {m.get('nproc')} CPUs ({m.get('cpu')}), "
        f"{m.get('memory_gb')} GB, {meta.get('server')}, Python {m.get('python')}, celery "
        f"{m.get('celery')}, celery-redbeat {m.get('celery-redbeat')}, dramatiq "
        f"{m.get('dramatiq')}, sentry-sdk {meta.get('sentry-sdk')}; load average at start "
        f"{m.get('load_average_at_start')}; took "
        f"{meta.get('seconds')} s.",
        "",
        "Distinct args/kwargs per registration unless a row says *identical args "
        "(secondary)*; no aim is judged on such a row. Each figure is the median of the runs "
        "marked ⁽ⁿ⁾ (one run when unmarked); every run is in the JSON.",
        "",
        "## Aims (issue 17)",
        "",
        *_table(["aim", "measured", "status"], [[a.aim, a.measured, a.status()] for a in found]),
        "",
        "## Celery drop-in: `celery beat -S emq` (RepeatScheduler) beside celery-redbeat",
        "",
        *celery_table(medians),
        "",
        "## Dramatiq: a worker's RecurringMiddleware pump thread, Pump.run, a bare loop",
        "",
        *dramatiq_table(medians),
        "",
        "## Boot: convert + sync into an empty registry, then an unchanged restart",
        "",
        *boot_table(medians),
        "",
        "## Memory per registration (no history)",
        "",
        *memory_table(medians),
        "",
        "## Many queues, sustained rate, list",
        "",
        *rest_table(medians),
        "",
    ]
    return "\n".join(out)
