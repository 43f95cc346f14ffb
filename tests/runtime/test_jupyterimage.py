"""The local JupyterLab image: a real server, with no network but loopback, spoken to from inside its container.

The client below runs under the image's own Python (``docker exec``), with tornado's HTTP and WebSocket clients, as
a reverse proxy would reach the server: Host ``abc-jupyter.localhost:8001``, the token in ``Authorization`` (a
script's way), or the login cookie a browser gets by opening ``/lab?token=...`` (a browser's way, where the
WebSocket's ``Origin`` must match the ``Host``). One container serves the module (each creation copies the whole
image with the vfs storage driver): its own command runs as a non-root user; a second server runs in it as root.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator

import pytest

from nodeagent.runtime import jupyterimage, localimage
from nodeagent.runtime.containers import LABEL_NODE

pytestmark = pytest.mark.docker

PROXIED_HOST = "abc-jupyter.localhost:8001"
TOKEN = secrets.token_hex(16)

# argv: port, token, Host. Waits for the server, then prints one JSON object of what it saw.
CLIENT = r"""
import asyncio, json, sys, time, uuid
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

port, token, host = sys.argv[1:4]
BASE = f"127.0.0.1:{port}"
AUTH = {"Authorization": f"token {token}", "Host": host}
http = AsyncHTTPClient()


async def fetch(path, headers, method="GET", body=None):
    request = HTTPRequest(f"http://{BASE}{path}", method=method, headers=headers, body=body, follow_redirects=False)
    response = await http.fetch(request, raise_error=False)
    return response.code, response.body.decode(errors="replace")


async def ws_connect(path, origin, auth):
    request = HTTPRequest(f"ws://{BASE}{path}", headers={**auth, "Host": host, "Origin": origin})
    try:
        return await websocket_connect(request), None
    except HTTPClientError as exc:
        return None, exc.code


async def run_cell(kernel, code, auth):
    conn, refused = await ws_connect(f"/api/kernels/{kernel}/channels", f"http://{host}", auth)
    if conn is None:
        return f"refused {refused}"
    msg_id = uuid.uuid4().hex
    conn.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": uuid.uuid4().hex,
                   "username": "test", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    }))
    out, replied, idle = [], False, False
    while not (replied and idle):
        raw = await asyncio.wait_for(conn.read_message(), 20)
        if raw is None:
            return "closed"
        msg = json.loads(raw)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "error":
            out.append("error: " + msg["content"]["ename"])
        replied = replied or kind == "execute_reply"
        idle = idle or (kind == "status" and msg["content"]["execution_state"] == "idle")
    conn.close()
    return "".join(out)


async def main():
    deadline = time.monotonic() + 30
    while True:
        try:
            await fetch("/api/status", AUTH)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    seen = {}
    seen["status"] = (await fetch("/api/status", AUTH))[0]
    seen["no_token"] = (await fetch("/api/status", {"Host": host}))[0]
    seen["wrong_token"] = (await fetch("/api/status", {**AUTH, "Authorization": "token wrong"}))[0]
    code, body = await fetch("/api/kernels", {**AUTH, "Content-Type": "application/json"}, "POST", "{}")
    seen["kernel_started"] = code
    kernel = json.loads(body)["id"]
    seen["cell"] = await run_cell(kernel, "print(6*7)", AUTH)
    # A browser: the token in the URL once, then the login cookie the server set.
    response = await http.fetch(HTTPRequest(f"http://{BASE}/lab?token={token}", headers={"Host": host}))
    cookie = {"Cookie": "; ".join(c.split(";")[0] for c in response.headers.get_list("Set-Cookie"))}
    seen["cookie_status"] = (await fetch("/api/status", {**cookie, "Host": host}))[0]
    seen["cookie_cell"] = await run_cell(kernel, "print(6*7)", cookie)
    channels = f"/api/kernels/{kernel}/channels"
    seen["foreign_origin"] = (await ws_connect(channels, "http://elsewhere.example", cookie))[1]
    upload = json.dumps({"type": "file", "format": "text", "content": "uploaded\n"})
    seen["upload"] = (await fetch(f"/api/contents/hello-{port}.txt", AUTH, "PUT", upload))[0]
    seen["download"] = await fetch(f"/files/hello-{port}.txt", AUTH)
    print(json.dumps(seen))


asyncio.run(main())
"""


@pytest.fixture(scope="module")
def lab(docker_client, jupyter_image: str) -> Iterator:  # type: ignore[no-untyped-def]
    """A container of the image with its own command, as the non-root user, no network, a token."""
    container = docker_client.containers.run(
        jupyter_image,
        detach=True,
        network_mode="none",
        user=f"{jupyterimage.USER_ID}:{jupyterimage.USER_ID}",
        environment={"JUPYTER_TOKEN": TOKEN},
        labels={LABEL_NODE: f"test-{uuid.uuid4().hex[:10]}"},
    )
    try:
        yield container
    finally:
        container.remove(force=True)


def client_run(container, port: int) -> dict:  # type: ignore[no-untyped-def]
    result = container.exec_run(["python", "-c", CLIENT, str(port), TOKEN, PROXIED_HOST])
    assert result.exit_code == 0, result.output.decode() + container.logs().decode()[-3000:]
    return json.loads(result.output.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_image_has_a_shell_and_a_python_with_its_native_modules(lab) -> None:  # type: ignore[no-untyped-def]
    check = "import ssl, sqlite3, zmq, ctypes, lzma, bz2, uuid, readline; print(ssl.OPENSSL_VERSION.split()[0])"
    result = lab.exec_run(["sh", "-c", f'ls /bin/cat >/dev/null && python -c "{check}" && jupyter lab --version'])

    assert result.exit_code == 0, result.output.decode()
    assert result.output.decode().split()[0] == "OpenSSL"
    assert result.output.decode().split()[1].startswith("4.")


def test_building_twice_reuses_the_image(docker_client, jupyter_image) -> None:  # type: ignore[no-untyped-def]
    first = jupyterimage.ensure_jupyter_image(docker_client, jupyter_image)
    again = jupyterimage.ensure_jupyter_image(docker_client, jupyter_image)

    assert first == again
    label = docker_client.images.get(jupyter_image).labels[localimage.VERSION_LABEL]
    assert label == jupyterimage.version(localimage.find_busybox())


@pytest.mark.slow
@pytest.mark.parametrize("user", ["non-root", "root"])
def test_lab_serves_the_proxied_host_runs_a_cell_and_stores_files(lab, user: str) -> None:  # type: ignore[no-untyped-def]
    if user == "non-root":
        port = jupyterimage.PORT  # the image's own command, the container's process
    else:
        port = jupyterimage.PORT + 1
        lab.exec_run(jupyterimage.command(port), user="0", detach=True)
    seen = client_run(lab, port)

    assert seen["status"] == 200
    assert seen["no_token"] == 403 and seen["wrong_token"] == 403
    assert seen["kernel_started"] == 201
    assert seen["cell"] == "42\n"
    assert seen["cookie_status"] == 200
    assert seen["cookie_cell"] == "42\n"
    assert seen["foreign_origin"] == 403
    assert seen["upload"] == 201
    assert seen["download"] == [200, "uploaded\n"]
