"""What every command shares: the connection settings, the error boundary, logging."""

from __future__ import annotations

import logging
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import click
import redis
from click.core import ParameterSource

from ..errors import (
    ConfigError,
    CorruptRecord,
    EmqError,
    RegistryError,
    RegistryOutOfMemory,
    RegistryRestarted,
    RegistryUnavailable,
    UnknownRegistration,
)
from ..registry import Repeat
from ..shown import printable
from ..urls import client_from_url, redact_url, split_userinfo, url_secrets
from ..utf8 import check_utf8

__all__ = [
    "DEFAULT_REDIS_URL",
    "EXIT_SERVER",
    "REDIS_URL_ENV",
    "FiniteRange",
    "ServerError",
    "Settings",
    "SubcommandGroup",
    "UrlError",
    "UsageLine",
    "client_address",
    "client_location",
    "emq_errors",
    "given_as",
    "install_logging",
    "pass_settings",
    "redact_url",
    "refused_authentication",
    "usage_line",
    "utf8_option",
]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_URL_ENV = "REDIS_URL"
EXIT_SERVER = 3
"""Exit code when Redis is unreachable or refuses a command (1: bad input, 2: bad usage)."""

CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 30.0
# An error line is cut here: one line a terminal and a log collector still show whole.
MAX_ERROR_CHARS = 2000


class FiniteRange(click.FloatRange):
    """click's `FloatRange`, NaN refused too: every comparison with NaN is false, so a range
    alone lets `nan` through (infinity and `1e400` fail its bounds: give it a `max`)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number", param, ctx)
        return number


class ServerError(click.ClickException):
    """Redis could not be reached or refused a command."""

    exit_code = EXIT_SERVER


class UrlError(click.ClickException):
    """The Redis URL is malformed: bad usage (exit 2), told in one line without the usage text."""

    exit_code = 2


def _misread_userinfo(url: str) -> bool:
    """Return whether redis-py reads part of the user info as the host, path or query."""
    _, userinfo, _ = split_userinfo(url)
    return userinfo is not None and any(c in userinfo for c in "/?#")


MISREAD_USERINFO = (
    "redis-py read part of the URL's user info as the host, as it holds a '/', '?' or '#': "
    "write them in the password as %2F, %3F, %23"
)


@dataclass
class Settings:
    """The group's options, and the registry client opened on first use."""

    redis_url: str
    prefix: str
    verbosity: int = 0
    # The variable that gave an empty URL (`REDIS_URL=`), which click reads as unset: refused
    # where the URL is used (`client`, `given_as`), so a missing secret never means localhost.
    empty_env: str | None = None
    _client: Any = field(default=None, repr=False)
    _repeat: Repeat | None = field(default=None, repr=False)
    # A command may wait less for an answer (`health`, a probe with a timeout of its own);
    # a `socket_timeout` in the URL still wins.
    socket_timeout_s: float = SOCKET_TIMEOUT_S

    @property
    def where(self) -> str:
        """Return the server and prefix for messages, without credentials."""
        return f"{redact_url(self.redis_url)} (prefix {self.prefix!r})"

    def client(self) -> Any:
        """Return the Redis client, creating it on first use (closed when the command ends)."""
        if self._client is None:
            self.check_env()
            try:
                self._client = client_from_url(
                    self.redis_url,
                    socket_connect_timeout=CONNECT_TIMEOUT_S,
                    socket_timeout=self.socket_timeout_s,
                )
            except ConfigError as exc:  # its message never holds the URL
                raise UrlError(
                    f"Invalid value for '--redis-url' / REDIS_URL: {exc} (see 'emq-bridge --help')"
                ) from exc
            click.get_current_context().call_on_close(self.close)
        return self._client

    def check_env(self) -> None:
        """Raise `UrlError` (exit 2) if the URL's variable is set but empty and no
        `--redis-url` was given."""
        if self.empty_env is not None:
            raise UrlError(
                f"{self.empty_env} is set but empty: give --redis-url, or unset {self.empty_env} "
                f"to use {DEFAULT_REDIS_URL} (see 'emq-bridge --help')"
            )

    def repeat(self) -> Repeat:
        """Return the registry on the configured server and prefix."""
        if self._repeat is None:
            self._repeat = Repeat(self.client(), self.prefix)
        return self._repeat

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client, self._repeat = None, None


pass_settings = click.make_pass_decorator(Settings)


def utf8_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Return an option's text that Redis is sent (a key name, a prefix); bad usage (exit 2)
    when it is not valid UTF-8, as an invalid byte on a command line makes it, since redis-py
    would fail to encode it only at the first command."""
    if value is None:
        return None
    try:
        return check_utf8(value, "the value")
    except EmqError as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc


def given_as(name: str) -> str | None:
    """Return how the group's option `name` was given, or None if it was left to its default.

    That is its flag (`--redis-url`) or its environment variable (`$REDIS_URL`).
    """
    root = click.get_current_context().find_root()
    settings = root.find_object(Settings)
    if name == "redis_url" and settings is not None:
        settings.check_env()  # "not given" would mean the app's or the default server
    source = root.get_parameter_source(name)
    param = next(p for p in root.command.params if p.name == name)
    if source is ParameterSource.COMMANDLINE:
        return param.opts[-1]
    if source is ParameterSource.ENVIRONMENT:
        return f"${param.envvar}" if isinstance(param.envvar, str) else "the environment"
    return None


@contextmanager
def emq_errors(ctx: click.Context) -> Iterator[None]:
    """Map emq-bridge's and redis-py's exceptions to click exceptions: the CLI's one boundary.

    Bad input exits 1, an unreachable or failing server exits 3; the reason is one line
    on stderr, and never holds the credentials of the Redis URL.
    """
    try:
        yield
    except CorruptRecord as exc:  # a record edited by hand: bad input (exit 1), as documented
        raise click.ClickException(_clean(str(exc), ctx.find_object(Settings))) from exc
    except (RegistryUnavailable, RegistryError, redis.RedisError) as exc:
        settings = ctx.find_object(Settings)
        where = settings.where if settings is not None else "the server"
        cause = exc.__cause__ if isinstance(exc, RegistryUnavailable) else exc
        if isinstance(cause, redis.AuthenticationError):  # a ConnectionError to redis-py
            raise ServerError(_clean(refused_authentication(where, cause), settings)) from exc
        if isinstance(exc, RegistryOutOfMemory):  # reachable: it refuses writes
            raise ServerError(_clean(f"Redis at {where} refused: {exc}", settings)) from exc
        if isinstance(exc, RegistryRestarted):
            raise ServerError(_clean(f"Redis at {where} {exc}", settings)) from exc
        if isinstance(exc, (RegistryUnavailable, redis.ConnectionError, redis.TimeoutError)):
            detail: object = cause or exc
            if settings is not None and _misread_userinfo(settings.redis_url):
                detail = MISREAD_USERINFO  # redis-py's message names a "host" cut from the password
            message = f"cannot reach Redis at {where}: {detail}"
            raise ServerError(_clean(message, settings)) from exc
        raise ServerError(_clean(f"Redis at {where} refused: {exc}", settings)) from exc
    except UnknownRegistration as exc:  # say where it was looked for: another server's?
        settings = ctx.find_object(Settings)
        at = f" at {settings.where}" if settings is not None else ""
        raise click.ClickException(_clean(f"{exc}{at}", settings)) from exc
    except EmqError as exc:
        raise click.ClickException(_clean(str(exc), ctx.find_object(Settings))) from exc
    except click.exceptions.NoArgsIsHelpError:
        raise  # a command given no arguments shows its help, as click does
    except click.UsageError as exc:
        raise usage_line(exc, ctx.find_object(Settings), ctx) from exc


def refused_authentication(where: str, exc: redis.AuthenticationError) -> str:
    """The line for a server that refused the credentials sent, or wants some not sent.

    The server's reply to a client that sent none is about `HELLO` (RESP3) or
    "Authentication required." (RESP2, `NOAUTH`): said here as what to do.
    """
    reply = str(exc)
    if reply.startswith(_NO_CREDENTIALS_SENT):
        reason = (
            "it requires a password and none was given "
            "(redis://:PASSWORD@host:port/db, or redis://USER:PASSWORD@... for an ACL user)"
        )
    else:  # WRONGPASS, a disabled user, a password sent to a server that has none
        reason = f"check the user and password: {reply}"
    return f"Redis refused authentication at {where}: {reason}"


# redis-py's `AuthenticationError` messages when no credentials were sent (NOAUTH).
_NO_CREDENTIALS_SENT = ("Authentication required", "HELLO must be called with the client already")


def usage_line(
    exc: click.UsageError, settings: Settings | None = None, parent: click.Context | None = None
) -> UsageLine:
    """`exc` as one line (click's own form adds the usage and a hint on lines of their own).

    The hint names the command's help. Click's parser raises some errors (an option given no
    value) with no context: then the command is the one `parent` (a group's context) was
    invoking."""
    if exc.ctx is not None:
        path = exc.ctx.command_path.split()[1:]
    elif parent is not None and parent.invoked_subcommand is not None:
        path = [*parent.command_path.split()[1:], parent.invoked_subcommand]
    else:
        path = []
    where = " ".join(["emq-bridge", *path])  # the console script's name, however invoked
    return UsageLine(_clean(f"{exc.format_message()} (see '{where} --help')", settings))


class SubcommandGroup(click.Group):
    """A group of commands under the top one (`import redbeat`): a usage error click's
    parser raises with no context (an option given no value) names this group's command's
    help, which the top group's boundary cannot see."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            if exc.ctx is not None:
                raise
            raise usage_line(exc, ctx.find_object(Settings), ctx) from exc


class UsageLine(click.ClickException):
    """Bad usage told in one line on stderr (exit 2, click's code for it)."""

    exit_code = 2


# redis-py's Sentinel names each sentinel it could not reach by its client's whole repr
# (`<redis.client.Redis(<redis.connection.ConnectionPool(<...Connection(db=0,...)>)>)>`,
# about 1,200 characters of connection options): the line says its address instead.
_CLIENT_REPR = re.compile(r"<redis\.client\.Redis\(<redis\.connection\.\w+\((.*?)\)>\)>\)>")
_HOST_PORT = re.compile(r"\bhost=([^,()<>]+),port=(\d+)")


def _client_where(match: re.Match[str]) -> str:
    found = _HOST_PORT.search(match.group(1))
    return "a client" if found is None else f"sentinel {found.group(1)}:{found.group(2)}"


def _clean(message: str, settings: Settings | None) -> str:
    """Return `message` on one line, with the URL's secrets (if any) blanked out, and cut
    at `MAX_ERROR_CHARS` (a message quoting a huge input is cut where it is raised, this is
    the last guard)."""
    if settings is not None:
        for secret in url_secrets(settings.redis_url):
            # A user named as its prefix (one per tenant, "redis://tenantA@..."): the prefix
            # is in every key name, no secret, and blanked it would hide where the error is.
            if secret != settings.prefix:
                message = message.replace(secret, "***")
    message = _CLIENT_REPR.sub(_client_where, message)
    line = printable(" ".join(message.split()))
    if len(line) > MAX_ERROR_CHARS:
        line = f"{line[:MAX_ERROR_CHARS]}… ({len(line) - MAX_ERROR_CHARS} more characters)"
    return line


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Write to whatever `sys.stderr` is at the time of the record (test runners swap it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def install_logging(verbosity: int, default: int = logging.WARNING) -> logging.Handler:
    """Send `emq_bridge.*` records to stderr: `default` level, `-v` INFO, `-vv` DEBUG, `-q` ERROR.

    The library never installs handlers; the command line does, and removes it on exit.
    """
    if verbosity < 0:
        level = logging.ERROR
    elif verbosity == 0:
        level = default
    else:
        level = logging.INFO if verbosity == 1 else logging.DEBUG
    handler = _Handler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("emq_bridge")
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler


def remove_logging(handler: logging.Handler) -> None:
    logger = logging.getLogger("emq_bridge")
    logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)


def client_location(client: Any) -> tuple[object, ...]:
    """Return what tells two Redis clients' servers apart: socket or host, port, database."""
    options = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    db = int(options.get("db") or 0)
    if options.get("path"):
        return ("unix", str(options["path"]), db)
    if "host" in options:
        return ("tcp", str(options["host"]).lower(), int(options.get("port") or 6379), db)
    return ("client", id(client))  # a cluster, a sentinel pool: only the same client matches


def client_address(client: Any) -> str:
    """Return where a Redis client connects, as a URL without credentials."""
    pool = getattr(client, "connection_pool", None)
    location = client_location(client)
    if location[0] == "unix":
        return f"unix://{location[1]}" + (f"?db={location[2]}" if location[2] else "")
    if location[0] == "tcp":
        tls = isinstance(pool, redis.ConnectionPool) and issubclass(
            pool.connection_class, redis.SSLConnection
        )
        host = f"[{location[1]}]" if ":" in str(location[1]) else location[1]  # IPv6
        return f"{'rediss' if tls else 'redis'}://{host}:{location[2]}/{location[3]}"
    return f"the app's {type(client).__name__}"
