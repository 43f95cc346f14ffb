"""The web proxy (controlplane/access/web/server.py) on a free loopback port, in a thread with its own event
loop, beside pytest-django's live server; and a client that speaks to an app's host name the way a browser would
(the Host header names ``<reservation>-<port>.localhost:<port>``, the connection goes to 127.0.0.1)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import requests
from aiohttp import web
from django.test import override_settings

from controlplane.access.web.server import Proxy
from controlplane.access.web.tunnels import Tunnels


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProxyThread:
    def __init__(self, port: int, *, idle_s: float = 30.0) -> None:
        self.port = port
        self.loop = asyncio.new_event_loop()
        self.proxy = Proxy(tunnels=Tunnels(idle_s=idle_s))
        self._runner: web.AppRunner | None = None
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self._runner = web.AppRunner(self.proxy.app())
            self.loop.run_until_complete(self._runner.setup())
            self.loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", port).start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="web-proxy", daemon=True)
        self.thread.start()
        assert started.wait(15), "the proxy did not start"

    def call(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        if self._runner is not None:
            self.call(self._runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@contextmanager
def running_proxy(**kwargs: Any) -> Iterator[ProxyThread]:
    port = free_port()
    with override_settings(
        PROXY_PUBLIC_URL=f"http://localhost:{port}",
        PROXY_APPS_URL=f"http://*.localhost:{port}",
        PROXY_GRANT_CACHE_S=0.2,
    ):
        proxy = ProxyThread(port, **kwargs)
        try:
            yield proxy
        finally:
            proxy.close()


class Browser:
    """requests against the proxy, sending each app host's cookies back to that host alone."""

    def __init__(self) -> None:
        self.session = requests.Session()
        self.cookies: dict[str, dict[str, str]] = {}

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", url, **kwargs)

    def request(
        self, method: str, url: str, *, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> requests.Response:
        parts = urlsplit(url)
        host = parts.netloc
        jar = self.cookies.setdefault(host, {})
        sent = dict(headers or {})
        sent["Host"] = host
        if jar:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in jar.items()) + (
                f"; {sent['Cookie']}" if "Cookie" in (headers or {}) else ""
            )
        target = f"http://127.0.0.1:{parts.port}{parts.path or '/'}" + (f"?{parts.query}" if parts.query else "")
        response = self.session.request(method, target, headers=sent, allow_redirects=False, timeout=30, **kwargs)
        for cookie in response.raw.headers.getlist("Set-Cookie") if response.raw else []:
            name, _, rest = cookie.partition("=")
            jar[name.strip()] = rest.split(";", 1)[0]
        self.session.cookies.clear()
        if response.status_code in (301, 302, 303, 307) and kwargs.get("stream") is None:
            location = response.headers["Location"]
            if location.startswith("/"):
                return self.request("GET", f"{parts.scheme}://{host}{location}", headers=headers)
        return response
