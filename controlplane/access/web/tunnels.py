"""The proxy's SSH connections to node gateways (docs/proxy.md, "How a request travels").

One connection per (user, reservation, server), logged in with the user's portal key (portalkeys.py) as the
reservation, so the gateway applies its own rules to it (the window, the warnings, the session events) exactly as
to the user's own ``ssh``. Each named port the proxy relays to gets a local forward on that connection, to a Unix
socket in the proxy's private directory, which an aiohttp session of its own talks HTTP (and WebSockets) over:
the gateway joins the container's network namespace for it, as for ``ssh -L``. HTTP keep-alive on that session
keeps each forwarded channel open for the next request.

A connection with nothing open on it (no request, WebSocket or terminal) for ``PROXY_TUNNEL_IDLE_S`` is closed;
so is every connection the gateway ends (the window's end, a stop): the next request opens a new one, or is
refused by the grant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncssh

from controlplane.access.web.grants import Grant, Target
from controlplane.access.web.portalkeys import portal_key

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (user, reservation, server)


class TunnelError(Exception):
    """The gateway could not be reached or refused the proxy (its banner says why)."""


@dataclass
class _Tunnel:
    key: Key
    conn: asyncssh.SSHClientConnection
    forwards: dict[int, tuple[asyncssh.SSHListener, aiohttp.ClientSession]] = field(default_factory=dict)
    busy: int = 0
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False


class Tunnels:
    def __init__(self, *, idle_s: float, connect_timeout_s: float = 15.0) -> None:
        self._idle_s = idle_s
        self._connect_timeout_s = connect_timeout_s
        self._tunnels: dict[Key, _Tunnel] = {}
        self._opening: dict[Key, asyncio.Lock] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="gpucp-proxy-"))
        os.chmod(self._dir, 0o700)

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
        for listener, session in tunnel.forwards.values():
            listener.close()
            await session.close()
        tunnel.forwards.clear()
        tunnel.conn.close()

    @contextlib.asynccontextmanager
    async def http(self, grant: Grant, target: Target, port: int) -> AsyncIterator[aiohttp.ClientSession]:
        """An HTTP client whose connections reach ``port`` on the container's loopback, held busy while used."""
        tunnel = await self._tunnel(grant, target)
        forward = tunnel.forwards.get(port)
        if forward is None:
            path = str(self._dir / f"{secrets.token_hex(8)}.sock")
            try:
                listener = await tunnel.conn.forward_local_path_to_port(path, "localhost", port)
            except (OSError, asyncssh.Error) as exc:
                raise TunnelError(f"the gateway refused a forward to port {port}: {exc}") from exc
            session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=path, limit=0, keepalive_timeout=self._idle_s),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=15),
            )
            forward = tunnel.forwards.setdefault(port, (listener, session))
            if forward[1] is not session:  # another request made one meanwhile
                listener.close()
                await session.close()
        tunnel.busy += 1
        try:
            yield forward[1]
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
        with contextlib.suppress(OSError):
            for path in self._dir.iterdir():
                path.unlink()
            self._dir.rmdir()
