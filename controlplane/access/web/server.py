"""The web proxy itself: an aiohttp application (docs/proxy.md).

It answers three kinds of request:

- on an app's host (``<reservation>-<port>.<apps domain>``): ``/_gpucp/login?token=`` turns an Open link into
  the app's cookie; anything else, with that cookie, is relayed to the container's port through the node's
  gateway (tunnels.py): HTTP with bodies streamed both ways, and WebSockets frame by frame;
- ``/_gpucp/terminal?token=`` on the proxy's own host: the web terminal's WebSocket, a shell in the container;
- ``/_gpucp/healthz``: 200 while the process serves.

Each relayed request is judged by the grant (grants.py) as it stands, read again every ``PROXY_GRANT_CACHE_S``;
what stays open (WebSockets, terminals, streamed answers) is closed once its grant is gone: the window ended,
the reservation stopped, or the user lost their place in the project.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any, NamedTuple

import aiohttp
from aiohttp import WSMsgType, web
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.utils import timezone
from yarl import URL

from controlplane.access.web import audit, grants, links
from controlplane.access.web.grants import Grant
from controlplane.access.web.tunnels import TunnelError, Tunnels

log = logging.getLogger(__name__)

# Headers that describe one hop, never passed on (RFC 9110 7.6.1), and the WebSocket handshake's own, which
# each side of the relay makes for itself.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "TE",
        "Trailer", "Transfer-Encoding", "Upgrade", "Sec-WebSocket-Key", "Sec-WebSocket-Version",
        "Sec-WebSocket-Accept", "Sec-WebSocket-Extensions", "Sec-WebSocket-Protocol", "Host",
        "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded",
    )
)  # fmt: skip
# Close codes of the web terminal and the relayed WebSockets (docs/proxy.md).
CLOSE_GONE, CLOSE_NOT_FOUND, CLOSE_NOT_READY, CLOSE_UPSTREAM = 4410, 4404, 4409, 1011
WATCH_INTERVAL_S = 1.0
WATCHER = web.AppKey("watcher", asyncio.Task)


def _page(status: int, title: str, message: str) -> web.Response:
    body = (
        f"<!doctype html><html lang=en><meta charset=utf-8><title>{html.escape(title)}</title>"
        "<body style='font-family:system-ui,sans-serif;max-width:40em;margin:4em auto'>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(message)}</p></body></html>"
    )
    return web.Response(status=status, text=body, content_type="text/html", headers={"Cache-Control": "no-store"})


def refusal(grant: Grant) -> web.Response:
    if grant.status == grants.GONE:
        return _page(410, "This app has closed", grant.message)
    if grant.status == grants.NOT_READY:
        response = _page(503, "Not running yet", grant.message)
        response.headers["Retry-After"] = "5"
        return response
    return _page(
        404,
        "Not found",
        "No such app, or you are not signed in to it: open it from its reservation in the portal.",
    )


def client_address(request: web.Request) -> str:
    """The browser's address: the connection's peer, or with ``PROXY_FORWARDED_HOPS`` balancers in front, the
    X-Forwarded-For entry they vouch for (the one that many from the right; a client's own entries are further
    left and never read)."""
    hops = settings.PROXY_FORWARDED_HOPS
    if hops:
        chain = [part.strip() for part in request.headers.get("X-Forwarded-For", "").split(",") if part.strip()]
        if len(chain) >= hops:
            return chain[-hops]
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(request.remote or "?")


def strip_cookie(header: str | None) -> str | None:
    """The Cookie header without the proxy's own cookie: the app never sees it."""
    if not header:
        return header
    kept = [part for part in header.split(";") if part.strip().split("=", 1)[0].strip() != links.COOKIE]
    joined = ";".join(kept).strip()
    return joined or None


class _Call(NamedTuple):
    """One request being relayed: the browser's, the client pool that reaches the app, and whose it is."""

    request: web.Request
    session: aiohttp.ClientSession
    url: URL
    headers: dict[str, str]
    user_id: int
    grant: Grant


@dataclass(eq=False)
class _Live:
    """Something open through the proxy: closed by ``close`` once its grant is gone."""

    user_id: int
    reservation: str
    port: str | None
    close: Callable[[Grant], Awaitable[None]]


@dataclass
class Proxy:
    tunnels: Tunnels
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(8, thread_name_prefix="proxy-db"))
    _grants: dict[tuple[int, str, str | None], tuple[float, Grant]] = field(default_factory=dict)
    _live: set[_Live] = field(default_factory=set)  # type: ignore[assignment]

    # --- reads of the database, in threads ---------------------------------------------------------------
    async def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def call() -> Any:
            close_old_connections()
            try:
                return fn(*args, **kwargs)
            finally:
                close_old_connections()

        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    async def grant(self, user_id: int, reservation: str, port: str | None, *, fresh: bool = False) -> Grant:
        key = (user_id, reservation, port)
        cached = self._grants.get(key)
        now = time.monotonic()
        if not fresh and cached is not None and now - cached[0] < settings.PROXY_GRANT_CACHE_S:
            grant = cached[1]
            # Between reads, the window's end is still the clock's to enforce.
            if grant.ok and grant.ends_at is not None and timezone.now() >= grant.ends_at:
                return await self.grant(user_id, reservation, port, fresh=True)
            return grant
        grant = await self._db(grants.grant_for, user_id, reservation, port, now=timezone.now())
        self._grants[key] = (now, grant)
        if len(self._grants) > 10000:
            for stale in [k for k, (at, _) in self._grants.items() if now - at > settings.PROXY_GRANT_CACHE_S]:
                del self._grants[stale]
        return grant

    # --- the application ---------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        app[WATCHER] = asyncio.get_running_loop().create_task(self._watch())

    async def _stop(self, app: web.Application) -> None:
        app[WATCHER].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await app[WATCHER]
        await self.tunnels.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._handle(request)
        except DatabaseError:
            # The control plane's database is away (a failover, a restart): nothing can be judged, so nothing new
            # is let in; what is open stays open (the watcher keeps it until a grant says otherwise).
            log.warning("proxy: the database could not be read for %s", request.path)
            response = _page(503, "Try again shortly", "The control plane cannot check your access right now.")
            response.headers["Retry-After"] = "5"
            return response

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        target = links.parse_app_host(request.host)
        if target is not None:
            reservation, port = target
            if request.path == links.LOGIN_PATH:
                return await self.login(request, reservation, port)
            return await self.relay(request, reservation, port)
        if request.path == links.TERMINAL_PATH:
            return await self.terminal(request)
        if request.path == "/_gpucp/healthz":
            return web.json_response({"status": "ok", "tunnels": len(self.tunnels), "open": len(self._live)})
        return _page(404, "Not found", "This is the web proxy of a GPU control plane; open an app from the portal.")

    # --- opening: a link becomes a cookie ----------------------------------------------------------------
    async def login(self, request: web.Request, reservation: str, port: str) -> web.StreamResponse:
        claims = links.read_link(request.query.get("token", ""), now=timezone.now())
        if claims is None or claims.reservation != reservation or claims.port != port:
            return _page(404, "This link has expired", "Links from Open are good for a minute, once: open it again.")
        grant = await self.grant(claims.user_id, reservation, port, fresh=True)
        if not grant.ok:
            return refusal(grant)
        session = await self._db(audit.redeem, claims, grant, source=client_address(request), now=timezone.now())
        if session is None:
            return _page(404, "This link was used", "Links from Open are good once: open the app again.")
        response = web.HTTPFound(claims.next)
        response.set_cookie(
            links.COOKIE,
            links.cookie_value(user_id=claims.user_id, reservation=reservation, port=port, session=session),
            max_age=links.COOKIE_MAX_AGE_S,
            path="/",
            httponly=True,
            samesite="Lax",
            secure=settings.PROXY_APPS_URL.startswith("https://"),
        )
        response.headers["Cache-Control"] = "no-store"
        raise response

    # --- relaying to an app --------------------------------------------------------------------------------
    async def relay(self, request: web.Request, reservation: str, port: str) -> web.StreamResponse:
        cookie = links.read_cookie(request.cookies.get(links.COOKIE), reservation=reservation, port=port)
        if cookie is None:
            return refusal(grants.not_found(reservation))
        user_id, _session = cookie
        grant = await self.grant(user_id, reservation, port)
        if not grant.ok or grant.port is None:
            return refusal(grant)
        headers = self._upstream_headers(request, grant)
        url = URL(f"http://localhost{request.raw_path}", encoded=True)
        try:
            async with self.tunnels.http(grant, grant.targets[0], grant.port.port) as session:
                call = _Call(request, session, url, headers, user_id, grant)
                if request.headers.get("Upgrade", "").lower() == "websocket":
                    return await self._relay_ws(call)
                return await self._relay_http(call)
        except TunnelError as exc:
            log.warning("proxy: %s", exc)
            return _page(502, "The app could not be reached", "The node's gateway did not take the connection.")

    def _upstream_headers(self, request: web.Request, grant: Grant) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in request.headers.items():
            lower = name.lower()
            if lower in HOP_BY_HOP or lower == "cookie":
                continue
            if lower == "authorization" and grant.token is not None:
                continue
            out[name] = value if name not in out else f"{out[name]}, {value}"
        cookie = strip_cookie(request.headers.get("Cookie"))
        if cookie:
            out["Cookie"] = cookie
        if grant.token is not None:
            out["Authorization"] = f"token {grant.token}"
        out["Host"] = request.host
        address = client_address(request)
        out["X-Forwarded-For"] = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
        out["X-Forwarded-Host"] = request.host
        out["X-Forwarded-Proto"] = "https" if settings.PROXY_APPS_URL.startswith("https://") else "http"
        return out

    async def _relay_http(self, call: _Call) -> web.StreamResponse:
        request, session, url, headers, user_id, grant = call
        body = request.content if request.body_exists else None
        try:
            upstream = await session.request(
                request.method,
                url,
                headers=headers,
                data=body,
                allow_redirects=False,
                skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            )
        except (aiohttp.ClientError, OSError) as exc:
            log.info("proxy: %s %s: %s", request.method, grant.reservation, exc)
            return _page(
                502,
                "The app did not answer",
                f"Nothing answered on port {grant.port.port if grant.port else '?'} in the container: is the app "
                "running?",
            )
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() in HOP_BY_HOP or name.lower() == "content-length":
                    continue
                if name.lower() == "set-cookie" and SimpleCookie(value).get(links.COOKIE) is not None:
                    continue
                response.headers.add(name, value)
            if upstream.content_length is not None and "Content-Encoding" not in response.headers:
                response.content_length = upstream.content_length
            elif upstream.content_length is not None:
                response.headers["Content-Length"] = str(upstream.content_length)
            await response.prepare(request)
            live = _Live(user_id, grant.reservation, grant.port.name if grant.port else None, self._aborter(request))
            self._live.add(live)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (aiohttp.ClientError, ConnectionResetError, asyncio.CancelledError):
                if request.transport is not None:
                    request.transport.close()
                raise
            finally:
                self._live.discard(live)
        return response

    def _aborter(self, request: web.Request) -> Callable[[Grant], Awaitable[None]]:
        async def abort(_grant: Grant) -> None:
            if request.transport is not None:
                request.transport.close()

        return abort

    async def _relay_ws(self, call: _Call) -> web.StreamResponse:
        request, session, url, headers, user_id, grant = call
        protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        try:
            upstream = await session.ws_connect(
                url, headers=headers, protocols=protocols, autoping=True, max_msg_size=0, compress=0
            )
        except aiohttp.WSServerHandshakeError as exc:
            status = exc.status if exc.status and exc.status >= 400 else 502
            return _page(status, "The app refused the WebSocket", str(exc.message))
        except (aiohttp.ClientError, OSError):
            return _page(502, "The app did not answer", "Nothing answered the WebSocket in the container.")
        client = web.WebSocketResponse(
            protocols=[upstream.protocol] if upstream.protocol else (), autoping=True, max_msg_size=0
        )
        await client.prepare(request)

        async def close(g: Grant) -> None:
            code, message = (CLOSE_GONE, g.message) if g.status == grants.GONE else (CLOSE_NOT_FOUND, "closed")
            await upstream.close(code=1001, message=b"the reservation's window ended")
            await client.close(code=code, message=message.encode()[:120])

        live = _Live(user_id, grant.reservation, grant.port.name if grant.port else None, close)
        self._live.add(live)
        try:
            await _pump_ws(client, upstream)
        finally:
            self._live.discard(live)
        if not client.closed:
            # The app's side ended first: its own close code, unless the reason is that the grant went (the
            # gateway closes the reservation's connections at the window's end, perhaps before our watcher).
            after = await self.grant(user_id, grant.reservation, live.port, fresh=True)
            if not after.ok:
                await close(after)
            else:
                code = upstream.close_code
                await client.close(code=CLOSE_UPSTREAM if code in (None, 1005, 1006) else code)
        await upstream.close(code=client.close_code or 1000)
        return client

    # --- the web terminal --------------------------------------------------------------------------------
    async def terminal(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=True, heartbeat=30, max_msg_size=1 << 20)
        await ws.prepare(request)
        try:
            return await self._terminal(request, ws)
        except DatabaseError:
            log.warning("proxy terminal: the database could not be read")
            await ws.close(code=CLOSE_UPSTREAM, message=b"the control plane cannot check your access right now")
            return ws

    async def _terminal(self, request: web.Request, ws: web.WebSocketResponse) -> web.StreamResponse:
        claims = links.read_link(request.query.get("token", ""), now=timezone.now())
        if claims is None or claims.port is not None:
            await ws.close(code=CLOSE_NOT_FOUND, message=b"this terminal link has expired or is not valid")
            return ws
        grant = await self.grant(claims.user_id, claims.reservation, None, fresh=True)
        if not grant.ok:
            code = {grants.GONE: CLOSE_GONE, grants.NOT_READY: CLOSE_NOT_READY}.get(grant.status, CLOSE_NOT_FOUND)
            await ws.close(code=code, message=grant.message.encode()[:120])
            return ws
        target = next((t for t in grant.targets if t.server == claims.server), grant.targets[0])
        session = await self._db(audit.redeem, claims, grant, source=client_address(request), now=timezone.now())
        if session is None:
            await ws.close(code=CLOSE_NOT_FOUND, message=b"this terminal link was used already")
            return ws
        cols, rows = 80, 24
        try:
            async with self.tunnels.terminal(grant, target, cols=cols, rows=rows) as process:

                async def close(g: Grant) -> None:
                    process.close()
                    await ws.close(code=CLOSE_GONE, message=g.message.encode()[:120])

                live = _Live(claims.user_id, claims.reservation, None, close)
                self._live.add(live)
                try:
                    status = await _pump_terminal(ws, process)
                finally:
                    self._live.discard(live)
        except TunnelError as exc:
            log.warning("proxy terminal: %s", exc)
            await ws.close(code=CLOSE_UPSTREAM, message=b"the node's gateway did not open a shell")
            return ws
        if not ws.closed:
            after = await self.grant(claims.user_id, claims.reservation, None, fresh=True)
            if after.status == grants.GONE:
                await ws.close(code=CLOSE_GONE, message=after.message.encode()[:120])
            elif status is None:
                await ws.close(code=CLOSE_UPSTREAM, message=b"the connection to the container was lost")
            else:
                await ws.close(code=1000, message=f"the shell exited with status {status}".encode())
        return ws

    # --- closing what a grant no longer covers --------------------------------------------------------------
    async def _watch(self) -> None:
        database_away = False
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                await self.tunnels.reap()
                await self.sweep()
                if database_away:
                    log.info("proxy: the database answers again; grants are checked again")
                database_away = False
            except DatabaseError:
                # What is open stays open while nothing can be judged; the gateway still ends it at the window's end.
                if not database_away:
                    log.warning("proxy: the database cannot be read; open connections are kept until it can")
                database_away = True
            except Exception:  # the watcher must outlive any one failure
                log.exception("proxy: the watcher's pass failed")

    async def sweep(self) -> None:
        for live in list(self._live):
            grant = await self.grant(live.user_id, live.reservation, live.port)
            if not grant.ok:
                self._live.discard(live)
                with contextlib.suppress(Exception):
                    await live.close(grant)


async def _pump_ws(client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse) -> None:
    """Relay frames both ways until either side closes; the caller closes the other side."""

    async def down() -> None:
        async for msg in upstream:
            if msg.type == WSMsgType.TEXT:
                await client.send_str(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await client.send_bytes(msg.data)
            else:
                break

    async def up() -> None:
        async for msg in client:
            if msg.type == WSMsgType.TEXT:
                await upstream.send_str(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await upstream.send_bytes(msg.data)
            else:
                break

    tasks = [asyncio.ensure_future(down()), asyncio.ensure_future(up())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pump_terminal(ws: web.WebSocketResponse, process: Any) -> int | None:
    """Relay keystrokes and resizes in, output out, until either side ends; the shell's exit status, or None
    when the connection to it was lost."""

    async def out(stream: Any) -> None:
        while True:
            data = await stream.read(65536)
            if not data:
                return
            await ws.send_bytes(data)

    async def keys() -> None:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                process.stdin.write(msg.data)
            elif msg.type == WSMsgType.TEXT:
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    data = json.loads(msg.data)
                    if data.get("type") == "resize":
                        cols, rows = int(data["cols"]), int(data["rows"])
                        if 1 <= cols <= 1000 and 1 <= rows <= 1000:
                            process.change_terminal_size(cols, rows)
            else:
                return

    readers = [asyncio.ensure_future(out(process.stdout)), asyncio.ensure_future(out(process.stderr))]
    typing = asyncio.ensure_future(keys())
    output = asyncio.ensure_future(asyncio.gather(*readers))
    try:
        done, _ = await asyncio.wait([typing, output], return_when=asyncio.FIRST_COMPLETED)
        if typing in done:
            return 0
        await process.wait_closed()
        return process.exit_status
    except (OSError, ConnectionError):
        return None
    finally:
        for task in (typing, *readers):
            task.cancel()
        await asyncio.gather(typing, *readers, return_exceptions=True)
        output.cancel()
        await asyncio.gather(output, return_exceptions=True)
