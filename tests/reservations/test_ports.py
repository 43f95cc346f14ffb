"""Named ports on a booking (docs/proxy.md, "Named ports"): valid ones stored and answered with every key, each
kind of bad port a 400 naming its field and nothing booked; a template's ports go to its bookings unless the
booking gives its own; a queued request keeps them until it books."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import WebPort, app_token, port_auth_env, port_problems
from tests.factories import UserFactory
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db
URL = "/api/v1/reservations/"


@pytest.fixture
def owner(api_client):  # type: ignore[no-untyped-def]
    server(gpu_model(), gpus=4)
    user = UserFactory()
    project(owner=user, grant="100000")
    api_client.force_authenticate(user)
    return user


def _body(ports: Any, **container: Any) -> dict[str, Any]:
    start = timezone.now() + timedelta(hours=1)
    return {
        "project": Project.objects.order_by("pk").first().slug,  # type: ignore[union-attr]
        "name": "lab",
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 1},
        "window": {"start": start.isoformat(), "duration": 3600},
        "container": {"image": "registry.example/lab:1", "ports": ports, **container},
    }


def test_ports_are_stored_and_answered_with_every_key(api_client, owner) -> None:  # type: ignore[no-untyped-def]
    ports = [{"name": "jupyter", "port": 8888, "path": "/lab", "auth": "jupyter"}, {"name": "tb", "port": 6006}]
    answer = api_client.post(URL, _body(ports), format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["ports"] == [
        {"name": "jupyter", "port": 8888, "protocol": "http", "path": "/lab", "auth": "jupyter"},
        {"name": "tb", "port": 6006, "protocol": "http", "path": "/", "auth": "none"},
    ]
    listed = api_client.get(URL).json()["results"][0]
    assert listed["ports"] == answer.json()["ports"]
    assert Reservation.objects.get().ports[0]["auth"] == "jupyter"


@pytest.mark.parametrize(
    ("ports", "field", "words"),
    [
        ([{"name": "Jupyter", "port": 8888}], "container.ports.0.name", "lowercase"),
        ([{"name": "9lab", "port": 8888}], "container.ports.0.name", "starting with a letter"),
        ([{"name": "x" * 33, "port": 8888}], "container.ports.0.name", "at most 32"),
        ([{"name": "terminal", "port": 8888}], "container.ports.0.name", "web terminal"),
        (
            [{"name": "a", "port": 80}, {"name": "a", "port": 81}],
            "container.ports.1.name",
            "taken by container.ports.0",
        ),
        (
            [{"name": "a", "port": 80}, {"name": "b", "port": 80}],
            "container.ports.1.port",
            "taken by container.ports.0",
        ),
        ([{"name": "a", "port": 0}], "container.ports.0.port", "1 to 65535"),
        ([{"name": "a", "port": 65536}], "container.ports.0.port", "1 to 65535"),
        ([{"name": "a", "port": 80, "protocol": "udp"}], "container.ports.0.protocol", "not a valid choice"),
        ([{"name": "a", "port": 80, "path": "lab"}], "container.ports.0.path", 'starting with one "/"'),
        ([{"name": "a", "port": 80, "path": "//evil.example"}], "container.ports.0.path", 'starting with one "/"'),
        ([{"name": "a", "port": 80, "auth": "basic"}], "container.ports.0.auth", "not a valid choice"),
        ([{"name": "a", "port": 80, "protocol": "tcp", "auth": "jupyter"}], "container.ports.0.auth", "Only an http"),
        (
            [{"name": "a", "port": 80, "auth": "jupyter"}, {"name": "b", "port": 81, "auth": "jupyter"}],
            "container.ports.1.auth",
            "signs in already",
        ),
        ([{"name": f"p{i}", "port": 1000 + i} for i in range(17)], "container.ports", "no more than 16"),
    ],
)
def test_a_bad_port_is_a_400_naming_its_field_and_nothing_is_booked(  # type: ignore[no-untyped-def]
    api_client, owner, ports: list[dict[str, Any]], field: str, words: str
) -> None:
    answer = api_client.post(URL, _body(ports), format="json")
    assert answer.status_code == 400, answer.json()
    fields = answer.json()["error"]["fields"]
    assert field in fields, fields
    assert words in " ".join(fields[field])
    assert not Reservation.objects.exists()


def test_a_port_of_the_wrong_type_is_a_400(api_client, owner) -> None:  # type: ignore[no-untyped-def]
    for ports, field in (("8888", "container.ports"), ([{"name": "a", "port": "x"}], "container.ports.0.port")):
        answer = api_client.post(URL, _body(ports), format="json")
        assert answer.status_code == 400 and field in answer.json()["error"]["fields"], answer.json()


def test_the_jupyter_token_variable_cannot_be_set_twice(api_client, owner) -> None:  # type: ignore[no-untyped-def]
    answer = api_client.post(
        URL, _body([{"name": "lab", "port": 8888, "auth": "jupyter"}], env={"JUPYTER_TOKEN": "mine"}), format="json"
    )
    assert answer.status_code == 400
    assert "JUPYTER_TOKEN" in answer.json()["error"]["fields"]["container.ports.0.auth"][0]


def test_the_token_is_per_reservation_and_only_for_a_signing_in_port() -> None:
    assert app_token("r1") != app_token("r2") and len(app_token("r1")) == 48
    assert port_auth_env("r1", [{"name": "lab", "port": 8888, "auth": "jupyter"}]) == {"JUPYTER_TOKEN": app_token("r1")}
    assert port_auth_env("r1", [{"name": "tb", "port": 6006}]) == {}
    assert port_auth_env("r1", None) == {}


def test_port_problems_name_fields_under_any_prefix() -> None:
    problems = port_problems([WebPort("a", 1), WebPort("a", 2)], {}, at="ports")
    assert list(problems) == ["ports.1.name"]


def test_a_template_gives_its_ports_unless_the_booking_has_its_own(api_client, owner) -> None:  # type: ignore[no-untyped-def]
    from controlplane.templates.models import LaunchTemplate

    now = timezone.now()
    LaunchTemplate.objects.create(
        project=None, name="lab", container={"image": "registry.example/lab:1"}, spec=None,
        ports=[{"name": "jupyter", "port": 8888, "protocol": "http", "path": "/lab", "auth": "jupyter"}],
        duration_s=3600, created_at=now, updated_at=now,
    )  # fmt: skip
    body = _body([])
    del body["container"]
    body["template"] = "lab"
    first = api_client.post(URL, body, format="json")
    assert first.status_code == 201, first.json()
    assert [p["name"] for p in first.json()["ports"]] == ["jupyter"]
    body["container"] = {"ports": [{"name": "tb", "port": 6006}]}
    second = api_client.post(URL, body, format="json")
    assert second.status_code == 201, second.json()
    assert [p["name"] for p in second.json()["ports"]] == ["tb"]
