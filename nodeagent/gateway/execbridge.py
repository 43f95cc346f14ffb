"""An SSH session's shell or command, run by the Docker Engine API's exec inside the container and bridged
into asyncio: the exec's hijacked socket carries stdin one way and the output the other (raw with a TTY;
without one, Docker frames each write with an 8-byte header naming stdout or stderr, which is undone here so
that the client sees its two streams apart). The exit status goes back to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import asyncssh
from asyncssh.misc import BreakReceived, SignalReceived, SoftEOFReceived, TerminalSizeChanged

from nodeagent.gateway.container import ENGINE_ERRORS, exit_code

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
# With no bash in the image, the POSIX shell; decided inside the container, so no path of the host is looked at.
LOGIN_SHELL = ["/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi"]
STDOUT, STDERR = 1, 2

Blocking = Callable[..., Awaitable[Any]]


def command_argv(command: str | None) -> list[str]:
    """The argv a session runs: the login shell, or ``sh -c`` with the command the client sent."""
    return list(LOGIN_SHELL) if command is None else ["/bin/sh", "-c", command]


def raw_socket(hijacked: Any) -> socket.socket:
    """The socket under what ``exec_start(socket=True)`` returns (a ``SocketIO`` for a local engine)."""
    sock = getattr(hijacked, "_sock", hijacked)
    if not isinstance(sock, socket.socket):
        raise TypeError(f"the Docker client returned {type(hijacked).__name__}, not a socket; use a local engine")
    return sock


async def run_exec(
    api: Any,
    container_id: str,
    process: asyncssh.SSHServerProcess[bytes],
    *,
    argv: list[str],
    blocking: Blocking,
) -> int:
    """Run ``argv`` in the container for ``process`` until it exits; its exit status."""
    term = process.term_type
    tty = term is not None
    env = {"TERM": term} if term else None
    created = await blocking(
        api.exec_create, container_id, argv, stdin=True, stdout=True, stderr=True, tty=tty, environment=env
    )
    exec_id = created["Id"]
    hijacked = await blocking(api.exec_start, exec_id, tty=tty, socket=True)
    sock = raw_socket(hijacked)
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)

    async def resize(width: int, height: int) -> None:
        if tty and width > 0 and height > 0:
            with contextlib.suppress(*ENGINE_ERRORS):
                await blocking(api.exec_resize, exec_id, height=height, width=width)

    width, height, _, _ = process.term_size
    await resize(width, height)

    async def pump_in() -> None:
        while True:
            try:
                data = await process.stdin.read(CHUNK)
            except TerminalSizeChanged as change:
                await resize(change.width, change.height)
                continue
            except (BreakReceived, SignalReceived, SoftEOFReceived):
                continue
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if not tty:
            # Half-close: the command sees the end of its stdin and may still write its output.
            writer.write_eof()

    async def pump_out() -> None:
        if tty:
            while chunk := await reader.read(CHUNK):
                process.stdout.write(chunk)
                await process.stdout.drain()
            return
        while True:
            try:
                header = await reader.readexactly(8)
                payload = await reader.readexactly(int.from_bytes(header[4:8], "big"))
            except asyncio.IncompleteReadError:
                return
            stream = process.stderr if header[0] == STDERR else process.stdout
            stream.write(payload)
            await stream.drain()

    feeding = asyncio.create_task(pump_in())
    output = asyncio.create_task(pump_out())
    # The client may go away first: then the exec's socket is closed (a TTY's shell gets SIGHUP from it).
    gone = asyncio.ensure_future(process.channel.wait_closed())
    try:
        await asyncio.wait({output, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (feeding, output, gone):
            task.cancel()
        for task in (feeding, output, gone):
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, asyncssh.Error):
                await task  # the client went away: what the command does next is the container's business
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    if gone.done() and not gone.cancelled() and not output.done():
        return 255  # nobody is left to tell
    try:
        return int(await blocking(exit_code, api, exec_id))
    except ENGINE_ERRORS:
        return 255
