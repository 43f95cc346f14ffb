"""The proxy's addresses, links and cookies (controlplane/access/web/links.py) and its header rules: an app host
parses only in its exact form, a link is refused tampered, expired or for another app, a cookie only for its own
app, a landing path never leaves the app's host, and the proxy's cookie is taken out of what the app receives."""

from __future__ import annotations

import uuid
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.access.web import links
from controlplane.access.web.server import strip_cookie

R = str(uuid.uuid4())


def token_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["token"][0]


@override_settings(PROXY_APPS_URL="https://*.apps.example.org")
def test_an_app_host_parses_only_in_its_exact_form() -> None:
    assert links.app_url(R, "jupyter") == f"https://{R}-jupyter.apps.example.org/"
    assert links.parse_app_host(f"{R}-jupyter.apps.example.org") == (R, "jupyter")
    assert links.parse_app_host(f"{R.upper()}-JUPYTER.APPS.EXAMPLE.ORG:443") == (R, "jupyter")
    for host in (
        "apps.example.org",
        f"{R}-jupyter.apps.example.org.evil.test",
        f"{R}-jupyter.evil.test",
        f"x.{R}-jupyter.apps.example.org",
        f"{R}jupyter.apps.example.org",
        f"{R}-.apps.example.org",
        f"{R}-Bad_Name.apps.example.org",
        f"{R[:-1]}z-jupyter.apps.example.org",
        "[::1]:8001",
        "",
    ):
        assert links.parse_app_host(host) is None, host


def test_the_default_apps_url_is_loopback_on_8001() -> None:
    assert links.app_url(R, "tb") == f"http://{R}-tb.localhost:8001/"
    assert links.parse_app_host(f"{R}-tb.localhost:8001") == (R, "tb")
    assert links.parse_app_host("localhost:8001") is None
    assert links.terminal_ws_url() == "ws://localhost:8001/_gpucp/terminal"


def test_a_link_is_read_back_once_signed_and_refused_otherwise() -> None:
    now = timezone.now()
    link = links.open_link(
        user_id=7, reservation=R, port="lab", path="/lab?x=1", now=now, ends_at=now + timedelta(hours=1)
    )
    token = token_of(link.url)
    claims = links.read_link(token, now=now)
    assert claims is not None and (claims.user_id, claims.reservation, claims.port, claims.next) == (
        7,
        R,
        "lab",
        "/lab?x=1",
    )
    assert link.expires_at == now + timedelta(seconds=60)
    assert links.read_link(token[:-2] + ("AA" if not token.endswith("AA") else "BB"), now=now) is None
    assert links.read_link("garbage", now=now) is None
    assert links.read_link(token, now=now + timedelta(seconds=61)) is None


def test_a_link_never_outlives_the_window() -> None:
    now = timezone.now()
    link = links.open_link(user_id=1, reservation=R, port="lab", path="/", now=now, ends_at=now + timedelta(seconds=5))
    assert link.expires_at == now + timedelta(seconds=5)
    token = token_of(link.url)
    assert links.read_link(token, now=now + timedelta(seconds=6)) is None
    terminal = links.terminal_link(user_id=1, reservation=R, server="n1", now=now, ends_at=now + timedelta(seconds=3))
    assert terminal.expires_at == now + timedelta(seconds=3)


def test_a_cookie_is_good_only_for_its_own_app() -> None:
    value = links.cookie_value(user_id=3, reservation=R, port="lab", session="s1")
    assert links.read_cookie(value, reservation=R, port="lab") == (3, "s1")
    assert links.read_cookie(value, reservation=R, port="tb") is None
    assert links.read_cookie(value, reservation=str(uuid.uuid4()), port="lab") is None
    assert links.read_cookie(value + "x", reservation=R, port="lab") is None
    assert links.read_cookie(None, reservation=R, port="lab") is None


@pytest.mark.parametrize(
    ("path", "landed"),
    [("/lab", "/lab"), ("/tree?x=1#y", "/tree?x=1#y"), ("//evil.test/x", "/"), ("/\\evil.test", "/"),
     ("https://evil.test/", "/"), ("lab", "/"), ("/a\r\nSet-Cookie: x=1", "/"), ("", "/")],
)  # fmt: skip
def test_a_landing_path_stays_on_the_apps_host(path: str, landed: str) -> None:
    assert links.safe_next(path) == landed


def test_the_proxys_cookie_never_reaches_the_app() -> None:
    assert strip_cookie("gpucp_app=abc") is None
    assert strip_cookie("a=1; gpucp_app=abc; _xsrf=2") == "a=1; _xsrf=2"
    assert strip_cookie(" gpucp_app = abc ;b=2") == "b=2"
    assert strip_cookie("gpucp_apps=keep") == "gpucp_apps=keep"
    assert strip_cookie(None) is None


@pytest.mark.parametrize(
    ("hops", "forwarded", "address"),
    [(0, "6.6.6.6", "peer"), (1, "6.6.6.6, 203.0.113.9", "203.0.113.9"), (2, "203.0.113.9, 10.0.0.2", "203.0.113.9"),
     (1, "", "peer")],
)  # fmt: skip
def test_the_browsers_address_is_the_one_the_balancers_vouch_for(hops: int, forwarded: str, address: str) -> None:
    from aiohttp.test_utils import make_mocked_request

    from controlplane.access.web.server import client_address

    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    request = make_mocked_request("GET", "/", headers=headers)
    with override_settings(PROXY_FORWARDED_HOPS=hops):
        got = client_address(request)
    assert got == address or (address == "peer" and got not in ("6.6.6.6", "203.0.113.9"))
