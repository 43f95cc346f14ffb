"""Builders for the live-log tests: a server with a node credential, a launch on it, and log chunks."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import requests

from controlplane.core import tokens
from controlplane.dispatch import services
from controlplane.dispatch.models import Launch
from controlplane.fleet.models import NodeCredential
from controlplane.inventory.models import Server
from controlplane.reservations.models import Reservation
from nodeagent import schema
from tests.dispatch.support import book
from tests.reservations.fleet import gpu_model, project, server


def credential_for(srv: Server) -> str:
    """A node credential of ``srv``, as enrollment issues one."""
    issued = tokens.issue(tokens.NODE_CREDENTIAL)
    NodeCredential.objects.create(server=srv, lookup=issued.lookup, digest=issued.digest)
    return issued.plaintext


def running_launch(*, owner: Any = None, member: Any = None, hostname: str | None = None) -> tuple[Launch, str]:
    """A reservation of one GPU whose window is open, its launch, and its server's node credential."""
    h100 = gpu_model()
    srv = server(h100, gpus=1, hostname=hostname)
    reservation: Reservation = book(project(owner=owner, member=member), h100, count=1)
    services.dispatch_open_due()
    return Launch.objects.get(reservation=reservation), credential_for(srv)


def chunk(launch: Launch | str, offset: int, data: bytes, *, eof: bool = False) -> dict[str, Any]:
    launch_id = launch if isinstance(launch, str) else launch.launch_id
    return {"launch_id": launch_id, "offset": offset, "data": base64.b64encode(data).decode(), "eof": eof}


def batch(*chunks: dict[str, Any]) -> dict[str, Any]:
    return {"schema_version": schema.SCHEMA_VERSION, "chunks": list(chunks)}


# -- a follower of the Server-Sent Events, over real HTTP ------------------------------------------------------


def short_streams(settings: Any, monkeypatch: Any) -> None:
    """A stream outlives its client until a write to it fails: frequent keep-alives and short streams end the
    streams of gone followers soon, so the live server's threads are free when the test's data is flushed."""
    from controlplane.dispatch.api import logs as logs_api

    settings.DISPATCH_LOG_FOLLOW_MAX_S = 8
    monkeypatch.setattr(logs_api, "KEEPALIVE_S", 0.5)


def _lines(response: requests.Response) -> Iterator[str]:
    """Lines as they arrive (``iter_lines`` waits for a whole block of bytes first)."""
    pending = b""
    while data := response.raw.read1(65536):
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode().removesuffix("\r")


class Follower:
    """``GET ...?follow=1`` over real HTTP in a thread; the events as they come."""

    def __init__(
        self,
        url: str,
        token: str,
        headers: dict[str, str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.events: list[dict[str, Any]] = []
        self.arrived: list[float] = []  # ``clock()`` when each event came
        self.comments: list[str] = []
        self.closed = threading.Event()
        self.response = requests.get(
            url,
            headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream", **(headers or {})},
            stream=True,
            timeout=(5, 30),
        )
        assert self.response.status_code == 200, self.response.text
        assert self.response.headers["Content-Type"].startswith("text/event-stream")
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        event: dict[str, Any] = {}
        try:
            for line in _lines(self.response):
                if line == "":
                    if "data" in event:  # a block of only ``retry:`` is no event
                        self.events.append(event)
                        self.arrived.append(self.clock())
                    event = {}
                elif line.startswith(":"):
                    self.comments.append(line)
                else:
                    name, _, value = line.partition(":")
                    event[name] = value.removeprefix(" ")
        finally:
            self.closed.set()

    def close(self) -> None:
        """Hang up: the socket first, as closing the response waits for the reading thread's next bytes."""
        sock = getattr(getattr(self.response.raw, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.response.close()

    @staticmethod
    def text_of(event: dict[str, Any]) -> str:
        return "" if "event" in event else str(json.loads(event["data"])["text"])

    def texts(self) -> str:
        return "".join(self.text_of(e) for e in self.events)

    def wait(self, predicate: Any, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, (self.events, self.comments)
            time.sleep(0.02)
