"""Type-checked use of `nominal_slot`, as docs/cron.md's jitter example uses it (mypy --strict
runs over this file; it is not a test)."""

from __future__ import annotations

from emq_bridge import Cadence, Registration, Repeat, define
from emq_bridge.jitter import nominal_slot


def nominal_of_next_run(repeat: Repeat) -> int | None:
    repeat.upsert(
        "reports",
        "poll",
        definition=define(every="1h", jitter="10m", template={"task": "app.poll"}),
    )
    run: Registration | None = repeat.get("reports", "poll")
    if run is None or run.next_run_ms is None:
        return None
    cadence: Cadence = run.definition.cadence  # any cadence, jittered or not
    nominal: int = nominal_slot(cadence, run.next_run_ms)
    return nominal


def nominal_of_an_unjittered_slot() -> int:
    return nominal_slot(define(cron="0 * * * *").cadence, 1_893_456_000_000)
