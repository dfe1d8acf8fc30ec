"""`emq-bridge web`: serve the web view (`emq_bridge.web.app`) with uvicorn."""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import click

from ..config import read_bounded
from ..shown import clipped
from ..utf8 import is_utf8
from .context import Settings, pass_settings

__all__ = ["COMMANDS", "parse_bind"]

TOKEN_ENV = "EMQ_BRIDGE_WEB_TOKEN"

# How long a page waits for Redis before it answers 503.
WEB_TIMEOUT_S = 5.0
# The largest --token-file read: a token is a line, not a file's worth (nor /dev/zero).
MAX_TOKEN_FILE_BYTES = 64 * 2**10


def parse_bind(value: str) -> tuple[str, int]:
    """Return (host, port) of `HOST:PORT` (`[::1]:8000` for IPv6). ValueError if malformed."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"expected HOST:PORT, such as 127.0.0.1:8000, not {clipped(value)}")
    digits = port_text.lstrip("0")
    port = int(digits or "0") if len(digits) <= 5 else 0  # 5000 digits are no int to read
    if not 1 <= port <= 65535:
        given = port_text if len(port_text) <= 20 else f"a {len(port_text)}-digit number"
        raise ValueError(f"the port must be between 1 and 65535, not {given}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:  # what the socket does with the host: a lone surrogate (invalid UTF-8) cannot be
        host.encode("idna")  # sent to the resolver, nor a label over 63 characters
    except UnicodeError:
        fits = False
    else:
        fits = host.isprintable() and not any(char.isspace() for char in host)
    if fits and host.isascii() and host.replace(".", "").isdigit():  # an IPv4 address:
        try:  # checked as the resolver reads one (127.1 too), with no name server asked
            socket.inet_aton(host)
        except OSError:
            fits = False
    if not fits:
        raise ValueError(f"the host {clipped(host)} is not an IP address or a host name")
    return host, port


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bind(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    try:
        host, port = parse_bind(value)
        # Resolved now, as the listening socket will: a host this machine cannot resolve
        # (`999.0.0.1`) is bad usage, said before Redis is asked.
        socket.getaddrinfo(host, port, _family(host), socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    except OSError as exc:  # socket.gaierror: its errno is the resolver's, not the system's
        reason = exc.strerror or str(exc)
        raise click.BadParameter(f"cannot resolve the host {clipped(host)}: {reason}") from exc
    return host, port


def _read_token(token_file: Path | None) -> str | None:
    """The write token: from --token-file, else $EMQ_BRIDGE_WEB_TOKEN, else none (read-only).

    A token given is checked, surrounding whitespace dropped: an empty or blank file, or the
    variable set to an empty or blank value (most often a secret that failed to reach it),
    is bad usage, not a read-only view. Only an unset variable means no token.
    """
    if token_file is not None:
        hint = "'--token-file'"
        try:  # a regular file of at most MAX_TOKEN_FILE_BYTES: not a FIFO, not /dev/zero
            token = read_bounded(token_file, MAX_TOKEN_FILE_BYTES).decode("utf-8").strip()
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {token_file}: {exc.strerror or exc}", param_hint=hint
            ) from exc
        except UnicodeDecodeError as exc:
            raise click.BadParameter(f"{token_file} is not UTF-8 text", param_hint=hint) from exc
        empty = f"{token_file} is empty"
    else:
        hint = f"${TOKEN_ENV}"
        given = os.environ.get(TOKEN_ENV)
        if given is None:
            return None
        token = given.strip()
        empty = "it is set but empty (unset it to serve read-only)"
    if not token:
        raise click.BadParameter(
            f"{empty}; a write token is at least 16 characters", param_hint=hint
        )
    if len(token) < 16:
        raise click.BadParameter(
            "the write token must be at least 16 characters long", param_hint=hint
        )
    if not is_utf8(token):  # invalid UTF-8 in the variable: no HMAC of it could be computed
        raise click.BadParameter("the write token is not valid UTF-8", param_hint=hint)
    return token


@click.command("web")
@click.option(
    "--bind",
    default="127.0.0.1:8000",
    show_default=True,
    callback=_bind,
    metavar="HOST:PORT",
    help="Where to listen (a loopback address keeps the view on this host).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"A file holding the write token (or ${TOKEN_ENV}); without one the view is read-only.",
)
@pass_settings
def web_command(settings: Settings, bind: tuple[str, int], token_file: Path | None) -> None:
    """Serve the web view: schedules, their runs and outcomes, pumps, and actions.

    Pages are plain HTML served by Starlette and uvicorn (`pip install 'emq-bridge[web]'`);
    the JSON API behind them is under /api/. Read-only unless a write token is given:
    then the pages' unlock form (or `Authorization: Bearer <token>` on the API) allows
    pause, resume, trigger now and remove. The token is read from a file or the
    environment, never from the command line, where other users could see it. Stops on
    Ctrl-C or SIGTERM (exit 0).

    \b
    Examples:
      emq-bridge web
      EMQ_BRIDGE_WEB_TOKEN=$(cat /run/secrets/emq-web) emq-bridge web --bind 0.0.0.0:8000
    """
    token = _read_token(token_file)
    try:
        import uvicorn

        from ..web import app
    except ImportError as exc:
        raise click.ClickException(
            f"the web view needs its extra: pip install 'emq-bridge[web]' ({exc})"
        ) from exc
    # A page waits at most this long for a hung Redis (then 503), as `health` and the
    # metrics do: not the commands' 30 s, while a probe's request and the server's threads pile up.
    settings.socket_timeout_s = WEB_TIMEOUT_S
    repeat = settings.repeat()
    repeat.server_time_ms()  # fail now, in one line, if Redis cannot be reached
    host, port = bind
    mode = "writes with the token" if token else "read-only"
    shown = f"[{host}]" if ":" in host else host
    try:  # listen before saying so: a port in use is one line, exit 1
        listening = socket.create_server((host, port), family=_family(host))
    except OSError as exc:
        if isinstance(exc, socket.gaierror):  # its errno is the resolver's, not the system's
            where = f"cannot resolve the host {clipped(host)}: {exc.strerror or exc}"
            raise click.BadParameter(where, param_hint="'--bind'") from exc
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise click.ClickException(f"cannot listen on {shown}:{port}: {reason}") from exc
    config = uvicorn.Config(
        app(repeat, token=token), host=host, port=port, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    with _stop_gracefully(server):  # before it says so: a signal from then on stops it, exit 0
        click.echo(f"serving {settings.where} on http://{shown}:{port}/ ({mode})", err=True)
        server.run(sockets=[listening])
    click.echo("web view stopped", err=True)


@contextmanager
def _stop_gracefully(server: Any) -> Iterator[None]:
    """Make SIGTERM and SIGINT a graceful stop, exit 0, as `pump`'s.

    uvicorn handles both while it serves, then raises the signal again once stopped (to
    hand it on): with the default handlers, SIGTERM would kill the process (143) and SIGINT
    end in click's "Aborted!" (1). Here that second delivery finds a handler that asks the
    server to stop, as one before uvicorn's own handlers are in place does.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


COMMANDS = (web_command,)
