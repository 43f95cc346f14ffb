"""A body sent ``Transfer-Encoding: chunked`` (no Content-Length) is read where the server de-chunks it
(gunicorn, the production server: ``wsgi.input_terminated``) and refused with a 411 in the API's error shape
where it does not (Django's development and test servers); never read as empty, which made every field
"required" (issue 22). controlplane/core/api/middleware.py.

Over real HTTP both ways: a real gunicorn serving the test database, and the live server tests use, each sent
chunked bodies by ``requests`` (a generator as the body), the agent's enrollment and heartbeat included.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import requests
from django.db import connection
from rest_framework.test import APIClient

from controlplane.inventory.models import Site
from tests.factories import ApiTokenFactory, OperatorFactory
from tests.fleet.helpers import enroll, h100_model, heartbeat
from tests.runsystem_support import ROOT, free_port

SITES = "/api/v1/sites/"
HEARTBEAT = "/api/v1/agent/heartbeat/"


def chunks(body: bytes, size: int = 7) -> Iterator[bytes]:
    """What ``requests`` sends chunked: a body it cannot measure in advance."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response.headers["Content-Type"].startswith("application/json")
    return response.json()["error"]  # type: ignore[no-any-return]


# --- through Django's test client, the WSGI environ as each kind of server builds it -----------------------


def _chunked_environ(body: bytes, *, terminated: bool) -> dict[str, Any]:
    # No CONTENT_LENGTH, as a server hands on a chunked request; the test client's own length is overridden.
    environ: dict[str, Any] = {"CONTENT_LENGTH": "", "HTTP_TRANSFER_ENCODING": "chunked"}
    if terminated:
        environ.update({"wsgi.input": io.BytesIO(body), "wsgi.input_terminated": True})
    return environ


@pytest.fixture
def operator(db: Any) -> APIClient:
    client = APIClient()
    operator: Any = OperatorFactory()
    client.force_authenticate(operator)
    return client


@pytest.mark.django_db
def test_a_chunked_body_the_server_de_chunked_is_read(operator: APIClient) -> None:
    body = json.dumps({"name": "chunked-site", "pue": "1.30"}).encode()
    response = operator.generic(
        "POST", SITES, body.decode(), content_type="application/json", **_chunked_environ(body, terminated=True)
    )
    assert response.status_code == 201, response.content
    assert str(Site.objects.get(name="chunked-site").pue) == "1.30"


@pytest.mark.django_db
def test_a_chunked_body_still_chunked_is_a_411_naming_content_length(operator: APIClient) -> None:
    body = json.dumps({"name": "never"}).encode()
    response = operator.generic(
        "POST", SITES, body.decode(), content_type="application/json", **_chunked_environ(body, terminated=False)
    )
    refused = error(response, 411)
    assert refused["code"] == "length_required"
    assert "Transfer-Encoding" in refused["message"] and "Content-Length" in refused["fields"]
    assert not Site.objects.exists()


@pytest.mark.django_db
def test_a_chunked_body_past_the_limit_is_a_413(operator: APIClient, settings: Any) -> None:
    settings.API_MAX_REQUEST_BYTES = 1024
    body = json.dumps({"name": "big", "location": "x" * 2000}).encode()
    response = operator.generic(
        "POST", SITES, body.decode(), content_type="application/json", **_chunked_environ(body, terminated=True)
    )
    assert error(response, 413)["limit_bytes"] == 1024
    assert not Site.objects.exists()


@pytest.mark.django_db
def test_outside_the_api_a_body_still_chunked_is_a_plain_411(client: Any) -> None:
    response = client.generic("POST", "/admin/login/", b"a=b", **_chunked_environ(b"a=b", terminated=False))
    assert response.status_code == 411


# --- over real HTTP -----------------------------------------------------------------------------------------


def _database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    user = quote(db.get("USER") or "", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


@pytest.fixture
def gunicorn(transactional_db: None, tmp_path: Any) -> Iterator[str]:
    """The production server, as runsystem and the image start it, on the test database."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DEBUG"}}
    env.update(DATABASE_URL=_database_url(), CONTROLPLANE_VAR_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "gunicorn", "controlplane.core.management.localwsgi:application",
            "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "2", "--log-level", "warning"]  # fmt: skip
    process = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"{base}/livez", timeout=30)  # a worker still loading the app is slow, not down
                break
            except requests.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    output = process.stdout.read().decode() if process.stdout else ""  # type: ignore[union-attr]
                    pytest.fail(f"gunicorn did not start:\n{output[-3000:]}")
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def _operator_token() -> str:
    return str(ApiTokenFactory(user=OperatorFactory()).plaintext)  # type: ignore[attr-defined]


def _post_chunked(url: str, body: bytes, token: str, session: requests.Session | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    response = (session or requests).post(url, data=chunks(body), headers=headers, timeout=30)
    assert response.request.headers.get("Transfer-Encoding") == "chunked"  # what was sent: no length
    assert "Content-Length" not in response.request.headers
    return response


def test_gunicorn_reads_a_chunked_booking_api_body_and_a_chunked_heartbeat(gunicorn: str) -> None:
    token = _operator_token()
    with requests.Session() as session:  # kept alive: the next request on it is read from the right place
        created = _post_chunked(f"{gunicorn}{SITES}", json.dumps({"name": "via-gunicorn"}).encode(), token, session)
        assert created.status_code == 201, created.text
        assert created.json()["name"] == "via-gunicorn"
        again = _post_chunked(f"{gunicorn}{SITES}", json.dumps({"name": "second"}).encode(), token, session)
        assert again.status_code == 201, again.text
    assert set(Site.objects.values_list("name", flat=True)) == {"via-gunicorn", "second"}

    h100_model()
    server, credential = enroll("chunky")
    beat = json.dumps(heartbeat("chunky", gpus=[])).encode()
    answered = _post_chunked(f"{gunicorn}{HEARTBEAT}", beat, credential)
    assert answered.status_code == 200, answered.text
    assert answered.json()["server"] == "chunky"  # the node's desired state: the heartbeat was read
    server.refresh_from_db()
    assert server.last_heartbeat_seq == 1


def test_gunicorn_refuses_a_chunked_body_past_the_limit_in_the_shape(gunicorn: str) -> None:
    body = json.dumps({"name": "huge", "location": "x" * 2_000_000}).encode()
    refused = error(_post_chunked(f"{gunicorn}{SITES}", body, _operator_token()), 413)
    assert refused["code"] == "request_too_large" and "API_MAX_REQUEST_BYTES" in refused["message"]
    assert not Site.objects.exists()


def test_the_test_server_refuses_chunked_bodies_with_a_411_in_the_shape(live_server: Any) -> None:
    token = _operator_token()
    refused = error(_post_chunked(f"{live_server.url}{SITES}", json.dumps({"name": "x"}).encode(), token), 411)
    assert refused["code"] == "length_required" and "Content-Length" in refused["fields"]
    assert not Site.objects.exists()
    _, credential = enroll("chunky-dev")
    beat = json.dumps(heartbeat("chunky-dev", gpus=[])).encode()
    assert error(_post_chunked(f"{live_server.url}{HEARTBEAT}", beat, credential), 411)["code"] == "length_required"
