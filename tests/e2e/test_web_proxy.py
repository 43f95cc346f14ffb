"""The web proxy end to end (docs/proxy.md): a booking with named ports, real agents with their SSH gateways and
Docker, the proxy in a thread, and HTTP clients on the app's host name. The app is BusyBox's httpd on the
container's loopback (``network: none``), with a CGI script that shows what reached it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
from django.test import override_settings
from django.utils import timezone

from controlplane.dispatch.models import Launch
from controlplane.reservations.models import Reservation, ReservationEvent
from nodeagent.runtime.jupyterimage import DEFAULT_TAG as JUPYTER_TAG
from nodeagent.runtime.jupyterimage import ensure_jupyter_image
from nodeagent.runtime.localimage import DEFAULT_TAG
from tests.e2e.fleet_support import Node, running, start_nodes, wait_for
from tests.e2e.proxy_support import Browser, ProxyThread, running_proxy
from tests.factories import ApiTokenFactory, UserFactory
from tests.reservations.fleet import project

pytestmark = [pytest.mark.docker, pytest.mark.faults, pytest.mark.django_db(transaction=True)]

# httpd on the container's own loopback: an index page, a CGI script that prints its environment (the headers
# that reached the app), and a 5 MiB file.
HTTPD = (
    "mkdir -p /www/cgi-bin && echo hello-from-the-container > /www/index.html && "
    "printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\nenv\\n' > /www/cgi-bin/env && "
    "chmod +x /www/cgi-bin/env && head -c 5242880 /dev/urandom > /www/big.bin && "
    "exec httpd -f -p 127.0.0.1:8080 -h /www"
)


@pytest.fixture
def nodes(transactional_db, live_server, docker_client, tmp_path: Path, eager_celery) -> Iterator[list[Node]]:  # type: ignore[no-untyped-def]
    yield from start_nodes(live_server, docker_client, tmp_path, count=1)


@pytest.fixture
def proxy(nodes: list[Node]) -> Iterator[ProxyThread]:
    with running_proxy() as running:
        yield running


class Api:
    def __init__(self, url: str, user: Any) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {ApiTokenFactory(user=user).plaintext}"}

    def post(self, path: str, body: dict[str, Any]) -> requests.Response:
        return requests.post(f"{self.url}/api/v1{path}", json=body, headers=self.headers, timeout=30)

    def get(self, path: str) -> requests.Response:
        return requests.get(f"{self.url}/api/v1{path}", headers=self.headers, timeout=30)


@pytest.fixture
def team(nodes: list[Node], live_server: Any) -> dict[str, Any]:
    owner, viewer, outsider = UserFactory(username="alice"), UserFactory(username="vera"), UserFactory(username="otto")
    project(owner=owner, viewer=viewer, slug="demo")
    project(owner=outsider, slug="elsewhere")
    return {name: Api(live_server.url, user) for name, user in (("alice", owner), ("vera", viewer), ("otto", outsider))}


def book(api: Api, *, minutes: float = 10, ports: list[dict[str, Any]] | None = None) -> Reservation:
    answer = api.post(
        "/reservations/",
        {
            "project": "demo",
            "name": "web",
            "spec": {"gpu_model": "H100-80GB", "gpu_count": 1},
            "window": {"start": "now", "duration": int(minutes * 60)},
            "container": {
                "image": DEFAULT_TAG,
                "command": ["sh", "-c", HTTPD],
                "ports": ports if ports is not None else [{"name": "web", "port": 8080}],
            },
        },
    )
    assert answer.status_code == 201, answer.text
    return Reservation.objects.get(public_id=answer.json()["id"])


def open_link(api: Api, r: Reservation, port: str = "web", **extra: Any) -> requests.Response:
    return api.post(f"/reservations/{r.public_id}/open/", {"port": port, **extra})


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=1)
def test_an_owner_opens_the_app_and_nobody_else_does(team: dict[str, Any], proxy: ProxyThread) -> None:
    alice, vera, otto = team["alice"], team["vera"], team["otto"]
    r = running(book(alice))
    detail = alice.get(f"/reservations/{r.public_id}/").json()
    assert detail["ports"] == [{"name": "web", "port": 8080, "protocol": "http", "path": "/", "auth": "none"}]
    assert detail["access"]["terminal"] is True
    [web] = detail["access"]["web"]
    assert web["url"] == f"http://{r.public_id}-web.localhost:{proxy.port}/"

    opened = open_link(alice, r)
    assert opened.status_code == 200, opened.text
    link = opened.json()["url"]
    browser = Browser()
    page = browser.get(link)  # the link sets the app's cookie and lands on /
    assert (page.status_code, page.text) == (200, "hello-from-the-container\n")

    # What reached the app: its own Host, the other cookies, and never the proxy's cookie.
    env = browser.get(f"{web['url']}cgi-bin/env", headers={"Cookie": "theirs=1"}).text
    assert f"HTTP_HOST={r.public_id}-web.localhost:{proxy.port}" in env
    assert "theirs=1" in env and "gpucp_app" not in env

    # A 5 MiB answer streams through whole.
    big = browser.get(f"{web['url']}big.bin")
    assert big.status_code == 200 and len(big.content) == 5 * 1024 * 1024

    # The link was good once; without the cookie the app is not found; the viewer and another tenant get 404.
    assert Browser().get(link).status_code == 404
    assert Browser().get(web["url"]).status_code == 404
    assert open_link(vera, r).status_code == 404
    assert open_link(otto, r).status_code == 404
    assert vera.post(f"/reservations/{r.public_id}/terminal/", {}).status_code == 404
    # An unknown port is the caller's mistake, named.
    unknown = open_link(alice, r, port="nope")
    assert unknown.status_code == 400 and unknown.json()["error"]["fields"]["port"]

    # The opening is an event on the reservation, and the proxy's gateway session is told apart from SSH.
    opened_event = ReservationEvent.objects.get(reservation=r, data__kind="web_app")
    assert opened_event.data["user"] == "alice" and opened_event.data["port"] == "web"
    session = wait_for(
        lambda: ReservationEvent.objects.filter(reservation=r, data__kind="ssh_session", data__via="portal").first(),
        what="the gateway's session event",
    )
    assert session.data["user"] == "alice" and "forward" in (session.data.get("kinds") or ["forward"])


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=1)
def test_after_the_window_the_app_is_gone(team: dict[str, Any], proxy: ProxyThread) -> None:
    alice = team["alice"]
    r = running(book(alice, minutes=0.3))
    browser = Browser()
    assert browser.get(open_link(alice, r).json()["url"]).status_code == 200
    ends_at = Reservation.objects.get(pk=r.pk).ends_at
    wait_for(lambda: timezone.now() > ends_at + timedelta(seconds=0.5), what="the window's end")
    gone = browser.get(f"http://{r.public_id}-web.localhost:{proxy.port}/")
    assert gone.status_code == 410
    assert open_link(alice, r).status_code == 410


async def _terminal(url: str, typed: bytes, *, until_closed: bool, timeout: float = 60) -> tuple[str, int | None]:
    """Connect the web terminal, type, and read what it shows: until the typed command's answer (``until_closed``
    False: the output holds a line starting "gpus=") or until the proxy closes it. Answers (output, close code)."""
    out = b""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=10)) as ws,
    ):
        await ws.send_str(json.dumps({"type": "resize", "cols": 120, "rows": 40}))
        await ws.send_bytes(typed)
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            assert remaining > 0, f"the terminal showed: {out!r}"
            msg = await ws.receive(timeout=remaining)
            if msg.type == aiohttp.WSMsgType.BINARY:
                out += msg.data
                if not until_closed and b"\ngpus=" in out.replace(b"\r", b""):
                    return out.decode(errors="replace"), None
            elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                return out.decode(errors="replace"), ws.close_code


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=1)
def test_the_web_terminal_is_a_shell_on_the_reservations_gpus(team: dict[str, Any], proxy: ProxyThread) -> None:
    alice, otto = team["alice"], team["otto"]
    r = running(book(alice))
    launch = Launch.objects.get(reservation=r, state="running")
    link = alice.post(f"/reservations/{r.public_id}/terminal/", {})
    assert link.status_code == 200, link.text
    assert link.json()["url"].startswith(f"ws://localhost:{proxy.port}/_gpucp/terminal?token=")
    shown, _ = asyncio.run(_terminal(link.json()["url"], b"echo gpus=$NVIDIA_VISIBLE_DEVICES\n", until_closed=False))
    assert f"gpus={','.join(launch.gpu_uuids)}" in shown.replace("\r", "")
    # The link was good once; another tenant gets no link at all.
    _, code = asyncio.run(_terminal(link.json()["url"], b"", until_closed=True))
    assert code == 4404
    assert otto.post(f"/reservations/{r.public_id}/terminal/", {}).status_code == 404
    assert ReservationEvent.objects.filter(reservation=r, data__kind="web_terminal", data__user="alice").count() == 1
    session = wait_for(
        lambda: ReservationEvent.objects.filter(
            reservation=r, data__kind="ssh_session", data__via="portal", data__phase="close"
        ).first(),
        what="the terminal's session event",
    )
    assert "shell" in session.data["kinds"]


@override_settings(DISPATCH_WARN_BEFORE_S=8, DISPATCH_STOP_GRACE_S=1)
def test_the_web_terminal_is_warned_and_closed_at_the_windows_end(team: dict[str, Any], proxy: ProxyThread) -> None:
    alice = team["alice"]
    r = running(book(alice, minutes=0.4))  # a 24 s window
    assert (Reservation.objects.get(pk=r.pk).ends_at - timezone.now()).total_seconds() > 8
    url = alice.post(f"/reservations/{r.public_id}/terminal/", {}).json()["url"]
    shown, code = asyncio.run(_terminal(url, b"echo waiting\n", until_closed=True))
    assert code == 4410, shown
    assert "ends in" in shown and "ended at" in shown


async def _run_cell(browser: Browser, app: str, code: str) -> str:
    """Start a kernel through the proxy, run ``code`` over the kernel's WebSocket through the proxy, and answer
    what it printed. The browser's cookies go with both, as a page's would."""
    host = app.split("//", 1)[1].rstrip("/")
    cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.get(host, {}).items())
    port = host.rsplit(":", 1)[1]
    kernel = browser.request("POST", f"{app}api/kernels", json={"name": "python3"})
    assert kernel.status_code == 201, kernel.text
    url = f"ws://127.0.0.1:{port}/api/kernels/{kernel.json()['id']}/channels"
    headers = {"Host": host, "Origin": app.rstrip("/"), "Cookie": cookie}
    msg_id = uuid.uuid4().hex
    out: list[str] = []
    async with aiohttp.ClientSession() as session, session.ws_connect(url, headers=headers) as ws:
        await ws.send_str(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": uuid.uuid4().hex,
                       "username": "test", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))  # fmt: skip
        replied = idle = False
        while not (replied and idle):
            msg = json.loads(await ws.receive_str(timeout=60))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            replied = replied or kind == "execute_reply"
            idle = idle or (kind == "status" and msg["content"]["execution_state"] == "idle")
    return "".join(out)


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=1)
def test_jupyterlab_opens_signed_in_and_runs_a_cell(
    team: dict[str, Any], proxy: ProxyThread, docker_client: Any
) -> None:
    ensure_jupyter_image(docker_client)
    alice = team["alice"]
    ports = [{"name": "jupyter", "port": 8888, "path": "/lab", "auth": "jupyter"}]
    answer = alice.post(
        "/reservations/",
        {
            "project": "demo", "name": "lab", "spec": {"gpu_model": "H100-80GB", "gpu_count": 1},
            "window": {"start": "now", "duration": 600},
            "container": {"image": JUPYTER_TAG, "ports": ports},
        },
    )  # fmt: skip
    assert answer.status_code == 201, answer.text
    r = running(Reservation.objects.get(public_id=answer.json()["id"]))
    app = f"http://{r.public_id}-jupyter.localhost:{proxy.port}/"
    browser = Browser()
    link = open_link(alice, r, port="jupyter").json()["url"]
    assert "next=" not in link  # the port's path travels inside the signed token
    # The server may still be starting in its container: Open again until the lab answers.
    lab = browser.get(link)
    deadline = timezone.now() + timedelta(seconds=60)
    while lab.status_code != 200 and timezone.now() < deadline:
        lab = browser.get(f"{app}lab")
    assert lab.status_code == 200 and "JupyterLab" in lab.text, lab.text[:500]

    # Signed in by the proxy (no token anywhere in the browser): the kernel runs a cell over its WebSocket.
    assert asyncio.run(_run_cell(browser, app, "print(6*7)")) == "42\n"
    # A file goes up and comes back.
    content = {"type": "file", "format": "text", "content": "uploaded through the proxy"}
    up = browser.request("PUT", f"{app}api/contents/hello.txt", json=content)
    assert up.status_code in (200, 201), up.text
    down = browser.get(f"{app}files/hello.txt")
    assert (down.status_code, down.text) == (200, "uploaded through the proxy")
    # Without the proxy's cookie nothing reaches the lab, token or not.
    assert Browser().get(f"{app}api/status").status_code == 404

    # The window ends (a cancel during it ends it now): an open kernel WebSocket is closed, the lab is gone.
    async def held_until_closed() -> int | None:
        host = app.split("//", 1)[1].rstrip("/")
        cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.get(host, {}).items())
        kernel = browser.request("POST", f"{app}api/kernels", json={"name": "python3"}).json()["id"]
        url = f"ws://127.0.0.1:{proxy.port}/api/kernels/{kernel}/channels"
        headers = {"Host": host, "Origin": app.rstrip("/"), "Cookie": cookie}
        async with aiohttp.ClientSession() as session, session.ws_connect(url, headers=headers) as ws:
            cancelled = await asyncio.to_thread(alice.post, f"/reservations/{r.public_id}/cancel/", {"reason": "done"})
            assert cancelled.status_code == 200, cancelled.text
            while (await ws.receive(timeout=30)).type not in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                pass
            return ws.close_code

    assert asyncio.run(held_until_closed()) == 4410
    assert browser.get(f"{app}lab").status_code == 410
