"""The `emq-bridge` command line (also `python -m emq_bridge`).

Exit codes: 0 success, 1 bad input (an invalid file, an unknown schedule) or output that
cannot be written, 2 bad usage, 3 Redis unreachable or refusing a command, 130 a one-shot
command interrupted by SIGINT (Ctrl-C). `pump` and `web` stop gracefully on SIGTERM or
SIGINT and exit 0; a one-shot command is killed by SIGTERM, as Unix commands are (143).
Errors are one line on stderr, and the credentials of the Redis URL are never printed.
Output is UTF-8 whatever the locale (a TOML or JSON document is UTF-8 by definition).
"""

from __future__ import annotations

import codecs
import io
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click
from click.core import ParameterSource

from .. import __version__
from ..errors import InvalidName
from ..keys import DEFAULT_PREFIX, validate_prefix
from ..utf8 import from_command_line
from .backfill import COMMANDS as BACKFILL_COMMANDS
from .context import (
    DEFAULT_REDIS_URL,
    REDIS_URL_ENV,
    Settings,
    emq_errors,
    install_logging,
    remove_logging,
    usage_line,
)
from .health import COMMANDS as HEALTH_COMMANDS
from .migrate import COMMANDS as MIGRATE_COMMANDS
from .operations import COMMANDS as OPERATION_COMMANDS
from .schedules import COMMANDS as SCHEDULE_COMMANDS
from .web import COMMANDS as WEB_COMMANDS

__all__ = ["EXIT_INTERRUPTED", "cli", "main"]

EXIT_INTERRUPTED = 130
"""Exit code of a command interrupted by SIGINT (Ctrl-C): 128 + 2, the shell's convention."""


class Interrupted(click.ClickException):
    """A command stopped by SIGINT: one line on stderr, exit 130 (click says `Aborted!`, exit 1,
    which is this CLI's code for bad input)."""

    exit_code = EXIT_INTERRUPTED

    def show(self, file: Any = None) -> None:
        if sys.stderr is not None and sys.stderr.isatty():
            click.echo(err=True)  # end the line of the terminal's `^C` echo
        super().show(file)


class EmqGroup(click.Group):
    """A group that maps emq-bridge's errors to click's at one boundary (see `emq_errors`)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with emq_errors(ctx):
                return super().invoke(ctx)
        except KeyboardInterrupt as exc:  # SIGINT: `pump` and `web` handle theirs, and stop
            raise Interrupted("interrupted (SIGINT)") from exc

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        # The group's own options (--redis-url, --prefix) are read here, before `invoke`.
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise usage_line(exc) from exc


def _prefix(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return validate_prefix(value)
    except InvalidName as exc:
        raise click.BadParameter(str(exc)) from exc


@click.group(
    cls=EmqGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.option(
    "--redis-url",
    envvar=REDIS_URL_ENV,
    default=DEFAULT_REDIS_URL,
    show_default=True,
    show_envvar=True,
    metavar="URL",
    help="Redis server holding the registry: redis://, rediss://, unix://,"
    " redis+sentinel:// or redis+cluster:// (rediss+... for TLS).",
)
@click.option(
    "--prefix",
    default=DEFAULT_PREFIX,
    show_default=True,
    callback=_prefix,
    help="Key prefix of the registry (keys are <prefix>:{queue}:repeat...).",
)
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-v info, -vv debug).")
@click.option("-q", "--quiet", is_flag=True, help="Log errors only.")
@click.version_option(__version__, prog_name="emq-bridge")
@click.pass_context
def cli(ctx: click.Context, redis_url: str, prefix: str, verbose: int, quiet: bool) -> None:
    """Recurring schedules in Redis, pumped into Celery or Dramatiq.

    Every command but `demo` works on the registry at --redis-url (or $REDIS_URL;
    default redis://127.0.0.1:6379/0) under --prefix.

    \b
    Examples:
      emq-bridge list
      emq-bridge --redis-url redis://cache:6379/1 list reports --json
      emq-bridge sync schedules.toml --dry-run
      emq-bridge add reports digest --task app.send_digest --every 15m
      emq-bridge next reports nightly -n 10
      emq-bridge history reports digest
      emq-bridge pump --dramatiq app.tasks
      emq-bridge health --queue reports --max-lag 2m
      emq-bridge backfill reports nightly --from 2026-11-01T00:00Z --to 2026-11-08T00:00Z --dry-run
      emq-bridge import redbeat --from redis://old-broker:6379/0 --dry-run
      emq-bridge export --format toml > schedules.toml
      emq-bridge web --bind 127.0.0.1:8000
      emq-bridge demo
    """
    verbosity = -1 if quiet else verbose
    # click reads an empty variable as unset (the default, localhost): a `REDIS_URL=$SECRET`
    # whose secret is missing must not act on another server. Refused when the URL is used.
    empty_env = (
        REDIS_URL_ENV
        if os.environ.get(REDIS_URL_ENV) == ""
        and ctx.get_parameter_source("redis_url") is ParameterSource.DEFAULT
        else None
    )
    ctx.obj = Settings(redis_url=redis_url, prefix=prefix, verbosity=verbosity, empty_env=empty_env)
    if not _colour_wanted():  # click.echo then strips the colours of every command's output
        ctx.color = False
    handler = install_logging(verbosity)
    ctx.call_on_close(lambda: remove_logging(handler))


for _command in (
    *SCHEDULE_COMMANDS,
    *BACKFILL_COMMANDS,
    *OPERATION_COMMANDS,
    *WEB_COMMANDS,
    *HEALTH_COMMANDS,
    *MIGRATE_COMMANDS,
):
    cli.add_command(_command)


def _colour_wanted() -> bool:
    """False when `NO_COLOR` is set to a non-empty value (https://no-color.org) or the terminal
    is `TERM=dumb`; click strips colours from what is not a terminal anyway."""
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class CommandLineText(click.types.StringParamType):
    """click's text type, with the UTF-8 an argument was given in recovered in a locale that
    cannot decode it (`LC_ALL=C` without Python's UTF-8 mode: `é` arrives as two surrogate
    escapes, which every check of the text sent to Redis would refuse as invalid UTF-8).
    Paths (`click.Path`) keep the escapes, which `open` needs."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = super().convert(value, param, ctx)
        return from_command_line(text) if isinstance(text, str) else text


def _recover_utf8_text(command: click.Command) -> None:
    """Give every text parameter of `command` and its subcommands `CommandLineText`."""
    for param in command.params:
        if type(param.type) is click.types.StringParamType:
            param.type = CommandLineText()
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _recover_utf8_text(sub)


_recover_utf8_text(cli)


def _utf8_streams() -> None:
    """Make stdout and stderr UTF-8 whatever the locale, as Python's UTF-8 mode does (the
    default from Python 3.15): an export or `--json` is a UTF-8 document, and a character
    the locale's encoding lacks (`☃` in a Latin-1 or C locale) is no UnicodeEncodeError."""
    for stream, errors in ((sys.stdout, "surrogateescape"), (sys.stderr, "backslashreplace")):
        if not isinstance(stream, io.TextIOWrapper):
            continue  # closed, or replaced by a caller: theirs to choose
        try:
            if codecs.lookup(stream.encoding).name != "utf-8":
                stream.reconfigure(encoding="utf-8", errors=errors)
        except (LookupError, ValueError, OSError):  # an unknown codec, a closed stream
            continue


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command line (the `emq-bridge` console script) and exit with its status."""
    _utf8_streams()
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="emq-bridge")
    except OSError as exc:
        # Every file a command opens reports its own OSError, naming it, where it is opened
        # (`export -o`, a schedule file): one that reaches here unnamed is a failed write to
        # stdout (a full disk, /dev/full). click already ends a closed pipe quietly, exit 1.
        if exc.filename is not None:
            raise
        _unwritable_stdout(exc)


def _unwritable_stdout(exc: OSError) -> NoReturn:
    """Say in one line on stderr that stdout cannot be written, and exit 1, as `export -o`
    does for its file."""
    click.echo(f"Error: cannot write to stdout: {exc.strerror or exc}", err=True)
    sys.exit(1)  # click's code for a closed pipe, and `export -o`'s for its file
