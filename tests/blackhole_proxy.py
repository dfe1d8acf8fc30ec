"""A TCP forwarder on loopback that can stop forwarding without closing anything: a broker
that hangs (no answer, no reset), as a frozen or black-holed RabbitMQ is to its clients."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class BlackholeProxy:
    """Forward `127.0.0.1:<port>` to `127.0.0.1:<upstream>`; `blackhole()` makes every
    connection, open or new, swallow what it reads and forward nothing, `restore()` undoes
    it (what was swallowed is gone: a connection's stream is broken after a black hole)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.forwarding = threading.Event()
        self.forwarding.set()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def blackhole(self) -> None:
        self.forwarding.clear()

    def restore(self) -> None:
        self.forwarding.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self._sockets += [client, server]
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self.forwarding.is_set():
                    target.sendall(data)
        except OSError:
            pass
        for each in (source, target):
            with contextlib.suppress(OSError):
                each.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for each in self._sockets:
            with contextlib.suppress(OSError):
                each.close()

    def __enter__(self) -> BlackholeProxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
