"""A TCP relay in front of PostgreSQL that loses one statement's reply after its commit.

A statement in autocommit commits on the server before the server says it is ready for
the next one (the ``ReadyForQuery`` message, ``Z``). If the connection dies between the
two, the statement took effect and the client got an error: what a database crash or a
failover right after a commit does, made exact. The relay forwards everything both ways
until it sees *marker* in the client's bytes (a statement's text, in its ``Parse``
message). It forwards that statement too, then swallows the server's answer up to its
``ReadyForQuery`` and closes both ends, once.

The client must not use TLS (``sslmode=disable``): the relay reads its bytes.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType

__all__ = ["ReplyCutter"]

READY_FOR_QUERY = ord("Z")


class ReplyCutter:
    """Relays 127.0.0.1:``port`` to *host*:*server_port*; cuts the first reply to a
    statement holding *marker*. ``cuts`` counts the replies it swallowed."""

    def __init__(self, host: str, server_port: int, marker: bytes) -> None:
        self._server = (host, server_port)
        self._marker = marker
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.cuts = 0
        self._armed = True  # cuts once
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> ReplyCutter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                _close(sock)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._server)
            with self._lock:
                self._sockets += [client, server]
            cutting = threading.Event()
            threading.Thread(
                target=self._to_server, args=(client, server, cutting), daemon=True
            ).start()
            threading.Thread(
                target=self._to_client, args=(server, client, cutting), daemon=True
            ).start()

    def _to_server(
        self, client: socket.socket, server: socket.socket, cutting: threading.Event
    ) -> None:
        tail = b""
        while data := _recv(client):
            seen = tail + data
            with self._lock:
                if self._armed and self._marker in seen:
                    self._armed = False
                    cutting.set()  # before the server can answer
            tail = seen[-len(self._marker) :]
            try:
                server.sendall(data)
            except OSError:
                break
        _close(server)

    def _to_client(
        self, server: socket.socket, client: socket.socket, cutting: threading.Event
    ) -> None:
        # The client sends a statement only once it has read the answer to the one
        # before: when the cut is armed, the server's next bytes begin a message.
        answer = b""
        while data := _recv(server):
            if not cutting.is_set():
                try:
                    client.sendall(data)
                except OSError:
                    break
                continue
            answer += data
            if _holds_ready_for_query(answer):
                with self._lock:
                    self.cuts += 1
                break
        _close(client)
        _close(server)


def _holds_ready_for_query(stream: bytes) -> bool:
    """Whether *stream*, backend messages from a message's start, holds a ``Z``."""
    at = 0
    while len(stream) - at >= 5:
        kind = stream[at]
        length = int.from_bytes(stream[at + 1 : at + 5], "big")
        if len(stream) - at < 1 + length:
            return False
        if kind == READY_FOR_QUERY:
            return True
        at += 1 + length
    return False


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
