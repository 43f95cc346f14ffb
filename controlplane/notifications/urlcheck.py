"""Which webhook URLs the control plane will call (docs/notifications.md, "Which URLs are allowed").

A webhook makes the control plane send requests from inside the operator's network to a URL a tenant chose
(server-side request forgery). Unless the operator sets ``NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE``, a URL whose
host resolves to any loopback, link-local, private, shared, multicast, reserved or unspecified address is
refused, at save and again at every delivery: a name that resolved to a public address when it was saved may
point inside later (DNS rebinding). The delivery then connects to the address that was checked, not to a second
lookup.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings


class UrlRefused(ValueError):
    """A sentence saying why this URL is not called."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as in the URL, for the Host header and TLS
    port: int
    address: str  # the checked address to connect to
    path: str  # path and query


def _allowed(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def parse(url: str) -> tuple[str, str, int, str]:
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError as exc:  # "Invalid IPv6 URL" and the like
        raise UrlRefused("This is not a URL.") from exc
    if parts.scheme not in ("http", "https"):
        raise UrlRefused("Only http and https URLs can receive webhooks.")
    if not hostname:
        raise UrlRefused("The URL has no host.")
    if parts.username or parts.password:
        raise UrlRefused("Put credentials in the secret, not in the URL.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise UrlRefused("The URL's port is not a number from 1 to 65535.") from exc
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.scheme, hostname, port, path


def resolve(url: str) -> Target:
    """The address to send ``url``'s deliveries to, or ``UrlRefused`` saying why not."""
    scheme, host, port, path = parse(url)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UrlRefused(f"The host {host} does not resolve.") from exc
    addresses = [str(info[4][0]) for info in infos]
    if not addresses:
        raise UrlRefused(f"The host {host} does not resolve.")
    if not settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE:
        # Every address, not only the first: a client may use any of them.
        refused = [a for a in addresses if not _allowed(a)]
        if refused:
            raise UrlRefused(
                f"The host {host} resolves to {refused[0]}, a loopback, link-local, private or reserved address; "
                "webhooks are sent only to public addresses on this installation."
            )
    return Target(scheme=scheme, host=host, port=port, address=addresses[0], path=path)
