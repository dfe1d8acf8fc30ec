"""Render the medians as one Markdown table (plus scale-out and baselines), ratios emq/peer."""

from __future__ import annotations

from typing import Any

EMQ_CELERY = "emq-bridge→celery"
EMQ_CELERY_PIPELINED = "emq-bridge→celery-pipelined"
EMQ_DRAMATIQ = "emq-bridge→dramatiq"
EMQ_PIPELINED = "emq-bridge→dramatiq-pipelined"
# The path columns of the main table, in order.
EMQ_PATHS = (EMQ_CELERY, EMQ_CELERY_PIPELINED, EMQ_DRAMATIQ, EMQ_PIPELINED)
EMQ = "emq-bridge"
REDBEAT = "celery-redbeat"
PERSISTENT = "PersistentScheduler"

# (scenario, metric, label, lower_is_better, path_specific)
ROWS: list[tuple[str, str, str, bool, bool]] = [
    ("burst", "first_ms", "burst: first message (ms)", True, True),
    ("burst", "drain_s", "burst: all N accepted (s)", True, True),
    ("burst", "rate", "burst: occurrences/s", False, True),
    ("burst", "round_trips_per_occ", "burst: round trips/occurrence", True, True),
    ("burst", "commands_sent_per_occ", "burst: commands sent/occurrence", True, True),
    (
        "burst",
        "server_commands_per_occ",
        "burst: server commands/occurrence (incl. Lua)",
        True,
        True,
    ),
    ("idle", "idle_tick_ms", "idle tick: wall time (ms)", True, False),
    ("idle", "idle_tick_round_trips", "idle tick: round trips", True, False),
    ("idle", "idle_tick_server_commands", "idle tick: server commands (incl. Lua)", True, False),
    ("sync", "sync_empty_s", "boot sync, empty registry (s)", True, False),
    ("sync", "sync_unchanged_s", "boot sync, unchanged (s)", True, False),
    ("sync", "sync_unchanged_writes", "boot sync, unchanged: server writes", True, False),
    ("sync", "bytes_per_schedule", "memory: used_memory Δ / N (bytes)", True, False),
    ("sync", "record_bytes", "memory: MEMORY USAGE of one record (bytes)", True, False),
    (
        "memory-min",
        "bytes_per_schedule",
        "memory, task-only template: used_memory Δ / N",
        True,
        False,
    ),
    (
        "memory-min",
        "record_bytes",
        "memory, task-only template: MEMORY USAGE of one record",
        True,
        False,
    ),
    ("pickup", "pickup_ms", "pickup: added at runtime, delay after due (ms)", True, True),
    ("lag", "lag_p50_ms", "fire lag at 1,000/s: p50 (ms)", True, True),
    ("lag", "lag_p99_ms", "fire lag at 1,000/s: p99 (ms)", True, True),
    ("lag", "lag_rate", "fire lag: occurrences/s achieved", False, True),
]


CAPPED_TRAFFIC = ("rate", "round_trips_per_occ", "commands_sent_per_occ", "server_commands_per_occ")
CAPPED_NOTE = (
    "† the drain was stopped at its cap: the figure is what was sent so far divided by the "
    "messages so far (celery-redbeat loads every due entry before it sends, so its per-message "
    "traffic is inflated when cut short; its uncut figure is the one at the smaller N)."
)


def fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    number = float(value)
    if number == 0:
        return "0"
    if abs(number) >= 1000:
        return f"{number:,.0f}"
    if abs(number) >= 100:
        return f"{number:.0f}"
    if abs(number) >= 10:
        return f"{number:.1f}"
    if abs(number) >= 1:
        return f"{number:.2f}"
    return f"{number:.3g}"


def ratio(ours: Any, theirs: Any) -> str:
    if (
        not isinstance(ours, (int, float))
        or not isinstance(theirs, (int, float))
        or isinstance(ours, bool)
    ):
        return "—"
    if theirs == 0:
        return "0 vs 0" if ours == 0 else "∞"
    return f"{ours / theirs:.3g}×"  # noqa: RUF001


def cell(
    medians: dict[str, Any], scenario: str, system: str, n: str, metric: str
) -> tuple[Any, str]:
    """Return (value for ratios, text for the table) of one cell; capped drains are marked."""
    slot = medians.get(scenario, {}).get(system, {}).get(n)
    if slot is None:
        return None, "—"
    if "error" in slot and metric not in slot:
        return None, "error"
    value = slot.get(metric)
    if (
        scenario == "burst"
        and metric == "drain_s"
        and value is None
        and slot.get("drain_s_extrapolated")
    ):
        guess = slot["drain_s_extrapolated"]
        return guess, f"~{fmt(guess)} (capped at {fmt(slot.get('cap_s'))} s, extrapolated)"
    text = fmt(value)
    if scenario == "pickup" and value is None and slot.get("pickup_missed"):
        return None, f"> {fmt(slot.get('pickup_cap_s'))} s (not picked up within the cap)"
    if slot.get("runs", 1) > 1 and isinstance(value, (int, float)) and not isinstance(value, bool):
        text += f" ⁽{slot['runs']}⁾"
    if scenario == "burst" and metric in CAPPED_TRAFFIC and slot.get("complete") is False:
        text += " †"
    return value, text


def sizes(medians: dict[str, Any], scenario: str) -> list[str]:
    found: set[str] = set()
    for systems in medians.get(scenario, {}).values():
        found.update(systems)
    return sorted(found, key=int)


def main_table(medians: dict[str, Any]) -> list[str]:
    lines = [
        f"| figure | N | {' | '.join(EMQ_PATHS)} | {REDBEAT} | {PERSISTENT} "
        "| emq→celery / redbeat | emq→celery-pipelined / redbeat "
        "| emq→celery / PersistentScheduler |",
        "|---|--:|" + "--:|" * (len(EMQ_PATHS) + 5),
    ]
    for scenario, metric, label, lower, path_specific in ROWS:
        arrow = "↓" if lower else "↑"
        for n in sizes(medians, scenario):
            if path_specific:
                cells = [cell(medians, scenario, path, n, metric) for path in EMQ_PATHS]
            else:
                shared = cell(medians, scenario, EMQ, n, metric)
                same = (shared[0], "(same)" if shared[1] != "—" else "—")
                cells = [shared] + [same] * (len(EMQ_PATHS) - 1)
            (ours, _), (piped, _) = cells[0], cells[1]
            texts = [text for _, text in cells]
            rb, rb_text = cell(medians, scenario, REDBEAT, n, metric)
            ps, ps_text = cell(medians, scenario, PERSISTENT, n, metric)
            if all(t == "—" for t in (*texts, rb_text, ps_text)):
                continue
            capped = " †" if rb_text.endswith("†") else ""
            rb_ratio = ratio(ours, rb) + capped
            rb_piped = ratio(piped, rb) + capped
            ps_ratio = ratio(ours, ps) + (" †" if ps_text.endswith("†") else "")
            lines.append(
                f"| {label} {arrow} | {int(n):,} | {' | '.join(texts)} "
                f"| {rb_text} | {ps_text} | {rb_ratio} | {rb_piped} | {ps_ratio} |"
            )
    return lines


def scale_table(medians: dict[str, Any]) -> list[str]:
    lines = [
        "| path | pumps | N | all N accepted (s) ↓ | occurrences/s ↑ | first message (ms) | "
        "messages | duplicates |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    rows = 0
    for scenario in sorted(k for k in medians if k.startswith("scale")):
        procs = scenario.removeprefix("scale")
        for system, by_n in medians[scenario].items():
            for n, slot in by_n.items():
                rows += 1
                lines.append(
                    f"| {system} | {procs} | {int(n):,} | {fmt(slot.get('drain_s'))} "
                    f"| {fmt(slot.get('rate'))} | {fmt(slot.get('first_ms'))} "
                    f"| {fmt(slot.get('messages'))} | {fmt(slot.get('duplicates'))} |"
                )
    return lines if rows else []


def baseline_table(medians: dict[str, Any]) -> list[str]:
    base = medians.get("baseline", {})
    if not base:
        return []
    lines = [
        "| baseline | N | occurrences/s ↑ | round trips/op | server commands/op |",
        "|---|--:|--:|--:|--:|",
    ]
    for system, by_n in base.items():
        for n, slot in by_n.items():
            lines.append(
                f"| {system} | {int(n):,} | {fmt(slot.get('rate'))} "
                f"| {fmt(slot.get('round_trips_per_occ'))} "
                f"| {fmt(slot.get('server_commands_per_occ'))} |"
            )
    # emq-bridge's burst rate at its largest N against the plain loops.
    lines.append("")
    lines.append(
        "| emq-bridge burst rate vs the plain loops | N | emq-bridge occ/s | loop occ/s | ratio |"
    )
    lines.append("|---|--:|--:|--:|--:|")
    for system, loop in (
        (EMQ_CELERY, "send_task loop"),
        (EMQ_CELERY_PIPELINED, "send_task loop"),
        (EMQ_DRAMATIQ, "enqueue loop"),
        (EMQ_PIPELINED, "enqueue loop"),
    ):
        loop_slot: dict[str, Any] = next(iter(base.get(loop, {}).values()), {})
        loop_rate = loop_slot.get("rate")
        for n in sizes(medians, "burst"):
            ours = medians.get("burst", {}).get(system, {}).get(n, {}).get("rate")
            if ours is not None:
                lines.append(
                    f"| {system} / {loop} | {int(n):,} | {fmt(ours)} | {fmt(loop_rate)} "
                    f"| {ratio(ours, loop_rate)} |"
                )
    return lines


def render(meta: dict[str, Any], medians: dict[str, Any]) -> str:
    m = meta.get("machine", {})
    out = [
        f"# emq-bridge bench — {meta.get('started', '')}",
        "",
        f"`{meta.get('command', '')}` — {m.get('nproc')} CPUs ({m.get('cpu')}), "
        f"{m.get('memory_gb')} GB, "
        f"{meta.get('server')}, Python {m.get('python')}, celery {m.get('celery')}, "
        f"celery-redbeat {m.get('celery-redbeat')}, dramatiq {m.get('dramatiq')}, "
        f"redis-py {m.get('redis-py')}; "
        f"load average at start {m.get('load_average_at_start')}; took {meta.get('seconds')} s.",
        "",
        f"emq-bridge dispatchers: {meta.get('dispatchers')}.",
        "",
        "Each figure is the median of the runs shown as ⁽ⁿ⁾ (one run when unmarked). "
        "↓ lower is better, ↑ higher is better; a ratio is emq-bridge / peer. "
        "Capped peer drains are stopped at the cap and extrapolated from their sending rate.",
        "",
        *main_table(medians),
        "",
        CAPPED_NOTE,
        "— not applicable: PersistentScheduler keeps its schedule in a local shelve file, not in "
        "Redis, and has no API to add a schedule at runtime.",
    ]
    scale = scale_table(medians)
    if scale:
        out += ["", "Scale-out: several pump processes drain one burst (2 CPUs).", "", *scale]
    base = baseline_table(medians)
    if base:
        out += ["", "Baselines on the same server.", "", *base]
    errors = [
        f"- {scenario} / {system} / N={n}: {slot['error']}"
        for scenario, systems in medians.items()
        for system, by_n in systems.items()
        for n, slot in by_n.items()
        if "error" in slot
    ]
    if errors:
        out += ["", "Failures:", "", *errors]
    late = [
        f"- {scenario} / {system} / N={n}: a scheduler was still starting at the due instant"
        for scenario, systems in medians.items()
        for system, by_n in systems.items()
        for n, slot in by_n.items()
        if slot.get("late_start")
    ]
    if late:
        out += ["", "Warnings (first-message figures include start-up time):", "", *late]
    return "\n".join(out) + "\n"
