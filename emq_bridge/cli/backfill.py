"""`emq-bridge backfill`: send the past slots of a schedule (backfill.py)."""

from __future__ import annotations

from zoneinfo import ZoneInfo

import click

from ..backfill import DEFAULT_RATE, check_rate
from ..errors import CorruptRecord, ScheduleError, UnknownRegistration
from .context import Settings, pass_settings
from .render import absolute, to_json, zone_of

__all__ = ["COMMANDS"]

# Slots listed by the text output; --json lists them all.
SHOWN = 20


def _rate(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """Return `value` if `check_rate` takes it; bad usage (exit 2) otherwise, naming it in
    full (`1000001`, not `1e+06`)."""
    try:
        return check_rate(value)
    except ScheduleError:
        raise click.BadParameter(
            f"{value:.15g} is neither 0 nor from 1/86400 (one a day) to 1000000 a second"
        ) from None


@click.command("backfill")
@click.argument("queue")
@click.argument("name")
@click.option(
    "--from", "start", required=True, metavar="DATETIME", help="First instant (ISO 8601)."
)
@click.option(
    "--to", "end", required=True, metavar="DATETIME", help="Last instant, inclusive (ISO 8601)."
)
@click.option(
    "--rate",
    type=float,
    callback=_rate,
    default=DEFAULT_RATE,
    show_default=True,
    help="Occurrences sent per second: 0 (as fast as the pumps go), or 1/86400 (one a day) "
    "to 1000000.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be sent; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@pass_settings
def backfill_command(
    settings: Settings,
    queue: str,
    name: str,
    start: str,
    end: str,
    rate: float,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Send every slot of a past range that the live schedule did not send.

    Each slot goes out once, with the occurrence id the live schedule gives it, marked as a
    backfill (Celery header and Dramatiq option emq_backfill). Slots the live schedule
    fired, slots an earlier backfill sent, slots at or after the schedule's next run and
    slots outside its bounds (before --start-at, after --end-at) are skipped, in one atomic
    step; a schedule with a --limit is not backfilled. The running pumps send what is
    queued, --rate a second.

    \b
    Examples:
      emq-bridge backfill reports nightly --from 2026-03-01T00:00:00Z --to 2026-03-08T00:00:00Z
      emq-bridge backfill reports digest --from 2026-03-29T00:00+02:00 \\
          --to 2026-03-29T12:00+02:00 --dry-run
    """
    repeat = settings.repeat()
    try:
        result = repeat.backfill(queue, name, start, end, rate=rate, dry_run=dry_run)
    except UnknownRegistration:
        raise  # `emq_errors` says it, and where it looked
    except KeyError as exc:
        raise click.ClickException(str(exc.args[0])) from None
    except CorruptRecord as exc:  # bad input (exit 1), not a server refusing a command
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            to_json(
                {
                    "queued_ms": result.queued,
                    "live": result.live,
                    "done": result.done,
                    "ahead": result.ahead,
                    "outside": result.outside,
                    "dry_run": result.dry_run,
                    "spacing_ms": result.spacing_ms,
                }
            )
        )
        return
    registration = repeat.get(queue, name)
    zone = zone_of(registration.definition.cadence) if registration else ZoneInfo("UTC")
    verb = "would queue" if dry_run else "queued"
    outside = f", {result.outside} outside its bounds" if result.outside else ""
    paused = ""
    if result.ahead and registration is not None and registration.paused:
        # The live schedule sends nothing while paused: say what does send those slots.
        paused = (
            " (it is paused: `resume --catchup` hands them to its misfire policy, or "
            "backfill them again once it is resumed)"
        )
    click.echo(
        f"{verb} {len(result.queued)} slot(s) of {queue}/{name}; skipped {result.live} fired "
        f"live, {result.done} backfilled before, {result.ahead} left to the live schedule"
        f"{paused}{outside}"
    )
    for ms in result.queued[:SHOWN]:
        click.echo(f"  {absolute(ms, zone)}")
    if len(result.queued) > SHOWN:
        click.echo(f"  ... and {len(result.queued) - SHOWN} more (--json lists them all)")


COMMANDS = (backfill_command,)
