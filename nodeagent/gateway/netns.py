"""``ssh -L``: a connection to a port on the container's own loopback, made inside its network namespace.

A container on ``network: none`` has no address the host can reach, so the socket is created inside the
container's network namespace (``/proc/<pid>/ns/net``): a short-lived thread joins that namespace with
``setns(2)`` (which needs CAP_SYS_ADMIN, so the agent runs as root), creates and connects the socket, and
ends. A socket stays in the namespace it was created in, so the connected socket is then handed to asyncio
in the gateway's own thread like any other. The thread is a fresh one each time and never runs anything
else: a thread pool's worker would carry the container's namespace into unrelated work.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import socket
import threading
from typing import Any

import asyncssh

CLONE_NEWNET = 0x40000000
CONNECT_TIMEOUT_S = 10.0

# The only destinations a forward may name: the container's loopback, as the tenant would write it.
_LOOPBACK = {"127.0.0.1": (socket.AF_INET, "127.0.0.1"), "localhost": (socket.AF_INET, "127.0.0.1"),
             "::1": (socket.AF_INET6, "::1"), "[::1]": (socket.AF_INET6, "::1")}  # fmt: skip


def loopback(host: str) -> tuple[socket.AddressFamily, str] | None:
    return _LOOPBACK.get(host.strip().lower())


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)} (the gateway needs root, CAP_SYS_ADMIN)")


def connect_in_netns(
    pid: int, family: socket.AddressFamily, address: str, port: int, *, timeout: float = CONNECT_TIMEOUT_S
) -> socket.socket:
    """A socket connected to ``address:port`` as seen from inside the network namespace of process ``pid``."""
    outcome: dict[str, Any] = {}

    def connect() -> None:
        sock = None
        try:
            # Opened by this thread before it moves, so the path is the host's /proc, not the container's.
            with open(f"/proc/{pid}/ns/net", "rb") as namespace:
                _setns(namespace.fileno())
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect((address, port))
            sock.setblocking(False)
            outcome["sock"] = sock
        except BaseException as exc:
            if sock is not None:
                sock.close()
            outcome["error"] = exc

    thread = threading.Thread(target=connect, name=f"gpucp-netns-{pid}", daemon=True)
    thread.start()
    thread.join(timeout + 5.0)
    if "sock" in outcome:
        return outcome["sock"]  # type: ignore[no-any-return]
    error = outcome.get("error")
    if isinstance(error, OSError):
        raise error
    raise OSError(f"connecting to {address}:{port} in the container failed: {error or 'timed out'}")


class _SocketSide(asyncio.Protocol):
    """The container's end of a forward, bridged to the SSH channel with flow control both ways."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.channel: asyncssh.SSHTCPChannel[bytes] | None = None
        # Each direction ends on its own (TCP half-close); once both have, the forward is over.
        self.container_done = False
        self.client_done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.pause_reading()  # until the SSH channel is open, there is nowhere to put the data

    def data_received(self, data: bytes) -> None:
        if self.channel is not None:
            self.channel.write(data)

    def eof_received(self) -> bool:
        self.container_done = True
        if self.channel is not None:
            self.channel.write_eof()
        return not self.client_done  # False: the transport closes, and connection_lost closes the channel

    def connection_lost(self, exc: Exception | None) -> None:
        if self.channel is not None:
            self.channel.close()

    def pause_writing(self) -> None:
        if self.channel is not None:
            self.channel.pause_reading()

    def resume_writing(self) -> None:
        if self.channel is not None:
            self.channel.resume_reading()


class ForwardSession(asyncssh.SSHTCPSession[bytes]):
    """The SSH channel's end of a forward."""

    def __init__(self, side: _SocketSide) -> None:
        self.side = side

    def connection_made(self, chan: asyncssh.SSHTCPChannel[bytes]) -> None:  # type: ignore[override]
        self.side.channel = chan

    def session_started(self) -> None:
        if self.side.transport is not None:
            self.side.transport.resume_reading()

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if self.side.transport is not None:
            self.side.transport.write(data)

    def eof_received(self) -> bool:
        self.side.client_done = True
        transport = self.side.transport
        if transport is not None:
            if self.side.container_done:
                transport.close()
            elif transport.can_write_eof():
                transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.side.transport is not None:
            self.side.transport.close()

    def pause_writing(self) -> None:
        if self.side.transport is not None:
            self.side.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.side.transport is not None:
            self.side.transport.resume_reading()


async def bridge(sock: socket.socket) -> ForwardSession:
    """Hand a connected socket to asyncio and pair it with the SSH channel's session."""
    loop = asyncio.get_running_loop()
    _, side = await loop.create_connection(_SocketSide, sock=sock)
    return ForwardSession(side)
