"""The proxy's addresses, and the signed links and cookies that let a browser in (docs/proxy.md).

**Where an app is.** Each named port of a reservation has a host name of its own, the label
``<reservation id>-<port name>`` in ``PROXY_APPS_URL`` (``http://*.localhost:8001`` by default, in production
``https://*.apps.example.org``). A host per app, not a path under the portal, because an app is the tenant's
code: on an origin of its own its pages cannot read the portal's cookies or call the portal's API as whoever
opens them, and the app serves from ``/`` as it would anywhere (no base URL to configure, no rewriting).

**How a browser gets in.** The API's Open (a portal session or a token) answers a link
``<app>/_gpucp/login?token=...&next=/lab``: signed with SECRET_KEY, good once, for ``PROXY_LINK_TTL_S`` and
never past the window. The proxy turns it into a cookie of that app's host alone (HttpOnly, SameSite=Lax)
and redirects to ``next``; the cookie is never passed on to the app. A terminal link works the same way for the
web terminal's WebSocket. Links carry no password: what the proxy trusts is its own signature, and every
request is checked again against the grant (grants.py), so a member removed, or a window ended, is refused at
once whatever the browser holds.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.core import signing

from controlplane.reservations.specs import PORT_NAME

LOGIN_PATH = "/_gpucp/login"
TERMINAL_PATH = "/_gpucp/terminal"
COOKIE = "gpucp_app"
_LINK_SALT = "gpucp.access.web.link"
_COOKIE_SALT = "gpucp.access.web.cookie"
# A cookie is checked against the grant on every request; its own age only bounds a browser left signed in.
COOKIE_MAX_AGE_S = 7 * 24 * 3600


def _apps_parts() -> tuple[str, str, str]:
    """PROXY_APPS_URL as (scheme, host suffix after the label, ":port" or "")."""
    parts = urlsplit(settings.PROXY_APPS_URL.replace("*", "x", 1))
    host = settings.PROXY_APPS_URL.split("://", 1)[1].split("/", 1)[0]
    suffix = host.split("*", 1)[1].rsplit(":", 1)[0] if parts.port else host.split("*", 1)[1]
    return parts.scheme, suffix.lower(), f":{parts.port}" if parts.port else ""


def app_url(reservation: str, port: str) -> str:
    """The stable address of a reservation's app: ``http://<id>-<port>.localhost:8001/``."""
    scheme, suffix, port_part = _apps_parts()
    return f"{scheme}://{reservation}-{port}{suffix}{port_part}/"


def parse_app_host(host: str) -> tuple[str, str] | None:
    """The (reservation id, port name) an app host names, or None for any other host."""
    _, suffix, _ = _apps_parts()
    name = host.strip().lower()
    if name.startswith("["):
        return None
    name = name.rsplit(":", 1)[0] if ":" in name else name
    if not name.endswith(suffix):
        return None
    label = name[: -len(suffix)]
    if len(label) < 38 or label[36] != "-":
        return None
    reservation, port = label[:36], label[37:]
    try:
        if str(uuid.UUID(reservation)) != reservation:
            return None
    except ValueError:
        return None
    return (reservation, port) if PORT_NAME.fullmatch(port) else None


def terminal_ws_url() -> str:
    base = settings.PROXY_PUBLIC_URL
    scheme = "wss" if base.startswith("https://") else "ws"
    return f"{scheme}://{base.split('://', 1)[1]}{TERMINAL_PATH}"


@dataclass(frozen=True)
class Link:
    url: str
    expires_at: datetime


@dataclass(frozen=True)
class Claims:
    user_id: int
    reservation: str
    port: str | None  # None: the terminal
    nonce: str
    next: str = "/"
    server: str | None = None


def _expiry(now: datetime, ends_at: datetime) -> datetime:
    return min(now + timedelta(seconds=settings.PROXY_LINK_TTL_S), ends_at)


def _sign(payload: dict[str, Any], expires_at: datetime) -> str:
    return signing.dumps({**payload, "x": int(expires_at.timestamp())}, salt=_LINK_SALT, compress=True)


def safe_next(path: str | None, default: str = "/") -> str:
    """A path on the app to land on: relative to its host, never another host (``//evil``, ``/\\evil``)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path or any(c < " " for c in path):
        return default
    return path


def open_link(*, user_id: int, reservation: str, port: str, path: str, now: datetime, ends_at: datetime) -> Link:
    expires = _expiry(now, ends_at)
    nxt = safe_next(path)
    token = _sign({"u": user_id, "r": reservation, "p": port, "n": secrets.token_hex(12), "g": nxt}, expires)
    url = f"{app_url(reservation, port).rstrip('/')}{LOGIN_PATH}?{urlencode({'token': token})}"
    return Link(url=url, expires_at=expires)


def terminal_link(*, user_id: int, reservation: str, server: str | None, now: datetime, ends_at: datetime) -> Link:
    expires = _expiry(now, ends_at)
    token = _sign({"u": user_id, "r": reservation, "p": None, "n": secrets.token_hex(12), "s": server}, expires)
    return Link(url=f"{terminal_ws_url()}?{urlencode({'token': token})}", expires_at=expires)


def read_link(token: str, *, now: datetime) -> Claims | None:
    """A link's claims if its signature holds and it has not expired; None otherwise (whatever is wrong)."""
    try:
        data = signing.loads(token, salt=_LINK_SALT, max_age=settings.PROXY_LINK_TTL_S + 5)
        if not isinstance(data, dict) or int(data["x"]) < int(now.timestamp()):
            return None
        return Claims(
            user_id=int(data["u"]),
            reservation=str(data["r"]),
            port=None if data.get("p") is None else str(data["p"]),
            nonce=str(data["n"]),
            next=safe_next(data.get("g")),
            server=None if data.get("s") is None else str(data["s"]),
        )
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        return None


def cookie_value(*, user_id: int, reservation: str, port: str, session: str) -> str:
    return signing.dumps({"u": user_id, "r": reservation, "p": port, "s": session}, salt=_COOKIE_SALT)


def read_cookie(value: str | None, *, reservation: str, port: str) -> tuple[int, str] | None:
    """(user id, session id) of a cookie made for this very app, or None."""
    if not value:
        return None
    try:
        data = signing.loads(value, salt=_COOKIE_SALT, max_age=COOKIE_MAX_AGE_S)
        if data.get("r") != reservation or data.get("p") != port:
            return None
        return int(data["u"]), str(data["s"])
    except (signing.BadSignature, KeyError, TypeError, ValueError, AttributeError):
        return None
