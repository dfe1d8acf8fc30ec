"""What every command shares: the connection settings, the error boundary, logging."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import click
import redis

from ..errors import ConfigError, EmqError, RegistryError, RegistryUnavailable
from ..registry import Repeat, client_from_url

__all__ = [
    "DEFAULT_REDIS_URL",
    "EXIT_SERVER",
    "ServerError",
    "Settings",
    "emq_errors",
    "install_logging",
    "pass_settings",
    "redact_url",
]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
EXIT_SERVER = 3
"""Exit code when Redis is unreachable or refuses a command (1: bad input, 2: bad usage)."""

CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 30.0
_SECRET_QUERY_KEYS = ("password", "pass", "pw", "secret", "token")


class ServerError(click.ClickException):
    """Redis could not be reached or refused a command."""

    exit_code = EXIT_SERVER


def redact_url(url: str) -> str:
    """Return `url` with any password (in the user info or the query) replaced by `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, has_password, _ = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if has_password else f"***@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, "***" if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in pairs], safe="*"
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    shown = urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    if not netloc and url.startswith(f"{parts.scheme}://"):  # keep unix:///path as written
        shown = f"{parts.scheme}://" + shown[len(parts.scheme) + 1 :]
    return shown


@dataclass
class Settings:
    """The group's options, and the registry client opened on first use."""

    redis_url: str
    prefix: str
    verbosity: int = 0
    _client: Any = field(default=None, repr=False)
    _repeat: Repeat | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        """Return the server and prefix for messages, without credentials."""
        return f"{redact_url(self.redis_url)} (prefix {self.prefix!r})"

    def client(self) -> Any:
        """Return the Redis client, creating it on first use (closed when the command ends)."""
        if self._client is None:
            try:
                self._client = client_from_url(
                    self.redis_url,
                    socket_connect_timeout=CONNECT_TIMEOUT_S,
                    socket_timeout=SOCKET_TIMEOUT_S,
                )
            except ConfigError as exc:  # its message never holds the URL
                raise click.BadParameter(str(exc), param_hint="'--redis-url' / REDIS_URL") from exc
            click.get_current_context().call_on_close(self.close)
        return self._client

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


@contextmanager
def emq_errors(ctx: click.Context) -> Iterator[None]:
    """Map emq-bridge's and redis-py's exceptions to click exceptions: the CLI's one boundary.

    Bad input exits 1, an unreachable or failing server exits 3; the reason is one line
    on stderr, and never holds the credentials of the Redis URL.
    """
    try:
        yield
    except (RegistryUnavailable, RegistryError, redis.RedisError) as exc:
        settings = ctx.find_object(Settings)
        where = settings.where if settings is not None else "the server"
        if isinstance(exc, (RegistryUnavailable, redis.ConnectionError, redis.TimeoutError)):
            cause = exc.__cause__ if isinstance(exc, RegistryUnavailable) else exc
            message = f"cannot reach Redis at {where}: {cause or exc}"
            raise ServerError(_clean(message, settings)) from exc
        raise ServerError(_clean(f"Redis at {where} refused: {exc}", settings)) from exc
    except EmqError as exc:
        raise click.ClickException(_clean(str(exc), ctx.find_object(Settings))) from exc


def _clean(message: str, settings: Settings | None) -> str:
    """Return `message` on one line, with the URL's secrets (if any) blanked out."""
    if settings is not None:
        for secret in _secrets(settings.redis_url):
            message = message.replace(secret, "***")
    return " ".join(message.split())


def _secrets(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
        found = [parts.password or ""]
        if "@" in parts.netloc and not parts.password:
            found.append(parts.username or "")  # "redis://secret@host" puts it in the user part
        found += [v for k, v in parse_qsl(parts.query) if k.lower() in _SECRET_QUERY_KEYS]
    except ValueError:
        return []
    return [s for s in found if len(s) >= 3]


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
