"""The proxy's SSH connections to node gateways (docs/proxy.md, "How a request travels").

One connection per (user, reservation, server), logged in with the user's portal key (portalkeys.py) as the
reservation, so the gateway applies its own rules to it (the window, the warnings, the session events) exactly as
to the user's own ``ssh``. Each named port the proxy relays to gets an aiohttp session of its own whose
connections are channels of that SSH connection (direct-tcpip, what ``ssh -L`` opens), with no socket between:
the gateway joins the container's network namespace for each, as for ``ssh -L``. HTTP keep-alive on that session
keeps each channel open for the next request.

A connection with nothing open on it (no request, WebSocket or terminal) for ``PROXY_TUNNEL_IDLE_S`` is closed;
so is every connection the gateway ends (the window's end, a stop): the next request opens a new one, or is
refused by the grant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncssh

from controlplane.access.web.grants import Grant, Target
from controlplane.access.web.portalkeys import portal_key

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (user, reservation, server)


class TunnelError(Exception):
    """The gateway could not be reached or refused the proxy (its banner says why)."""


# Each channel's receive window and largest packet. With asyncssh's defaults (2 MiB, 32 KiB) every 32 KiB of an
# answer is a packet of its own in both the gateway and the proxy (framed, encrypted, sent, and preceded by an
# empty SSH_MSG_IGNORE): 256 KiB packets take about a third less CPU per byte on each side, and the wider window
# keeps more of a download in flight (bench/proxy.py).
CHANNEL_WINDOW = 8 << 20
CHANNEL_PACKET = 256 << 10


class _ChannelTransport(asyncio.Transport):
    """An SSH channel as the asyncio transport an aiohttp connection writes to."""

    def __init__(self, chan: asyncssh.SSHTCPChannel[bytes], port: int) -> None:
        super().__init__({"peername": ("localhost", port)})
        self._chan = chan
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self._chan.write(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def write_eof(self) -> None:
        if not self._closing:
            self._chan.write_eof()

    def can_write_eof(self) -> bool:
        return True

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._chan.close()

    def lost(self) -> None:
        self._closing = True

    def abort(self) -> None:
        self.close()

    def pause_reading(self) -> None:
        self._chan.pause_reading()

    def resume_reading(self) -> None:
        self._chan.resume_reading()

    def get_write_buffer_size(self) -> int:
        return self._chan.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._chan.set_write_buffer_limits(high, low)


class _ChannelSession(asyncssh.SSHTCPSession[bytes]):
    """The SSH side of one aiohttp connection: what the channel delivers goes to aiohttp's protocol."""

    def __init__(self, protocol: asyncio.Protocol, port: int) -> None:
        self._protocol = protocol
        self._port = port
        self._transport: _ChannelTransport | None = None

    def connection_made(self, chan: asyncssh.SSHTCPChannel[bytes]) -> None:  # type: ignore[override]
        self._transport = _ChannelTransport(chan, self._port)
        self._protocol.connection_made(self._transport)

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self._protocol.data_received(data)

    def eof_received(self) -> bool:
        return bool(self._protocol.eof_received())

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._transport.lost()
        self._protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self._protocol.pause_writing()

    def resume_writing(self) -> None:
        self._protocol.resume_writing()


class _ChannelConnector(aiohttp.BaseConnector):
    """aiohttp's connections to one port in the container, each an SSH channel of its own (``ssh -L``'s
    direct-tcpip), with no socket between."""

    def __init__(self, conn: asyncssh.SSHClientConnection, port: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._conn = conn
        self._port = port

    async def _create_connection(self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout) -> Any:
        protocol = self._factory()
        try:
            async with asyncio.timeout(timeout.sock_connect):
                await self._conn.create_connection(
                    lambda: _ChannelSession(protocol, self._port),
                    "localhost",
                    self._port,
                    window=CHANNEL_WINDOW,
                    max_pktsize=CHANNEL_PACKET,
                )
        except (OSError, asyncssh.Error) as exc:
            raise aiohttp.ClientConnectionError(f"the gateway refused a forward to port {self._port}: {exc}") from exc
        return protocol


@dataclass
class _Tunnel:
    key: Key
    conn: asyncssh.SSHClientConnection
    forwards: dict[int, aiohttp.ClientSession] = field(default_factory=dict)
    busy: int = 0
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False


class Tunnels:
    def __init__(self, *, idle_s: float, connect_timeout_s: float = 15.0) -> None:
        self._idle_s = idle_s
        self._connect_timeout_s = connect_timeout_s
        self._tunnels: dict[Key, _Tunnel] = {}
        self._opening: dict[Key, asyncio.Lock] = {}

    def __len__(self) -> int:
        return len(self._tunnels)

    async def _tunnel(self, grant: Grant, target: Target) -> _Tunnel:
        key = (grant.user, grant.reservation, target.server)
        tunnel = self._tunnels.get(key)
        if tunnel is not None and not tunnel.closed:
            return tunnel
        lock = self._opening.setdefault(key, asyncio.Lock())
        async with lock:
            tunnel = self._tunnels.get(key)
            if tunnel is not None and not tunnel.closed:
                return tunnel
            conn = await self._connect(grant, target)
            tunnel = _Tunnel(key=key, conn=conn)
            self._tunnels[key] = tunnel
            asyncio.get_running_loop().create_task(self._watch(tunnel))
            return tunnel

    async def _connect(self, grant: Grant, target: Target) -> asyncssh.SSHClientConnection:
        key = portal_key(grant.user)
        try:
            return await asyncio.wait_for(
                asyncssh.connect(
                    target.host,
                    target.port,
                    username=grant.reservation,
                    client_keys=[asyncssh.import_private_key(key.private_openssh)],
                    known_hosts=asyncssh.import_known_hosts(target.known_hosts + "\n"),
                    agent_path=None,
                    config=None,
                    preferred_auth="publickey",
                    keepalive_interval=30,
                    # The fastest of the gateway's ciphers where AES has hardware support.
                    encryption_algs=["aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com", "aes128-ctr"],
                    compression_algs=None,
                ),
                self._connect_timeout_s,
            )
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise TunnelError(f"the gateway of {target.server} could not be reached: {exc}") from exc

    async def _watch(self, tunnel: _Tunnel) -> None:
        with contextlib.suppress(Exception):
            await tunnel.conn.wait_closed()
        await self._drop(tunnel)

    async def _drop(self, tunnel: _Tunnel) -> None:
        tunnel.closed = True
        if self._tunnels.get(tunnel.key) is tunnel:
            del self._tunnels[tunnel.key]
        for session in tunnel.forwards.values():
            await session.close()
        tunnel.forwards.clear()
        tunnel.conn.close()

    @contextlib.asynccontextmanager
    async def http(self, grant: Grant, target: Target, port: int) -> AsyncIterator[aiohttp.ClientSession]:
        """An HTTP client whose connections reach ``port`` on the container's loopback, held busy while used."""
        tunnel = await self._tunnel(grant, target)
        session = tunnel.forwards.get(port)
        if session is None:
            session = aiohttp.ClientSession(
                connector=_ChannelConnector(tunnel.conn, port, limit=0, keepalive_timeout=self._idle_s),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=15),
            )
            tunnel.forwards[port] = session
        tunnel.busy += 1
        try:
            yield session
        finally:
            tunnel.busy -= 1
            tunnel.last_used = time.monotonic()

    @contextlib.asynccontextmanager
    async def terminal(
        self, grant: Grant, target: Target, *, cols: int, rows: int
    ) -> AsyncIterator[asyncssh.SSHClientProcess[Any]]:
        """A login shell with a terminal in the container, as ``ssh -t`` gets, on a connection of its own: the
        gateway's session (and its events) is this terminal's, opened and closed with it."""
        conn = await self._connect(grant, target)
        try:
            try:
                process = await conn.create_process(term_type="xterm-256color", term_size=(cols, rows), encoding=None)
            except (OSError, asyncssh.Error) as exc:
                raise TunnelError(f"the gateway refused a shell: {exc}") from exc
            try:
                yield process
            finally:
                process.close()
        finally:
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5)

    async def reap(self) -> None:
        """Close the connections idle for longer than ``idle_s``."""
        now = time.monotonic()
        for tunnel in list(self._tunnels.values()):
            if tunnel.busy == 0 and now - tunnel.last_used > self._idle_s:
                await self._drop(tunnel)

    async def close_reservation(self, reservation: str) -> None:
        for tunnel in list(self._tunnels.values()):
            if tunnel.key[1] == reservation:
                await self._drop(tunnel)

    async def close(self) -> None:
        for tunnel in list(self._tunnels.values()):
            await self._drop(tunnel)
