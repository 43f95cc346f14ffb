"""``manage.py runproxy``: the web proxy (docs/proxy.md), one asyncio process serving every app's host, the web
terminal and its health check. Stateless: run as many as the load asks for behind the balancer."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.access.web.server import Proxy
from controlplane.access.web.tunnels import Tunnels


def default_bind() -> str:
    port = urlsplit(settings.PROXY_PUBLIC_URL).port or 8001
    return f"127.0.0.1:{port}"


class Command(BaseCommand):
    help = "Run the web proxy: tenants' container web apps and the web terminal (docs/proxy.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--bind",
            default=None,
            help="HOST:PORT to listen on (env PROXY_BIND; default 127.0.0.1 and the port of PROXY_PUBLIC_URL).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        import os

        bind = options["bind"] or os.environ.get("PROXY_BIND") or default_bind()
        host, _, port = bind.rpartition(":")
        if not host or not port.isdigit():
            raise CommandError(f"--bind must be HOST:PORT, not {bind!r}")
        logging.basicConfig(level=logging.INFO, format="%(asctime)s proxy %(levelname)s %(message)s")
        proxy = Proxy(tunnels=Tunnels(idle_s=settings.PROXY_TUNNEL_IDLE_S))
        self.stdout.write(f"web proxy on {bind}: apps at {settings.PROXY_APPS_URL}/, terminal at "
                          f"{settings.PROXY_PUBLIC_URL}/_gpucp/terminal")  # fmt: skip
        web.run_app(proxy.app(), host=host.strip("[]"), port=int(port), print=None, shutdown_timeout=5)
