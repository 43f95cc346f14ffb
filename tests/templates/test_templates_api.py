"""Launch templates through the API: who may change which, bad payloads named by field, shadowing, and booking
from a template (docs/templates.md)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from controlplane.reservations.models import Reservation
from controlplane.templates.models import LaunchTemplate
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db
URL = "/api/v1/templates/"
BOOK = "/api/v1/reservations/"


@pytest.fixture
def team():  # type: ignore[no-untyped-def]
    owner, member, viewer, outsider = (UserFactory() for _ in range(4))
    proj = project(owner=owner, member=member, viewer=viewer, grant="1000")
    return {"project": proj, "owner": owner, "member": member, "viewer": viewer, "outsider": outsider,
            "staff": OperatorFactory()}  # fmt: skip


def template(slug: str | None, name: str = "train", **over):  # type: ignore[no-untyped-def]
    data = {
        "project": slug,
        "name": name,
        "title": "Training",
        "description": "A training job.",
        "container": {
            "image": "registry.example/train:1",
            "command": ["python", "train.py"],
            "env": {"EPOCHS": "3", "LR": "0.1"},
            "secrets": [{"name": "HF_TOKEN", "env": "HF_TOKEN"}, {"name": "WANDB_KEY", "file": True}],
            "network": "none",
        },
        "spec": {"gpu_model": "h100-80gb", "gpu_count": 1},
        "ports": [{"name": "tensorboard", "port": 6006, "protocol": "http"}],
        "duration": "2h",
    }
    data.update(over)
    return data


def post(client, user, data):  # type: ignore[no-untyped-def]
    client.force_authenticate(user)
    return client.post(URL, data, format="json")


def fields(response) -> dict:  # type: ignore[no-untyped-def]
    return response.json()["error"].get("fields", {})


# --- who may change which --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "scope", "expected"),
    [
        ("staff", "operator", 201),
        ("owner", "operator", 403),
        ("member", "operator", 403),
        ("staff", "project", 201),
        ("owner", "project", 201),
        ("member", "project", 403),
        ("viewer", "project", 403),
        ("outsider", "project", 404),
    ],
)
def test_who_may_create(api_client, team, role, scope, expected):  # type: ignore[no-untyped-def]
    gpu_model()
    slug = team["project"].slug if scope == "project" else None
    response = post(api_client, team[role], template(slug))
    assert response.status_code == expected, response.content
    assert LaunchTemplate.objects.filter(name="train").count() == (1 if expected == 201 else 0)
    if expected == 404:
        # Another tenant's project reads as absent, never as forbidden.
        assert fields(response) == {"project": ["No such project."]}


def test_an_invalid_body_from_a_member_is_refused_for_the_role_first(api_client, team):  # type: ignore[no-untyped-def]
    response = post(api_client, team["member"], {"project": team["project"].slug, "name": "Bad Name"})
    assert response.status_code == 403


def test_read_change_delete_by_role(api_client, team):  # type: ignore[no-untyped-def]
    gpu_model()
    slug = team["project"].slug
    assert post(api_client, team["owner"], template(slug)).status_code == 201
    detail = f"{URL}train/?project={slug}"
    for role in ("owner", "member", "viewer", "staff"):
        api_client.force_authenticate(team[role])
        answer = api_client.get(detail)
        assert answer.status_code == 200, role
        assert answer.json()["project"] == slug and answer.json()["duration"] == 7200
        # Secrets are named, never valued: the template stores where each goes.
        assert answer.json()["container"]["secrets"] == [
            {"name": "HF_TOKEN", "env": "HF_TOKEN"},
            {"name": "WANDB_KEY", "file": True},
        ]
    api_client.force_authenticate(team["outsider"])
    assert api_client.get(detail).status_code == 404
    assert "train" not in [t["name"] for t in api_client.get(URL).json()["results"]]
    for role, expected in (("member", 403), ("viewer", 403), ("outsider", 404)):
        api_client.force_authenticate(team[role])
        assert api_client.patch(detail, {"title": "x"}, format="json").status_code == expected, role
        assert api_client.delete(detail).status_code == expected, role
    api_client.force_authenticate(team["owner"])
    changed = api_client.patch(detail, {"title": "New", "container": {"env": {"A": "1"}}}, format="json")
    assert changed.status_code == 200, changed.content
    # The container is changed key by key: the image and command stay.
    assert changed.json()["title"] == "New"
    assert changed.json()["container"]["image"] == "registry.example/train:1"
    assert changed.json()["container"]["env"] == {"A": "1"}
    bad = api_client.patch(detail, {"container": {"image": ""}}, format="json")
    assert bad.status_code == 400 and "container.image" in fields(bad)
    # The name and the project are the URL's: a body's are not a change.
    moved = api_client.patch(detail, {"name": "other", "project": None}, format="json")
    assert moved.status_code == 200 and (moved.json()["name"], moved.json()["project"]) == ("train", slug)
    assert api_client.delete(detail).status_code == 204
    assert not LaunchTemplate.objects.filter(project=team["project"]).exists()


def test_operator_wide_templates_are_changed_by_operators_only(api_client, team):  # type: ignore[no-untyped-def]
    gpu_model()
    assert post(api_client, team["staff"], template(None)).status_code == 201
    for role in ("owner", "member"):
        api_client.force_authenticate(team[role])
        assert api_client.get(f"{URL}train/").status_code == 200
        assert api_client.patch(f"{URL}train/", {"title": "x"}, format="json").status_code == 403
        assert api_client.delete(f"{URL}train/").status_code == 403
    api_client.force_authenticate(team["staff"])
    assert api_client.patch(f"{URL}train/", {"title": "Ops"}, format="json").json()["title"] == "Ops"


def test_a_project_template_shadows_an_operator_wide_one(api_client, team):  # type: ignore[no-untyped-def]
    gpu_model()
    slug = team["project"].slug
    assert post(api_client, team["staff"], template(None, title="Operator's")).status_code == 201
    assert post(api_client, team["owner"], template(slug, title="Ours")).status_code == 201
    # The same name twice in one scope is refused, naming the field.
    again = post(api_client, team["owner"], template(slug))
    assert again.status_code == 400 and "name" in fields(again)
    api_client.force_authenticate(team["member"])
    listed = api_client.get(URL, {"project": slug}).json()["results"]
    mine = [t for t in listed if t["name"] == "train"]
    assert [(t["title"], t["project"]) for t in mine] == [("Ours", slug)]
    assert api_client.get(f"{URL}train/", {"project": slug}).json()["title"] == "Ours"
    assert api_client.get(f"{URL}train/").json()["title"] == "Operator's"
    # Another project does not see it, and gets the operator-wide one.
    other = project(owner=team["outsider"])
    api_client.force_authenticate(team["outsider"])
    assert api_client.get(f"{URL}train/", {"project": other.slug}).json()["title"] == "Operator's"
    assert api_client.get(URL, {"project": slug}).status_code == 404


# --- bad payloads: each a 400 naming the field -----------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Bad Name"}, "name"),
        ({"name": ""}, "name"),
        ({"title": "x" * 201}, "title"),
        ({"container": None}, "container"),
        ({"container": {"command": ["x"]}}, "container.image"),
        ({"container": {"image": "x", "command": "python train.py"}}, "container.command"),
        ({"container": {"image": "x", "env": {"1X": "a"}}}, "container.env.1X"),
        ({"container": {"image": "x", "network": "bridge"}}, "container.network"),
        ({"container": {"image": "x", "volumes": [{"volume": "v", "path": "relative"}]}}, "container.volumes.0.path"),
        ({"container": {"image": "x", "volumes": [{"path": "/data"}]}}, "container.volumes.0.volume"),
        ({"container": {"image": "x", "secrets": [{"env": "X"}]}}, "container.secrets.0.name"),
        ({"container": {"image": "x", "secrets": [{"name": "s", "env": "1X"}]}}, "container.secrets.0.env"),
        ({"container": {"image": "x", "secrets": [{"name": "s", "file": "../x"}]}}, "container.secrets.0.file"),
        ({"container": {"image": "x", "secrets": [{"name": "a-b"}]}}, "container.secrets.0.name"),
        ({"spec": {"gpu_count": 1}}, "spec.gpu_model"),
        ({"spec": {"gpu_model": "nope", "gpu_count": 1}}, "spec.gpu_model"),
        ({"spec": {"gpu_model": "H100-80GB", "gpu_count": 0}}, "spec.gpu_count"),
        ({"ports": [{"name": "web", "port": 70000}]}, "ports.0.port"),
        ({"ports": [{"name": "Web", "port": 80}]}, "ports.0.name"),
        ({"ports": [{"name": "web", "port": 80, "protocol": "udp"}]}, "ports.0.protocol"),
        ({"ports": [{"name": "web", "port": 80}, {"name": "web", "port": 81}]}, "ports.1.name"),
        ({"ports": [{"name": "a", "port": 80}, {"name": "b", "port": 80}]}, "ports.1.port"),
        ({"duration": "0m"}, "duration"),
        ({"duration": "soon"}, "duration"),
        ({"project": 7}, "project"),
    ],
)
def test_bad_payloads_name_the_field(api_client, team, change, field):  # type: ignore[no-untyped-def]
    gpu_model()
    response = post(api_client, team["staff"], template(team["project"].slug, **change))
    assert response.status_code == 400, response.content
    assert field in fields(response), fields(response)
    assert not LaunchTemplate.objects.exists() or LaunchTemplate.objects.filter(name="train").count() == 0


def test_a_template_with_no_spec_and_no_duration_takes_the_defaults(api_client, team):  # type: ignore[no-untyped-def]
    data = template(None)
    del data["spec"], data["duration"], data["ports"]
    answer = post(api_client, team["staff"], data)
    assert answer.status_code == 201, answer.content
    assert answer.json()["spec"] is None and answer.json()["duration"] == 3600 and answer.json()["ports"] == []


# --- booking from a template -----------------------------------------------------------------------------


def _start(hours: float = 1) -> datetime:
    return (timezone.now() + timedelta(hours=hours)).replace(microsecond=0)


def booking(slug: str, **over):  # type: ignore[no-untyped-def]
    data = {"project": slug, "name": "from-template", "template": "train", "window": {"start": _start().isoformat()}}
    data.update(over)
    return data


@pytest.fixture
def fleet(team):  # type: ignore[no-untyped-def]
    from controlplane.vault import services as vault

    model = gpu_model()
    server(model, gpus=8)
    # The secrets the template wants, in the project that books from it.
    for name in ("HF_TOKEN", "WANDB_KEY"):
        vault.secret_set(project=team["project"], name=name, value=f"value-of-{name}", actor=None)
    return model


def test_booking_from_a_template_takes_its_defaults(api_client, team, fleet):  # type: ignore[no-untyped-def]
    assert post(api_client, team["staff"], template(None)).status_code == 201
    api_client.force_authenticate(team["member"])
    start = _start()
    response = api_client.post(BOOK, booking(team["project"].slug, window={"start": start.isoformat()}), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["template"] == "train"
    assert data["image"] == "registry.example/train:1" and data["command"] == ["python", "train.py"]
    assert data["env"] == {"EPOCHS": "3", "LR": "0.1"}
    # The template's secrets are the booking's, checked as a booking's (the project has them).
    assert [s["name"] for s in data["secrets"]] == ["HF_TOKEN", "WANDB_KEY"]
    assert data["spec"]["gpu_model"] == "H100-80GB" and data["spec"]["gpu_count"] == 1
    # The window had only a start: it lasts the template's length.
    assert datetime.fromisoformat(data["ends_at"]) - datetime.fromisoformat(data["starts_at"]) == timedelta(hours=2)
    assert Reservation.objects.get(public_id=data["id"]).template == "train"
    # The answer of a later read says the same.
    assert api_client.get(f"{BOOK}{data['id']}/").json()["template"] == "train"
    listed = api_client.get(BOOK).json()["results"]
    assert [r["template"] for r in listed] == ["train"]


def test_the_request_overrides_the_template_key_by_key(api_client, team, fleet):  # type: ignore[no-untyped-def]
    assert post(api_client, team["staff"], template(None)).status_code == 201
    api_client.force_authenticate(team["owner"])
    start = _start()
    body = booking(
        team["project"].slug,
        spec={"gpu_count": 2},
        container={"image": "registry.example/train:2", "env": {"LR": "0.01", "SEED": "1"}},
        window={"start": start.isoformat(), "duration": "30m"},
    )
    response = api_client.post(BOOK, body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["image"] == "registry.example/train:2" and data["command"] == ["python", "train.py"]
    assert data["env"] == {"EPOCHS": "3", "LR": "0.01", "SEED": "1"}
    assert data["spec"]["gpu_model"] == "H100-80GB" and data["spec"]["gpu_count"] == 2
    assert datetime.fromisoformat(data["ends_at"]) - start == timedelta(minutes=30)
    # Naming another alternative of the spec replaces the template's (a model and a memory together are refused).
    body = booking(team["project"].slug, name="by-memory", spec={"min_memory_mib": 40000})
    response = api_client.post(BOOK, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["spec"]["gpu_model"] is None and response.json()["spec"]["min_memory_mib"] == 40000


def test_the_project_template_is_booked_before_the_operator_wide_one(api_client, team, fleet):  # type: ignore[no-untyped-def]
    slug = team["project"].slug
    assert post(api_client, team["staff"], template(None)).status_code == 201
    ours = template(slug, container={"image": "registry.example/ours:1"})
    assert post(api_client, team["owner"], ours).status_code == 201
    api_client.force_authenticate(team["member"])
    response = api_client.post(BOOK, booking(slug), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["image"] == "registry.example/ours:1"


def test_an_unknown_template_is_a_400_naming_template(api_client, team, fleet):  # type: ignore[no-untyped-def]
    slug = team["project"].slug
    api_client.force_authenticate(team["member"])
    for value in ("nope", 7, "", "x" * 64):
        response = api_client.post(BOOK, booking(slug, template=value), format="json")
        assert response.status_code == 400, response.content
        assert list(fields(response)) == ["template"], value
    # Another project's template is not this project's.
    other = project(owner=team["outsider"])
    assert post(api_client, team["outsider"], template(other.slug, name="theirs")).status_code == 201
    api_client.force_authenticate(team["member"])
    response = api_client.post(BOOK, booking(slug, template="theirs"), format="json")
    assert response.status_code == 400 and list(fields(response)) == ["template"]
    # Someone else's project is still a 404 first, whatever the template.
    response = api_client.post(BOOK, booking(other.slug, template="theirs"), format="json")
    assert response.status_code == 404
    assert not Reservation.objects.exists()


def test_what_the_template_leaves_out_is_judged_by_the_booking_rules(api_client, team, fleet):  # type: ignore[no-untyped-def]
    data = template(None)
    del data["spec"]
    assert post(api_client, team["staff"], data).status_code == 201
    api_client.force_authenticate(team["member"])
    # No spec anywhere: the booking's own error.
    response = api_client.post(BOOK, booking(team["project"].slug), format="json")
    assert response.status_code == 400 and fields(response) == {"spec": ["This field is required."]}
    # An override the booking refuses is refused with the booking's wording and field.
    body = booking(
        team["project"].slug, spec={"gpu_model": "H100-80GB", "gpu_count": 1}, container={"env": {"1X": "a"}}
    )
    response = api_client.post(BOOK, body, format="json")
    assert response.status_code == 400 and "container.env.1X" in fields(response)
    # No window start: the booking says so.
    body = booking(team["project"].slug, spec={"gpu_model": "H100-80GB", "gpu_count": 1}, window={})
    response = api_client.post(BOOK, body, format="json")
    assert response.status_code == 400 and "window.start" in fields(response)
    assert not Reservation.objects.exists()


# --- the queue ---------------------------------------------------------------------------------------------


def test_a_queued_request_from_a_template(api_client, team, fleet):  # type: ignore[no-untyped-def]
    assert post(api_client, team["staff"], template(None)).status_code == 201
    api_client.force_authenticate(team["member"])
    slug = team["project"].slug
    queued = {"project": slug, "name": "later", "template": "train", "spec": {"gpu_count": 2}}
    response = api_client.post("/api/v1/requests/", queued, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["duration_seconds"] == 7200, data
    assert data["container"]["image"] == "registry.example/train:1"
    assert data["spec"]["gpu_count"] == 2 and data["spec"]["gpu_model"] == "H100-80GB"
    response = api_client.post("/api/v1/requests/", {**queued, "template": "nope"}, format="json")
    assert response.status_code == 400 and list(fields(response)) == ["template"]
