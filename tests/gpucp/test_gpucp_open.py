"""``gpucp open``, ``book --port`` and the ports of ``show``, against a live server.

A running reservation is made as the dispatch tests make one: booked through the CLI, its window opened and
its launch reported running by the agent's report, on a server whose facts carry an SSH gateway (the web proxy
goes through it). The one-time link is printed, not followed, so no proxy runs here; its token is read back
with the control plane's own reader, which the proxy uses. The proxy itself is tests/e2e/test_web_proxy.py.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone
from gpucp_support import Gpucp, World, token_of, user

import gpucp as gpucp_package
from controlplane.access.web import links
from controlplane.accounts.choices import Role
from controlplane.accounts.models import Membership
from controlplane.reservations.models import Reservation
from gpucp.client import Api, path
from tests.access.test_connect import HOST_KEY, running

IMAGE = "gpucp-busybox:test"
GATEWAY_FACTS = {
    "ssh": {"port": 2222, "host_key": HOST_KEY, "address": "127.0.0.1"},
    "command_url": "http://127.0.0.1:1",
}


def book(gpucp: Gpucp, *extra: str) -> dict[str, Any]:
    result = gpucp("--json", "book", "--gpus", "1", "--model", "H100-80GB", "--hours", "1", "--image", IMAGE, *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def run(world: World, detail: dict[str, Any], *, gateway: bool = True) -> Reservation:
    """The reservation's container running on the world's server, whose agent runs a gateway (or none)."""
    srv = world.server
    if gateway:
        srv.facts = {**(srv.facts or {}), "hostname": srv.hostname, **GATEWAY_FACTS}
        srv.save(update_fields=["facts"])
    reservation = Reservation.objects.get(public_id=detail["id"])
    running(reservation, srv)
    return reservation


def claims(url: str) -> links.Claims:
    """What the link's token says, read as the proxy reads it."""
    [token] = parse_qs(urlsplit(url).query)["token"]
    found = links.read_link(token, now=timezone.now())
    assert found is not None, f"the link's token does not verify: {url}"
    return found


def app_urls(gpucp: Gpucp, reservation_id: str) -> dict[str, str]:
    detail = json.loads(gpucp("--json", "show", reservation_id).stdout)["reservation"]
    return {app["name"]: app["url"] for app in detail["access"]["web"]}


# -- open -------------------------------------------------------------------------------------------------


def test_open_prints_the_apis_one_time_link_for_the_port_named(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--port", "jupyter:8888:/lab", "--port", "tensorboard:6006")
    run(world, detail)
    result = gpucp("open", detail["id"], "jupyter")
    assert result.exit_code == 0, result.output
    [url] = result.stdout.splitlines()
    assert result.stderr == ""  # the note on how long it is good is for a terminal only
    app = app_urls(gpucp, detail["id"])["jupyter"]
    assert url.startswith(f"{app}_gpucp/login?token=")
    got = claims(url)
    assert (got.reservation, got.port, got.next, got.user_id) == (detail["id"], "jupyter", "/lab", world.owner.pk)
    # --path lands elsewhere on the same app.
    other = gpucp("open", detail["id"], "jupyter", "--path", "/tree/data")
    assert other.exit_code == 0, other.output
    assert claims(other.stdout.strip()).next == "/tree/data"
    assert other.stdout.strip() != url  # each link is a new one-time link


def test_open_json_is_the_apis_answer(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--port", "web:8080")
    run(world, detail)
    before = timezone.now()
    result = gpucp("--json", "open", detail["id"], "web")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert set(answer) == {"name", "url", "app_url", "expires_at"}
    assert answer["name"] == "web" and answer["app_url"] == app_urls(gpucp, detail["id"])["web"]
    assert claims(answer["url"]).port == "web"
    expires = datetime.fromisoformat(answer["expires_at"])
    assert before < expires <= before + timedelta(seconds=61)


def test_open_without_a_name_opens_the_only_web_port(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--port", "jupyter:8888:/lab")
    run(world, detail)
    result = gpucp("open", detail["id"])
    assert result.exit_code == 0, result.output
    got = claims(result.stdout.strip())
    assert (got.port, got.next) == ("jupyter", "/lab")


def test_open_without_a_name_counts_only_http_ports(gpucp: Gpucp, world: World):
    # A tcp port (booked through the API: the CLI's --port books http ones) is not a web port.
    api = Api(world.url, world.token)
    body = {
        "project": "demo", "name": "mixed", "spec": {"gpu_model": "H100-80GB", "gpu_count": 1},
        "window": {"start": "now", "duration": 3600},
        "container": {"image": IMAGE, "ports": [{"name": "db", "port": 5432, "protocol": "tcp"},
                                                {"name": "web", "port": 8080}]},
    }  # fmt: skip
    detail = api.post(path("reservations"), body)
    run(world, detail)
    result = gpucp("open", detail["id"])
    assert result.exit_code == 0, result.output
    assert claims(result.stdout.strip()).port == "web"
    tcp = gpucp("open", detail["id"], "db")
    assert tcp.exit_code == 1
    assert "db is a tcp port" in tcp.stderr and "(validation_error)" in tcp.stderr
    only_tcp = dict(body, name="tcp", container={"image": IMAGE, "ports": [body["container"]["ports"][0]]})
    second = api.post(path("reservations"), only_tcp)
    refused = gpucp("open", second["id"])
    assert refused.exit_code == 1
    assert "declares no web ports" in refused.stderr and "db (5432/tcp)" in refused.stderr


def test_open_without_a_name_among_several_web_ports_is_a_usage_error(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--port", "jupyter:8888", "--port", "tensorboard:6006")
    run(world, detail)
    result = gpucp("open", detail["id"])
    assert result.exit_code == 2
    assert "The reservation has 2 web ports (jupyter, tensorboard): name the one to open." in result.stderr
    assert result.stdout == ""


def test_open_of_a_reservation_without_ports_says_so(gpucp: Gpucp, world: World):
    detail = book(gpucp)
    run(world, detail)
    result = gpucp("open", detail["id"])
    assert result.exit_code == 1
    assert result.stderr == (
        "gpucp: The reservation declares no web ports (book with --port NAME:PORT). (no_web_ports)\n"
    )
    body = json.loads(gpucp("--json", "open", detail["id"]).stderr)
    assert body["error"]["code"] == "no_web_ports"


def test_open_of_a_port_it_does_not_have_exits_1_naming_the_field(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--port", "jupyter:8888")
    run(world, detail)
    result = gpucp("--json", "open", detail["id"], "nope")
    assert result.exit_code == 1
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "validation_error" and "port" in error["fields"]
    assert "jupyter" in error["fields"]["port"][0]


def test_a_viewer_and_another_tenant_read_not_found(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--port", "jupyter:8888")
    run(world, detail)
    viewer = user()
    Membership.objects.create(project=world.project, user=viewer, role=Role.VIEWER)
    _, viewer_token = token_of(viewer)
    for args in (("open", detail["id"], "jupyter"), ("open", detail["id"])):
        result = gpucp(*args, token=viewer_token)
        assert result.exit_code == 4, result.output
        assert "(not_found)" in result.stderr and result.stdout == ""
    _, outsider = token_of(user())
    assert gpucp("open", detail["id"], token=outsider).exit_code == 4


def test_a_reservation_not_running_yet_is_not_ready(gpucp: Gpucp, world: World):
    start = (timezone.now() + timedelta(hours=2)).replace(microsecond=0).isoformat()
    detail = book(gpucp, "--port", "jupyter:8888", "--start", start)
    result = gpucp("open", detail["id"])
    assert result.exit_code == 1
    assert "The window has not opened" in result.stderr and "(not_ready)" in result.stderr


def test_a_server_without_a_gateway_is_not_ready(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--port", "jupyter:8888")
    run(world, detail, gateway=False)
    result = gpucp("open", detail["id"], "jupyter")
    assert result.exit_code == 1
    assert "runs no SSH gateway" in result.stderr and "(not_ready)" in result.stderr


def test_an_ended_reservation_is_gone(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--port", "jupyter:8888")
    run(world, detail)
    assert gpucp("cancel", detail["id"]).exit_code == 0
    result = gpucp("open", detail["id"], "jupyter")
    assert result.exit_code == 1
    assert "The reservation has ended" in result.stderr and "(gone)" in result.stderr


def test_open_of_a_missing_reservation_exits_4(gpucp: Gpucp):
    assert gpucp("open", str(uuid.uuid4())).exit_code == 4
    assert gpucp("open", str(uuid.uuid4()), "jupyter").exit_code == 4


# gpucp as a process of its own (a terminal, a browser): `python -m gpucp` of the code under test.
GPUCP = [sys.executable, "-m", "gpucp"]
SOURCE = str(Path(gpucp_package.__file__).resolve().parents[1])


def cli_env(world: World, config_home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCP_") and k != "BROWSER"}
    return {**env, "PYTHONPATH": SOURCE, "XDG_CONFIG_HOME": str(config_home), "GPUCP_SERVER": world.url,
            "GPUCP_TOKEN": world.token, **extra}  # fmt: skip


def test_browser_opens_the_link_with_the_browser_named_in_BROWSER(
    gpucp: Gpucp, world: World, config_home: Path, tmp_path: Path
):
    """Python's webbrowser runs $BROWSER with the link: here a script that writes down what it was given."""
    detail = book(gpucp, "--port", "web:8080")
    run(world, detail)
    seen = tmp_path / "opened"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\n')
    browser.chmod(0o755)
    result = subprocess.run(
        [*GPUCP, "open", "--browser", detail["id"]],
        env=cli_env(world, config_home, BROWSER=str(browser)), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert seen.read_text() == result.stdout  # the browser got the printed link, and only it
    assert claims(result.stdout.strip()).port == "web"


def test_on_a_terminal_stderr_says_how_long_the_link_is_good(gpucp: Gpucp, world: World, config_home: Path):
    detail = book(gpucp, "--port", "web:8080")
    run(world, detail)
    env = cli_env(world, config_home)
    controller, terminal = pty.openpty()
    try:
        done = subprocess.run(
            [*GPUCP, "--utc", "open", detail["id"]], env=env, stdout=terminal, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, timeout=60,
        )  # fmt: skip
        os.close(terminal)
        printed = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the terminal's other end is closed and everything was read
                break
            if not chunk:
                break
            printed += chunk
    finally:
        os.close(controller)
    assert done.returncode == 0, done.stderr
    url = printed.decode().strip()
    assert claims(url).port == "web"
    note = done.stderr
    assert note.startswith("gpucp: good once, until ") and " UTC (in " in note
    assert note.rstrip().endswith(f"then the app is at {links.app_url(detail['id'], 'web')}")


# -- book --port and show -----------------------------------------------------------------------------------


def test_book_port_sends_the_named_ports(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--port", "jupyter:8888:/lab?reset", "--port", "tensorboard:6006")
    r = Reservation.objects.get(public_id=detail["id"])
    assert r.ports == [
        {"name": "jupyter", "port": 8888, "protocol": "http", "path": "/lab?reset", "auth": "none"},
        {"name": "tensorboard", "port": 6006, "protocol": "http", "path": "/", "auth": "none"},
    ]
    assert detail["ports"] == r.ports


@pytest.mark.parametrize("value", ["jupyter", "jupyter:", "jupyter:lab", ":8888", "jupyter:8888:", "jupyter:-1"])
def test_a_malformed_port_is_a_usage_error(gpucp: Gpucp, value: str):
    result = gpucp("book", "--model", "H100-80GB", "--hours", "1", "--image", IMAGE, "--port", value)
    assert result.exit_code == 2
    assert "is not NAME:PORT[:PATH]" in result.stderr and "--port" in result.stderr
    assert not Reservation.objects.exists()


def test_a_port_the_api_refuses_exits_1_naming_the_field(gpucp: Gpucp):
    result = gpucp("book", "--model", "H100-80GB", "--hours", "1", "--image", IMAGE, "--port", "terminal:70000")
    assert result.exit_code == 1
    assert "container.ports.0" in result.stderr and "(validation_error)" in result.stderr
    assert not Reservation.objects.exists()


def test_show_lists_the_ports_and_while_running_each_apps_address(gpucp: Gpucp, world: World):
    detail = book(gpucp, "--port", "jupyter:8888:/lab", "--port", "tensorboard:6006")
    before = gpucp("show", detail["id"]).stdout
    ports = before.split("Ports:\n")[1].split("\n\n")[0].splitlines()
    assert [line.split() for line in ports] == [
        ["NAME", "PORT", "PROTOCOL", "PATH", "URL"],
        ["jupyter", "8888", "http", "/lab", "-"],
        ["tensorboard", "6006", "http", "/", "-"],
    ]
    assert "gpucp open" not in before
    run(world, detail)
    after = gpucp("show", detail["id"]).stdout
    ports = after.split("Ports:\n")[1].split("\n\n")[0].splitlines()
    assert [line.split() for line in ports[1:3]] == [
        ["jupyter", "8888", "http", "/lab", links.app_url(detail["id"], "jupyter")],
        ["tensorboard", "6006", "http", "/", links.app_url(detail["id"], "tensorboard")],
    ]
    assert ports[3] == f"`gpucp open {detail['id']} NAME` signs the browser in to an app (a one-time link)."


def test_show_of_a_reservation_without_ports_has_no_ports_section(gpucp: Gpucp):
    detail = book(gpucp)
    assert "Ports:" not in gpucp("show", detail["id"]).stdout
