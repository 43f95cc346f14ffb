"""Real network faults on 127.0.0.1 for the unit tests: a port nobody listens on (connection refused, as when
Redis is stopped), and a server that accepts connections and never answers (as a frozen Redis, or one behind a
partition that still completes the TCP handshake)."""

from __future__ import annotations

import socket
import threading


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SilentServer:
    """Accepts every connection, reads nothing, answers nothing; counts the connections it was sent."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._held: list[socket.socket] = []
        self._closing = False
        threading.Thread(target=self._accept, name="silent-server", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self._server.getsockname()[1])

    @property
    def connections(self) -> int:
        return len(self._held)

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._held.append(conn)

    def close(self) -> None:
        self._closing = True
        self._server.close()
        for conn in self._held:
            conn.close()

    def __enter__(self) -> SilentServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
