"""Commands on the pumps: health (a probe) and pumps (who is alive)."""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from typing import IO, Any

import click

from ..cadence import parse_every
from ..errors import ScheduleError
from ..health import Health, check, unserved
from ..registry import Registration
from .context import ServerError, Settings, pass_settings
from .render import relative, table, to_json

__all__ = ["COMMANDS", "EXIT_UNHEALTHY", "UNSERVED", "UNSERVED_TEXT", "flagged_state"]

EXIT_UNHEALTHY = 4
"""Exit code of `health` when the registry is not served (0 healthy, 1 bad input, 2 bad
usage, 3 Redis unreachable or refusing a read)."""


class Unhealthy(click.ClickException):
    """The registry is not served: one line on stderr, exit 4."""

    exit_code = EXIT_UNHEALTHY

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"unhealthy: {self.format_message()}", err=True)


# A duration that is zero: "0", "0.0", "0s", "0h 0m" (refused as not positive, not as no
# duration at all).
_ZERO = re.compile(r"(?:0+(?:\.0+)?\s*(?:ms|s|m|h|d|w)?\s*)+", re.ASCII | re.IGNORECASE)


def _lag(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """Return a positive duration in ms: seconds (`90`) or a string like `60s`, `5m`, `1h`."""
    text = value.strip()
    unsigned = text.removeprefix("-").strip()  # "-5": a duration, but not a positive one
    if _ZERO.fullmatch(unsigned):
        raise click.BadParameter(f"must be positive, got {value!r}")
    try:
        lag_ms = parse_every(unsigned)
    except ScheduleError as exc:
        # A duration out of range ("0.0001": under 1 ms) says its bound, as `every` does.
        reason = str(exc).removeprefix("every ")
        if reason.startswith("must be "):
            if unsigned != text:
                reason = f"must be positive, got {value!r}"
            raise click.BadParameter(reason) from exc
        raise click.BadParameter(
            f"{value!r} is not a duration: give seconds, or a string like 30s, 5m, 1h"
        ) from exc
    if unsigned != text:
        raise click.BadParameter(f"must be positive, got {value!r}")
    return lag_ms


UNSERVED = "unserved"
"""The state `list` gives a schedule whose next run passed while no live pump serves its
queue (`health.unserved`): one word, as the other states; `show` says it in full."""
UNSERVED_TEXT = "unserved: overdue, and no live pump serves its queue (emq-bridge pumps)"


def flagged_state(registration: Registration, now_ms: int, served: set[str], text: str) -> str:
    """Return `text` (the state as shown), or `UNSERVED` when nothing will fire it."""
    return UNSERVED if unserved(registration, now_ms, served) else text


# How long `health` waits for an answer: a hung server (no answer, no refusal) exits 3 in
# time for a probe's own timeout, not after the commands' 30 s.
HEALTH_TIMEOUT_S = 5.0


@click.command("health")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="QUEUE",
    help="Check this queue (repeat the option for several); default: every queue.",
)
@click.option(
    "--max-lag",
    default="60s",
    callback=_lag,
    metavar="DURATION",
    show_default=True,
    help="How long a schedule's next run may have passed before the queue is unhealthy.",
)
@click.option(
    "--this-host",
    is_flag=True,
    help="Count only the pumps of this host (its hostname): the liveness probe of one pump "
    "where several serve a queue.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was found as JSON (stdout).")
@pass_settings
def health_command(
    settings: Settings, queues: tuple[str, ...], max_lag: int, this_host: bool, as_json: bool
) -> None:
    """Exit 0 if every queue has a live pump and nothing is overdue; else 4, and say why.

    A queue is healthy when at least one pump (the CLI pump, a `celery beat -S emq`, a
    Dramatiq worker with RecurringMiddleware) wrote its heartbeat lately, and no active
    schedule's next run passed more than --max-lag ago on the Redis server's clock. Without
    --queue every queue with a registry under the prefix is checked (and none at all is
    unhealthy); a queue named with --queue that has no registry (no schedule, not even a
    paused one) is unhealthy too. One line tells the result: on stdout when healthy, on
    stderr when not. Exit codes: 0 healthy, 4 unhealthy, 1 bad input (a bad queue name),
    2 bad usage, 3 Redis unreachable or refusing a read (a key of the wrong type, named),
    out of memory (refusing writes: the pumps' heartbeats), or no answer within 5 s (a
    hung server). Made for a Kubernetes exec probe (a
    timeoutSeconds of 10 covers it). With --this-host only the pumps of the host the command
    runs on count: where several pumps serve a queue, another's heartbeat would keep the
    probe of a stuck one passing.

    \b
    Examples:
      emq-bridge health
      emq-bridge health --queue reports --max-lag 2m
      emq-bridge health --queue reports --this-host
    """
    settings.socket_timeout_s = HEALTH_TIMEOUT_S
    repeat = settings.repeat()
    host = socket.gethostname() if this_host else None
    found = check(repeat, list(queues) if queues else None, max_lag_ms=max_lag, host=host)
    if as_json:
        click.echo(to_json(_health_json(found)))
    if not found.ok and found.out_of_memory:
        raise ServerError(found.reason)  # Redis refusing writes: exit 3, as refusing a read
    if not found.ok:
        raise Unhealthy(found.reason)
    if not as_json:
        click.echo(found.reason)


def _health_json(found: Health) -> dict[str, Any]:
    return {
        "ok": found.ok,
        "reason": found.reason,
        "now_ms": found.now_ms,
        "max_lag_ms": found.max_lag_ms,
        "eviction_policy": found.eviction_policy,
        "out_of_memory": found.out_of_memory,
        "queues": [
            {
                "queue": item.queue,
                "pumps": [p.id for p in item.pumps],
                "earliest": item.earliest_name,
                "earliest_ms": item.earliest_ms,
                "overdue_ms": item.overdue_ms(found.now_ms),
            }
            for item in found.queues
        ],
    }


@click.command("pumps")
@click.argument("queue", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@pass_settings
def pumps_command(settings: Settings, queue: str | None, as_json: bool) -> None:
    """List the live pumps: where they run, what they serve, their last tick.

    A pump writes its heartbeat every few seconds while it runs (the CLI pump, a `celery
    beat -S emq`, the pump thread of a Dramatiq worker) and removes it when it stops; one
    that died is gone once its heartbeat expires (30 s by default). Without QUEUE, the pumps
    of every queue under the prefix. Times are relative to the Redis server's clock.

    \b
    Examples:
      emq-bridge pumps
      emq-bridge pumps reports --json
    """
    repeat = settings.repeat()
    # `broken`: a pump table of another type fails (exit 3, as in `health` and `list`)
    # rather than being left out, which would say that no pump runs.
    pumps = repeat.pumps([queue] if queue is not None else None, broken=True)
    if as_json:
        click.echo(to_json([p.to_dict() for p in pumps]))
        return
    if not pumps:
        where = f"queue {queue!r}" if queue is not None else f"prefix {settings.prefix!r}"
        click.echo(f"no live pump serves {where}", err=True)
        return
    now_ms = repeat.server_time_ms()
    rows = [
        [
            p.id,
            p.role,
            _queues_cell(p.queues),
            "never" if p.tick_ms is None else relative(p.tick_ms, now_ms),
            relative(p.started_ms, now_ms),
            str(p.dispatched),
            p.version,
        ]
        for p in pumps
    ]
    header = ["id", "role", "queues", "last tick", "started", "dispatched", "version"]
    click.echo(table(header, rows))


# How much of a pump's queue list the table shows (`--json` has it whole): a pump of a
# thousand queues would make its row a line of many thousand characters.
QUEUES_CELL_CHARS = 60


def _queues_cell(queues: Sequence[str]) -> str:
    """`queues` joined with commas, cut after `QUEUES_CELL_CHARS` with how many more."""
    joined = ",".join(queues)
    if len(joined) <= QUEUES_CELL_CHARS:
        return joined
    shown = [
        queues[0] if len(queues[0]) <= QUEUES_CELL_CHARS else queues[0][:QUEUES_CELL_CHARS] + "…"
    ]
    for queue in queues[1:]:
        if len(",".join([*shown, queue])) > QUEUES_CELL_CHARS:
            break
        shown.append(queue)
    more = len(queues) - len(shown)
    cut = ",".join(shown) + (f",… (+{more:,} more)" if more else "")
    return joined if len(joined) <= len(cut) else cut


COMMANDS = (health_command, pumps_command)
