"""What the CLI tests share: the world they run in, and ``gpucp`` run in-process through click's runner.

A module of top-level name (this directory has no ``__init__.py``, as a package here would be named
``gpucp`` and hide the real one), imported by conftest.py and the tests.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from click.testing import CliRunner, Result

from controlplane.accounts.models import ApiToken, Project
from controlplane.inventory.models import GpuModel, Server
from gpucp.cli import cli
from tests.factories import ApiTokenFactory, UserFactory

Gpucp = Callable[..., Result]


@dataclass
class World:
    url: str
    owner: Any
    project: Project
    token: str
    model: GpuModel
    server: Server


def invoke(args: list[str], *, env: dict[str, str | None] | None = None, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, args, env=env, input=input, catch_exceptions=False)


class FaultyProxy:
    """An HTTP proxy in front of the live server that breaks chosen exchanges, as a network or a load balancer
    would: ``drop`` forwards the request and swallows the answer (the server acted, the client never heard),
    ``bad_gateway`` answers 502 without forwarding. ``faults`` lists what to do to each request in turn;
    once it is used up, requests pass. One connection at a time, each closed after its answer."""

    def __init__(self, upstream: str, faults: list[str]) -> None:
        parsed = urlsplit(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.faults = list(faults)
        self.seen: list[tuple[str, str, str | None]] = []  # (method, target, Idempotency-Key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="faulty-proxy", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.listener.close()

    def __enter__(self) -> FaultyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        request_line = reader.readline().decode("latin-1").rstrip("\r\n")
        if not request_line:
            return
        method, target, _ = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        while (line := reader.readline().decode("latin-1").rstrip("\r\n")) != "":
            name, _, value = line.partition(":")
            headers[name.strip()] = value.strip()
        length = int(headers.get("Content-Length", "0"))
        body = reader.read(length) if length else b""
        self.seen.append((method, target, headers.get("Idempotency-Key")))
        fault = self.faults.pop(0) if self.faults else "pass"
        if fault == "bad_gateway":
            page = b"<html><body>502 Bad Gateway</body></html>"
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nConnection: close\r\n"
                         + f"Content-Length: {len(page)}\r\n\r\n".encode() + page)  # fmt: skip
            return
        forwarded = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection")}
        upstream = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            upstream.request(method, target, body=body, headers=forwarded)
            answer = upstream.getresponse()
            payload = answer.read()
        finally:
            upstream.close()
        if fault == "drop":
            return  # the server has acted; the connection closes with no answer
        lines = [f"HTTP/1.1 {answer.status} {answer.reason}"]
        lines += [f"{k}: {v}" for k, v in answer.getheaders() if k.lower() not in _HOP_BY_HOP]
        lines += [f"Content-Length: {len(payload)}", "Connection: close", "", ""]
        conn.sendall("\r\n".join(lines).encode("latin-1") + payload)


_HOP_BY_HOP = frozenset({"connection", "content-length", "transfer-encoding", "keep-alive"})


def user() -> Any:
    """A new user (factory_boy's calls are typed as the factory, not the model)."""
    return UserFactory()


def token_of(owner: Any) -> tuple[ApiToken, str]:
    """A personal token of ``owner``, and its plaintext."""
    token: Any = ApiTokenFactory(user=owner)
    return token, token.plaintext
