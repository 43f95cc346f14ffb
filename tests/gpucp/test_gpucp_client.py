"""The API client: a lost answer is retried under the same Idempotency-Key, and failures get their exit codes."""

from __future__ import annotations

import json
import socket
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpucp_support import FaultyProxy, Gpucp, World, invoke

from controlplane.reservations.models import Reservation
from gpucp.errors import EXIT_CODES_HELP

BOOK = ("--json", "book", "--gpus", "2", "--model", "H100-80GB", "--hours", "1", "--image", "gpucp-busybox:test")


def test_a_booking_whose_answer_was_lost_is_retried_with_the_same_key_and_books_once(gpucp: Gpucp, world: World):
    # The first two requests of `book` read /me (the default project) and pass; the booking's answer is lost.
    with FaultyProxy(world.url, ["pass", "drop"]) as proxy:
        result = gpucp(*BOOK, server=proxy.url)
    assert result.exit_code == 0, result.output
    posts = [(target, key) for method, target, key in proxy.seen if method == "POST"]
    assert len(posts) == 2 and posts[0] == posts[1] and posts[0][1]
    assert Reservation.objects.count() == 1
    assert json.loads(result.stdout)["id"] == str(Reservation.objects.get().public_id)


def test_a_bad_gateway_is_retried(gpucp: Gpucp, world: World):
    with FaultyProxy(world.url, ["bad_gateway", "bad_gateway"]) as proxy:
        result = gpucp("--json", "whoami", server=proxy.url)
    assert result.exit_code == 0, result.output
    assert len(proxy.seen) == 3


def test_a_server_that_keeps_failing_exits_5_with_what_it_said(gpucp: Gpucp, world: World):
    with FaultyProxy(world.url, ["bad_gateway"] * 3) as proxy:
        result = gpucp("whoami", server=proxy.url)
    assert result.exit_code == 5
    assert "HTTP 502 from" in result.stderr and "502 Bad Gateway" in result.stderr
    assert len(proxy.seen) == 3  # three attempts, then it gives up


def test_an_unreachable_server_exits_5_at_once(gpucp: Gpucp, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pauses: list[float] = []
    # Only the client's own view of the clock: the live server's threads keep the real one.
    monkeypatch.setattr("gpucp.client.time", types.SimpleNamespace(sleep=pauses.append))
    result = gpucp("whoami", server=f"http://127.0.0.1:{port}")
    assert result.exit_code == 5
    assert "Cannot reach http://127.0.0.1:" in result.stderr and "(unreachable)" in result.stderr
    # Connection refused: the request never left, so it is not retried (no backoff pause at all).
    assert pauses == []
    body = json.loads(gpucp("--json", "whoami", server=f"http://127.0.0.1:{port}").stderr)
    assert body["error"]["code"] == "unreachable"


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        page = b"<html><body>Welcome to nginx!</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_site_that_is_not_the_api_exits_5(gpucp: Gpucp):
    site = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        result = gpucp("whoami", server=f"http://127.0.0.1:{site.server_port}")
    finally:
        site.shutdown()
        site.server_close()
        thread.join(timeout=10)
    assert result.exit_code == 5
    assert "answered HTTP 200 without JSON: is it the GPU control plane? (not_the_api)" in result.stderr


def test_not_logged_in_exits_3(config_home: object):
    result = invoke(["ls"])
    assert result.exit_code == 3
    assert result.stderr == "gpucp: Not logged in: run `gpucp login` (or set GPUCP_TOKEN). (not_logged_in)\n"


def test_help_lists_the_exit_codes(config_home: object):
    result = invoke(["--help"])
    assert result.exit_code == 0
    shown = [line.strip() for line in result.stdout.splitlines()]
    for line in EXIT_CODES_HELP.splitlines()[1:]:
        assert line.strip() in shown
    for command in ("login", "logout", "whoami", "gpus", "book", "ls", "show", "extend", "cancel", "usage"):
        assert f"\n  {command} " in result.stdout
