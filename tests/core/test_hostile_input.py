"""Hostile and careless input (issue 10, item 7): every refusal is a 4xx in the API's error shape that names
the field, nothing is written, and nothing under /api/ is ever answered with an HTML page.

The requests are those an outside black-box suite sent: NUL characters in slugs, paths, query parameters and
forms; JSON nested 100,000 levels deep; bodies of many megabytes; ids that are not UUIDs; environment variable
names with "=" in them. They run on SQLite and on PostgreSQL, which refuses NUL in text (the 500s were there).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.accounts.api.views import MeView
from controlplane.accounts.choices import Role
from controlplane.core.api.parsers import MAX_JSON_DEPTH
from controlplane.ledger.services import ledger_grant
from controlplane.reservations import services
from controlplane.reservations.choices import ReservationState
from nodeagent import schema
from tests.factories import ApiTokenFactory, OperatorFactory, ProjectFactory, UserFactory, member_of
from tests.reservations.fleet import CONTAINER, gpu_model, server, spec, window

pytestmark = pytest.mark.django_db


@dataclass
class World:
    owner: APIClient
    operator: APIClient
    project_pk: int
    done: str  # a finished reservation, for refunds

    def client(self, who: str) -> APIClient:
        return self.owner if who == "owner" else self.operator


def _client(user: Any) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory(user=user).plaintext}")
    return client


@pytest.fixture
def world(db: Any) -> World:
    project = ProjectFactory(slug="atlas", name="Atlas")
    owner = member_of(project, Role.OWNER, username="olive")
    UserFactory(username="sam")
    model = gpu_model()
    server(model, gpus=8)
    ledger_grant(project=project, amount=1000, actor=None, reason="hostile input")
    done = services.reservation_create(
        project=project,
        name="done",
        spec=spec(model),
        window=window(start_in=timedelta(hours=5)),
        container=CONTAINER,
        actor=owner,
    )
    services.reservation_finish(
        reservation=done,
        to=ReservationState.COMPLETED,
        ended_at=done.ends_at,
        actor_label="system:test",
        reason="test",
    )
    return World(_client(owner), _client(OperatorFactory(username="opal")), project.pk, str(done.public_id))


def booking(**changes: Any) -> dict[str, Any]:
    start = timezone.now() + timedelta(hours=1)
    body: dict[str, Any] = {
        "project": "atlas",
        "name": "train",
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 1},
        "window": {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()},
        "container": {"image": "registry/train:1", "command": ["python", "t.py"], "env": {"A": "1"}},
    }
    for part, value in changes.items():
        if part in ("spec", "window", "container"):
            body[part] = {**body[part], **value}
        else:
            body[part] = value
    return body


def rows() -> dict[str, int]:
    """How many rows every table holds: a refused request changes none of them."""
    return {model._meta.label: model.objects.count() for model in apps.get_models()}


def refused(response: Any, status: int, field: str | None = None) -> dict[str, Any]:
    """The response is ``status`` in the API's error shape (JSON, never HTML), naming ``field`` if given."""
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    body = json.loads(response.content)
    assert set(body) == {"error"}
    error = body["error"]
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["fields"], dict)
    if field is not None:
        assert field in error["fields"], error
    return dict(error)


@dataclass(frozen=True)
class Case:
    """One hostile request: who sends it, how, and the field its refusal must name."""

    label: str
    who: str
    method: str
    path: str | Callable[[World], str]
    body: Any
    field: str
    content_type: str = "application/json"

    def send(self, world: World) -> Any:
        path = self.path(world) if callable(self.path) else self.path
        body = self.body(world) if callable(self.body) else self.body
        data = body if isinstance(body, (str, bytes)) or body is None else json.dumps(body)
        return world.client(self.who).generic(self.method, path, data or "", content_type=self.content_type)

    def __str__(self) -> str:
        return self.label


NUL = "\x00"
FREE = "/api/v1/availability/free/?gpu_count=1&start=now&end=2099-01-01T00:00:00Z&gpu_model="
MEMBERS = "/api/v1/projects/{}/members/"

# Each answered 500 before (PostgreSQL: "text fields cannot contain NUL"), except where it was already a 400.
NUL_CASES = [
    Case("booking project", "owner", "POST", "/api/v1/reservations/", booking(project="a" + NUL), "project"),
    Case(
        "booking spec.gpu_model",
        "owner",
        "POST",
        "/api/v1/reservations/",
        booking(spec={"gpu_model": NUL}),
        "spec.gpu_model",
    ),
    Case("booking name", "owner", "POST", "/api/v1/reservations/", booking(name="a" + NUL), "name"),
    Case(
        "booking image", "owner", "POST", "/api/v1/reservations/", booking(container={"image": NUL}), "container.image"
    ),
    Case(
        "booking command",
        "owner",
        "POST",
        "/api/v1/reservations/",
        booking(container={"command": ["ok", NUL]}),
        "container.command.1",
    ),
    Case(
        "booking env value",
        "owner",
        "POST",
        "/api/v1/reservations/",
        booking(container={"env": {"A": NUL}}),
        "container.env.A",
    ),
    Case(
        "booking env name",
        "owner",
        "POST",
        "/api/v1/reservations/",
        booking(container={"env": {"A" + NUL: "1"}}),
        "container.env.A\\u0000",
    ),
    Case(
        "booking window.start",
        "owner",
        "POST",
        "/api/v1/reservations/",
        booking(window={"start": NUL}),
        "window.start",
    ),
    Case(
        "booking lone surrogate",
        "owner",
        "POST",
        "/api/v1/reservations/",
        booking(name="\ud800"),
        "name",
    ),
    Case(
        "form-encoded project",
        "owner",
        "POST",
        "/api/v1/reservations/",
        "project=%00&name=x",
        "project",
        "application/x-www-form-urlencoded",
    ),
    Case("path", "owner", "GET", "/api/v1/ledger/balances/x%00/", None, "path"),
    Case("query parameter", "owner", "GET", FREE + "%00", None, "gpu_model"),
    Case("query parameter name", "owner", "GET", FREE + "H100-80GB&a%00=1", None, "a\\u0000"),
    Case("project owner", "operator", "POST", "/api/v1/projects/", {"name": "x", "owner": NUL}, "owner"),
    Case("project name", "operator", "POST", "/api/v1/projects/", {"name": NUL, "owner": "sam"}, "name"),
    Case(
        "member username",
        "owner",
        "POST",
        lambda w: MEMBERS.format(w.project_pk),
        {"username": "sam" + NUL},
        "username",
    ),
    Case(
        "member role",
        "owner",
        "PATCH",
        lambda w: MEMBERS.format(w.project_pk) + "olive/",
        {"role": NUL},
        "role",
    ),
    Case(
        "ledger grant",
        "operator",
        "POST",
        "/api/v1/ledger/grants/",
        {"project": NUL, "amount": "1", "reason": "r"},
        "project",
    ),
    Case(
        "ledger adjustment",
        "operator",
        "POST",
        "/api/v1/ledger/adjustments/",
        {"project": "atlas", "amount": "1", "reason": NUL},
        "reason",
    ),
    Case(
        "ledger refund",
        "operator",
        "POST",
        "/api/v1/ledger/refunds/",
        lambda w: {"project": "atlas", "reservation": w.done + NUL, "amount": "1", "reason": "r"},
        "reservation",
    ),
    Case("token name", "owner", "POST", "/api/v1/tokens/", {"name": NUL}, "name"),
    Case("site", "operator", "POST", "/api/v1/sites/", {"name": NUL}, "name"),
    Case("join token note", "operator", "POST", "/api/v1/join-tokens/", {"note": NUL}, "note"),
]


@pytest.mark.parametrize("case", NUL_CASES, ids=str)
def test_nul_or_a_lone_surrogate_is_a_400_naming_the_field_and_writes_nothing(world: World, case: Case) -> None:
    before = rows()
    refused(case.send(world), 400, case.field)
    assert rows() == before


def _nested(levels: int, leaf: str = '"x"') -> str:
    return '{"a":' * levels + leaf + "}" * levels


@pytest.mark.parametrize(
    ("part", "raw"),
    [
        ("env", _nested(100_000)),
        ("command", "[" * 5_000 + "]" * 5_000),
    ],
    ids=["env-100000-levels", "command-5000-levels"],
)
def test_json_nested_past_the_limit_is_a_400_naming_where(world: World, part: str, raw: str) -> None:
    body = json.dumps(booking(container={part: "HERE"})).replace('"HERE"', raw, 1)
    before = rows()
    error = refused(world.owner.generic("POST", "/api/v1/reservations/", body, content_type="application/json"), 400)
    assert error["code"] == "validation_error"
    (path,) = error["fields"]
    assert path.startswith(f"container.{part}")
    assert error["fields"][path] == [f"Nested more than {MAX_JSON_DEPTH} levels deep."]
    assert rows() == before


def test_json_nested_to_the_limit_is_read(world: World) -> None:
    # The body is one level, container two: 30 more still fit, and the env refuses them as values, not depth.
    body = json.dumps(booking(container={"env": "HERE"})).replace('"HERE"', _nested(MAX_JSON_DEPTH - 3), 1)
    error = refused(world.owner.generic("POST", "/api/v1/reservations/", body, content_type="application/json"), 400)
    assert "container.env.a" in error["fields"]


@pytest.mark.parametrize(
    "body",
    [
        booking(name="x" * 3_000_000),
        booking(container={"image": "y" * 20_000_000}),
        booking(container={"env": {f"V{i}": "z" * 1000 for i in range(3_300)}}),
    ],
    ids=["3MB-name", "20MB-image", "3.3MB-env"],
)
@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "idempotency-key"])
def test_a_body_over_the_limit_is_a_413_in_the_shape_and_writes_nothing(
    world: World, body: dict[str, Any], keyed: bool
) -> None:
    headers = {"HTTP_IDEMPOTENCY_KEY": str(uuid.uuid4())} if keyed else {}
    before = rows()
    response = world.owner.post("/api/v1/reservations/", body, format="json", **headers)
    error = refused(response, 413, "body")
    assert error["code"] == "request_too_large"
    assert error["limit_bytes"] == settings.API_MAX_REQUEST_BYTES
    assert rows() == before


@override_settings(API_MAX_REQUEST_BYTES=2048)
def test_the_limit_is_the_setting(world: World) -> None:
    assert world.owner.post("/api/v1/reservations/", booking(), format="json").status_code == 201
    refused(world.owner.post("/api/v1/reservations/", booking(name="n" * 2048), format="json"), 413, "body")


def test_djangos_own_ceiling_never_refuses_what_the_api_or_the_heartbeat_accepts() -> None:
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE >= settings.API_MAX_REQUEST_BYTES
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE >= settings.FLEET_HEARTBEAT_MAX_BYTES


@override_settings(API_MAX_REQUEST_BYTES=1024)
def test_the_heartbeat_keeps_its_own_limit(db: Any) -> None:
    from tests.fleet.helpers import enroll, h100_model, heartbeat

    h100_model()
    _, credential = enroll("node-a")
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    body = json.dumps(heartbeat("node-a", samples_per_gpu=10))
    assert len(body) > 1024
    response = agent.generic("POST", "/api/v1/agent/heartbeat", body, content_type="application/json")
    assert response.status_code == 200, response.content[:300]
    # Over its own limit the heartbeat is refused by the fleet, naming FLEET_HEARTBEAT_MAX_BYTES.
    with override_settings(FLEET_HEARTBEAT_MAX_BYTES=1024):
        response = agent.generic("POST", "/api/v1/agent/heartbeat", body, content_type="application/json")
    assert refused(response, 413)["limit_bytes"] == 1024


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/reservations/not-a-uuid/",
        "/api/v1/reservations/1' OR '1'='1/",
        "/api/v1/reservations/1;DROP TABLE reservations_reservation;--/",
        "/api/v1/reservations/------------------------------------/",
        "/api/v1/reservations/zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz/cancel/",
        "/api/v1/reservations/not-a-uuid/launches/",
        "/api/v1/reservations/not-a-uuid/telemetry/",
        "/api/v1/ledger/entries/99999999999999999999999999/",
        "/api/v1/projects/99999999999999999999999999/",
        "/api/v1/no-such-endpoint/",
    ],
)
def test_an_id_that_is_not_one_is_the_same_json_404_as_a_missing_one(world: World, path: str) -> None:
    method = "POST" if path.endswith("cancel/") else "GET"
    missing_path = f"/api/v1/reservations/{uuid.uuid4()}/"
    missing = world.owner.get(missing_path)
    response = world.owner.generic(method, path, "{}", content_type="application/json")
    refused(response, 404)
    # Each names the path it was asked for (no more): with the path set aside, the bytes are the same.
    assert path in response.json()["error"]["message"]
    assert response.content.replace(path.encode(), b"<path>") == missing.content.replace(
        missing_path.encode(), b"<path>"
    )


@pytest.mark.parametrize("name", ["A=B", "", "1A", "A B", "A-B", "É", "x" * 257])
def test_an_env_name_that_is_not_a_variable_name_is_refused(world: World, name: str) -> None:
    body = booking(container={"env": {"OK": "1", name: "2"}})
    before = rows()
    error = refused(world.owner.post("/api/v1/reservations/", body, format="json"), 400)
    assert list(error["fields"]) == [f"container.env.{name}"]
    assert rows() == before


@pytest.mark.parametrize("name", ["A", "_", "lower_case", "PATH2", "X" * 256])
def test_a_variable_name_is_accepted(world: World, name: str) -> None:
    response = world.owner.post("/api/v1/reservations/", booking(container={"env": {name: "1"}}), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["env"] == {name: "1"}


@pytest.mark.parametrize(
    ("who", "path", "body", "field"),
    [
        ("owner", "/api/v1/reservations/", booking(container={"command": ["x" * 4097]}), "container.command.0"),
        ("owner", "/api/v1/reservations/", booking(container={"command": ["x"] * 257}), "container.command"),
        ("owner", "/api/v1/reservations/", booking(container={"env": {"A": "v" * 8193}}), "container.env.A"),
        (
            "owner",
            "/api/v1/reservations/",
            booking(container={"env": {f"V{i}": "" for i in range(257)}}),
            "container.env",
        ),
        ("owner", "/api/v1/reservations/", booking(container={"image": "i" * 513}), "container.image"),
        ("owner", "/api/v1/reservations/", booking(name="n" * 121), "name"),
        ("owner", "/api/v1/reservations/", booking(spec={"gpu_model": "m" * 65}), "spec.gpu_model"),
        ("owner", "/api/v1/reservations/", booking(window={"start": "2" * 65}), "window.start"),
        (
            "owner",
            "/api/v1/reservations/",
            booking(spec={"gpu_model": None, "min_memory_mib": 10**30}),
            "spec.min_memory_mib",
        ),
        ("owner", "/api/v1/reservations/", booking(spec={"gpu_count": 10**400}), "spec.gpu_count"),
        ("owner", "/api/v1/tokens/", {"name": "t" * 101}, "name"),
        ("operator", "/api/v1/projects/", {"name": "x", "owner": "sam", "description": "d" * 2001}, "description"),
        ("operator", "/api/v1/projects/", {"name": "x", "owner": "u" * 151}, "owner"),
        ("operator", "/api/v1/ledger/grants/", {"project": "p" * 81, "amount": "1", "reason": "r"}, "project"),
        ("operator", "/api/v1/sites/", {"name": "s" * 101}, "name"),
        ("operator", "/api/v1/join-tokens/", {"note": "n" * 201}, "note"),
    ],
)
def test_each_text_field_has_a_maximum_and_past_it_is_a_400(
    world: World, who: str, path: str, body: dict[str, Any], field: str
) -> None:
    before = rows()
    refused(world.client(who).post(path, body, format="json"), 400, field)
    assert rows() == before


@pytest.mark.parametrize(
    "raw",
    ['{"name": 1e400}', '{"name": NaN}', '{"name": -Infinity}', '{"name": ' + "9" * 5000 + "}", b'{"name": "\xff"}'],
    ids=["1e400", "NaN", "-Infinity", "5000-digits", "not-utf-8"],
)
def test_a_number_json_cannot_carry_or_a_body_that_is_not_utf8_is_a_400(world: World, raw: str | bytes) -> None:
    before = rows()
    error = refused(world.owner.generic("POST", "/api/v1/tokens/", raw, content_type="application/json"), 400)
    assert error["code"] == "parse_error"
    assert rows() == before


def test_the_largest_container_a_booking_takes_is_one_the_agent_runs() -> None:
    """The booking's bounds are the agent's (DesiredContainer): a booking accepted is never refused at launch."""
    from controlplane.reservations.api import serializers as s

    now = timezone.now()
    schema.DesiredContainer(
        launch_id="l" * 64,
        reservation=str(uuid.uuid4()),
        project="p" * 80,
        image="i" * s._IMAGE_MAX,
        command=["c" * s._ARG_MAX] * s._COMMAND_MAX,
        env={f"V{i}".ljust(s._ENV_NAME_MAX, "_"): "v" * s._ENV_VALUE_MAX for i in range(s._ENV_MAX)},
        gpu_uuids=["GPU-0"],
        window_start=now,
        window_end=now + timedelta(hours=1),
    )


def test_too_many_form_fields_is_a_400_in_the_shape(world: World) -> None:
    form = "&".join(f"f{i}=1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    response = world.owner.generic("POST", "/api/v1/tokens/", form, content_type="application/x-www-form-urlencoded")
    refused(response, 400)


def test_an_idempotency_key_with_nul_is_a_400_and_runs_nothing(world: World) -> None:
    before = rows()
    response = world.owner.post("/api/v1/tokens/", {"name": "t"}, format="json", HTTP_IDEMPOTENCY_KEY="k" + NUL)
    assert refused(response, 400, "Idempotency-Key")["code"] == "invalid_idempotency_key"
    assert rows() == before


# --- no HTML error page under /api/, ever -------------------------------------------------------------------
@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_an_unknown_api_path_is_a_json_404(world: World, debug: bool) -> None:
    with override_settings(DEBUG=debug):
        response = world.owner.get("/api/v1/nothing-here/")
    assert refused(response, 404)["code"] == "not_found"


@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_a_crash_is_a_json_500(world: World, monkeypatch: pytest.MonkeyPatch, debug: bool) -> None:
    def crash(self: Any, request: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(MeView, "get", crash)
    with override_settings(DEBUG=debug):
        response = world.owner.get("/api/v1/me/")
    error = refused(response, 500)
    assert error["code"] == "server_error"
    assert "a bug" not in response.content.decode()


def test_a_csrf_failure_is_a_json_403_saying_why(db: Any) -> None:
    client = APIClient(enforce_csrf_checks=True)
    response = client.post("/api/v1/auth/login/", {"username": "u", "password": "p"}, format="json")
    error = refused(response, 403, "X-CSRFToken")
    assert "CSRF" in error["message"]


def test_outside_the_api_error_pages_stay_html(db: Any) -> None:
    response = APIClient().get("/static/no-such-file.css")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
