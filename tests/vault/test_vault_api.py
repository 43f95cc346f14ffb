"""Project secrets and registry credentials through the API: roles, another tenant, bad payloads, values that
never come back (answers, events, the schema), encryption at rest, bookings that name secrets, the desired
state (one query for every launch), delete while in use, the queue and the requeue."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.dispatch import services as dispatch_services
from controlplane.dispatch.models import Launch
from controlplane.reservations import services as reservations
from controlplane.reservations.models import Reservation, ReservationEvent
from controlplane.reservations.specs import ContainerSpec, SecretRequest, Window
from controlplane.vault import crypto, services
from controlplane.vault.models import VaultEntry
from tests.factories import ApiTokenFactory, OperatorFactory, UserFactory
from tests.reservations.fleet import gpu_model, project, server, spec

pytestmark = pytest.mark.django_db

BOOKINGS = "/api/v1/reservations/"
SECRET_VALUE = "hf_s3cr3t-VALUE-never-shown-4b1d"
PASSWORD = "registry-PASSWORD-never-shown-77x"


class World:
    def __init__(self) -> None:
        self.owner = UserFactory(username="olive")
        self.member = UserFactory(username="tom")
        self.viewer = UserFactory(username="vera")
        self.outsider = UserFactory(username="oscar")
        self.operator = OperatorFactory(username="opal")
        self.project = project(owner=self.owner, member=self.member, viewer=self.viewer, slug="atlas")
        self.other = project(owner=self.outsider, slug="zephyr")
        self.model = gpu_model()
        self.server = server(self.model, gpus=8)

    def client(self, user: Any) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiTokenFactory(user=user).plaintext}")
        return client

    def body(self, **container: Any) -> dict[str, Any]:
        start = timezone.now() + timedelta(hours=1)
        return {
            "project": self.project.slug,
            "name": "job",
            "spec": {"gpu_model": self.model.name, "gpu_count": 1},
            "window": {"start": start.isoformat(), "duration": "1h"},
            "container": {"image": "gpucp-busybox:test", **container},
        }


@pytest.fixture
def w(db: Any) -> World:
    return World()


def secrets_url(slug: str = "atlas") -> str:
    return f"/api/v1/projects/{slug}/secrets/"


def registries_url(slug: str = "atlas") -> str:
    return f"/api/v1/projects/{slug}/registries/"


def add_secret(w: World, name: str = "HF_TOKEN", value: str = SECRET_VALUE) -> None:
    res = w.client(w.owner).post(secrets_url(), {"name": name, "value": value}, format="json")
    assert res.status_code == 201, res.content


def add_registry(w: World, registry: str = "nvcr.io", password: str = PASSWORD) -> None:
    body = {"registry": registry, "username": "$oauthtoken", "password": password}
    res = w.client(w.owner).post(registries_url(), body, format="json")
    assert res.status_code == 201, res.content


def no_values(*texts: Any) -> None:
    for text in texts:
        raw = text if isinstance(text, str) else json.dumps(text, default=str)
        assert SECRET_VALUE not in raw and PASSWORD not in raw


# --- the API ------------------------------------------------------------------------------------------------


def test_a_secret_is_added_listed_replaced_and_deleted_and_its_value_never_shown(w):
    owner = w.client(w.owner)
    res = owner.post(secrets_url(), {"name": "HF_TOKEN", "value": SECRET_VALUE}, format="json")
    assert res.status_code == 201, res.content
    body = res.json()
    assert set(body) == {"name", "set", "created_by", "created_at", "updated_by", "updated_at"}
    assert (body["name"], body["set"], body["created_by"]) == ("HF_TOKEN", True, "olive")
    listed = w.client(w.viewer).get(secrets_url())
    assert listed.status_code == 200 and [s["name"] for s in listed.json()] == ["HF_TOKEN"]
    detail = w.client(w.viewer).get(secrets_url() + "HF_TOKEN/")
    assert detail.status_code == 200
    # Stored encrypted: the column holds a Fernet token, never the value.
    entry = VaultEntry.objects.get(name="HF_TOKEN")
    assert SECRET_VALUE not in entry.sealed and crypto.unseal(entry.sealed) == SECRET_VALUE
    assert SECRET_VALUE not in repr(entry) and SECRET_VALUE not in str(entry)
    # Replaced by a member: the new value, the same row.
    res = w.client(w.member).put(secrets_url() + "HF_TOKEN/", {"value": "second-" + SECRET_VALUE}, format="json")
    assert res.status_code == 200 and res.json()["updated_by"] == "tom"
    assert crypto.unseal(VaultEntry.objects.get(name="HF_TOKEN").sealed) == "second-" + SECRET_VALUE
    # PUT of a new name creates it.
    assert owner.put(secrets_url() + "WANDB_API_KEY/", {"value": "x"}, format="json").status_code == 201
    # POST of a taken name is a conflict, not a silent replacement.
    again = owner.post(secrets_url(), {"name": "HF_TOKEN", "value": "y"}, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "secret_exists"
    no_values(listed.content.decode(), detail.content.decode(), res.content.decode(), again.content.decode())
    assert owner.delete(secrets_url() + "HF_TOKEN/").status_code == 204
    assert owner.get(secrets_url() + "HF_TOKEN/").status_code == 404


def test_roles_viewers_read_names_only_and_other_tenants_get_404(w):
    add_secret(w)
    add_registry(w)
    viewer = w.client(w.viewer)
    assert viewer.post(secrets_url(), {"name": "X", "value": "v"}, format="json").status_code == 403
    assert viewer.put(secrets_url() + "HF_TOKEN/", {"value": "v"}, format="json").status_code == 403
    assert viewer.delete(secrets_url() + "HF_TOKEN/").status_code == 403
    assert viewer.delete(registries_url() + "nvcr.io/").status_code == 403
    outsider = w.client(w.outsider)
    for method, url in [
        ("get", secrets_url()),
        ("get", secrets_url() + "HF_TOKEN/"),
        ("put", secrets_url() + "HF_TOKEN/"),
        ("delete", secrets_url() + "HF_TOKEN/"),
        ("get", registries_url()),
        ("get", registries_url() + "nvcr.io/"),
        ("delete", registries_url() + "nvcr.io/"),
    ]:
        res = getattr(outsider, method)(url, {"value": "v"} if method == "put" else None, format="json")
        assert res.status_code == 404, (method, url, res.content)
    # The refusal comes before the body: an outsider's bad body is the same 404.
    assert outsider.post(secrets_url(), {"name": 1}, format="json").status_code == 404
    # An operator sees and writes any project's.
    assert w.client(w.operator).get(secrets_url()).status_code == 200
    assert VaultEntry.objects.filter(project=w.project).count() == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "1ABC", "value": "v"}, "name"),
        ({"name": "HF-TOKEN", "value": "v"}, "name"),
        ({"name": "A" * 64, "value": "v"}, "name"),
        ({"name": 12, "value": "v"}, "name"),
        ({"name": ["X"], "value": "v"}, "name"),
        ({"name": "X", "value": ""}, "value"),
        ({"name": "X", "value": 42}, "value"),
        ({"name": "X", "value": {"a": 1}}, "value"),
        ({"name": "X", "value": None}, "value"),
        ({"name": "X", "value": "a\x00b"}, "value"),
        ({"name": "X", "value": "v" * 65537}, "value"),
        ({"name": "X"}, "value"),
    ],
)
def test_bad_secret_payloads_are_400_naming_the_field_and_write_nothing(w, body, field):
    res = w.client(w.owner).post(secrets_url(), body, format="json")
    assert res.status_code == 400, res.content
    assert field in res.json()["error"]["fields"]
    assert not VaultEntry.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"registry": "myhost", "username": "u", "password": "p"}, "registry"),
        ({"registry": "nvcr.io/team", "username": "u", "password": "p"}, "registry"),
        ({"registry": "bad host", "username": "u", "password": "p"}, "registry"),
        ({"registry": 5, "username": "u", "password": "p"}, "registry"),
        ({"registry": "nvcr.io", "username": "", "password": "p"}, "username"),
        ({"registry": "nvcr.io", "username": "u", "password": ""}, "password"),
        ({"registry": "nvcr.io", "username": "u", "password": 7}, "password"),
        ({"registry": "nvcr.io", "username": "u"}, "password"),
    ],
)
def test_bad_registry_payloads_are_400_naming_the_field(w, body, field):
    res = w.client(w.owner).post(registries_url(), body, format="json")
    assert res.status_code == 400, res.content
    assert field in res.json()["error"]["fields"]
    assert not VaultEntry.objects.exists()


def test_a_registry_credential_shows_the_user_never_the_password_and_docker_hub_aliases_are_one(w):
    add_registry(w, "index.docker.io")
    res = w.client(w.viewer).get(registries_url())
    assert [(r["registry"], r["username"], r["set"]) for r in res.json()] == [("docker.io", "$oauthtoken", True)]
    assert "password" not in res.json()[0]
    detail = w.client(w.viewer).get(registries_url() + "docker.io/")
    assert detail.status_code == 200
    put = w.client(w.member).put(registries_url() + "127.0.0.1:5000/", {"username": "u", "password": PASSWORD})
    assert put.status_code == 201 and put.json()["registry"] == "127.0.0.1:5000"
    no_values(res.content.decode(), detail.content.decode(), put.content.decode())
    assert services.registry_auth_for(w.project, "ubuntu:22.04").password == PASSWORD
    assert services.registry_auth_for(w.project, "127.0.0.1:5000/team/x@sha256:" + "a" * 64).username == "u"
    assert services.registry_auth_for(w.project, "nvcr.io/nvidia/pytorch:24.01-py3") is None
    assert services.registry_auth_for(w.other, "ubuntu") is None
    # repr of the wire object hides the password.
    assert PASSWORD not in repr(services.registry_auth_for(w.project, "ubuntu"))


def test_the_openapi_schema_documents_the_endpoints_without_a_value(w):
    res = w.client(w.owner).get("/api/v1/schema/?format=json")
    assert res.status_code == 200
    schema = res.content.decode()
    assert "/api/v1/projects/{slug}/secrets/" in schema and "/api/v1/projects/{slug}/registries/" in schema
    no_values(schema)


# --- bookings that name secrets ----------------------------------------------------------------------------


def test_a_booking_names_secrets_stores_names_only_and_shows_no_value(w):
    add_secret(w)
    add_secret(w, "WANDB_API_KEY", "wandb-" + SECRET_VALUE)
    secrets = [{"name": "HF_TOKEN"}, {"name": "WANDB_API_KEY", "env": "WANDB_KEY", "file": True}]
    res = w.client(w.member).post(BOOKINGS, w.body(secrets=secrets), format="json")
    assert res.status_code == 201, res.content
    body = res.json()
    assert body["secrets"] == [
        {"name": "HF_TOKEN", "env": "HF_TOKEN", "file": False},
        {"name": "WANDB_API_KEY", "env": "WANDB_KEY", "file": True},
    ]
    stored = Reservation.objects.get(public_id=body["id"])
    assert stored.secrets == body["secrets"]
    detail = w.client(w.viewer).get(f"{BOOKINGS}{body['id']}/")
    listed = w.client(w.viewer).get(BOOKINGS)
    assert detail.json()["secrets"] == body["secrets"]
    events = list(ReservationEvent.objects.filter(reservation=stored).values("reason", "data"))
    no_values(res.content.decode(), detail.content.decode(), listed.content.decode(), events)
    # File only: no variable.
    res = w.client(w.owner).post(BOOKINGS, w.body(secrets=[{"name": "HF_TOKEN", "file": True}]), format="json")
    assert res.status_code == 201 and res.json()["secrets"] == [{"name": "HF_TOKEN", "env": None, "file": True}]


@pytest.mark.parametrize(
    ("secrets", "env", "field"),
    [
        ([{"name": "NOPE"}], {}, "container.secrets.0.name"),
        ([{"name": "HF_TOKEN"}, {"name": "MISSING"}], {}, "container.secrets.1.name"),
        ([{"name": "HF_TOKEN", "env": "NVIDIA_VISIBLE_DEVICES"}], {}, "container.secrets.0.env"),
        ([{"name": "HF_TOKEN", "env": "GPUCP_RESERVATION"}], {}, "container.secrets.0.env"),
        ([{"name": "HF_TOKEN", "env": "HIP_VISIBLE_DEVICES"}], {}, "container.secrets.0.env"),
        ([{"name": "HF_TOKEN"}], {"HF_TOKEN": "plain"}, "container.secrets.0.env"),
        ([{"name": "HF_TOKEN"}, {"name": "HF_TOKEN", "file": True}], {}, "container.secrets.1.name"),
        ([{"name": "HF_TOKEN", "env": "X"}, {"name": "OTHER", "env": "X"}], {}, "container.secrets.1.env"),
        ([{"name": "HF_TOKEN", "env": "1X"}], {}, "container.secrets.0.env"),
        ([{"name": "bad-name"}], {}, "container.secrets.0.name"),
        ([{"name": 5}], {}, "container.secrets.0.name"),
        ([{"name": "HF_TOKEN", "file": "yes"}], {}, "container.secrets.0.file"),
        ([{"env": "X"}], {}, "container.secrets.0.name"),
        ("HF_TOKEN", {}, "container.secrets"),
    ],
)
def test_bad_secret_requests_are_400_naming_the_field_and_book_nothing(w, secrets, env, field):
    add_secret(w)
    add_secret(w, "OTHER", "o")
    res = w.client(w.owner).post(BOOKINGS, w.body(secrets=secrets, env=env), format="json")
    assert res.status_code == 400, res.content
    assert field in res.json()["error"]["fields"], res.json()
    assert not Reservation.objects.exists()


def test_another_projects_secret_is_not_there_for_a_booking(w):
    services.secret_set(project=w.other, name="THEIRS", value=SECRET_VALUE, actor=w.outsider)
    res = w.client(w.owner).post(BOOKINGS, w.body(secrets=[{"name": "THEIRS"}]), format="json")
    assert res.status_code == 400 and "container.secrets.0.name" in res.json()["error"]["fields"]


def test_a_secret_in_use_is_not_deleted_until_its_reservation_ends(w):
    add_secret(w)
    res = w.client(w.owner).post(BOOKINGS, w.body(secrets=[{"name": "HF_TOKEN"}]), format="json")
    rid = res.json()["id"]
    refused = w.client(w.owner).delete(secrets_url() + "HF_TOKEN/")
    assert refused.status_code == 409, refused.content
    assert refused.json()["error"]["code"] == "secret_in_use" and rid in refused.content.decode()
    # Replacing it is fine: the next launch takes the new value.
    assert w.client(w.owner).put(secrets_url() + "HF_TOKEN/", {"value": "new"}, format="json").status_code == 200
    assert w.client(w.owner).post(f"{BOOKINGS}{rid}/cancel/", {}, format="json").status_code == 200
    assert w.client(w.owner).delete(secrets_url() + "HF_TOKEN/").status_code == 204


def test_an_invalid_image_reference_is_400_naming_container_image(w):
    for image in ["Ubuntu:22.04", "ubuntu:", "nvcr.io/nvidia/pytorch@sha256:abc", "ubuntu::1", "a b"]:
        res = w.client(w.owner).post(BOOKINGS, w.body(image=image), format="json")
        assert res.status_code == 400, (image, res.content)
        assert "container.image" in res.json()["error"]["fields"], image
    assert not Reservation.objects.exists()


def test_the_allow_list_refuses_other_registries(w, settings):
    settings.IMAGES_ALLOWED_REGISTRIES = ["nvcr.io", "127.0.0.1:5000"]
    res = w.client(w.owner).post(BOOKINGS, w.body(image="ubuntu:22.04"), format="json")
    assert res.status_code == 400 and "docker.io" in res.json()["error"]["fields"]["container.image"][0]
    res = w.client(w.owner).post(BOOKINGS, w.body(image="127.0.0.1:5000/team/x:1"), format="json")
    assert res.status_code == 201, res.content


# --- the desired state -------------------------------------------------------------------------------------


def _running(w: World, reservation: Reservation, n: int) -> None:
    Reservation.objects.filter(pk=reservation.pk).update(
        starts_at=timezone.now() - timedelta(minutes=1), state="running"
    )
    Launch.objects.create(
        reservation=reservation,
        server=w.server,
        launch_id=f"l-{reservation.pk}-{n}",
        gpu_uuids=[a.gpu.uuid for a in reservation.allocations.all()],
        state="running",
    )


def _book(w: World, image: str, secrets: list[SecretRequest], proj: Any = None) -> Reservation:
    start = timezone.now() + timedelta(hours=1)
    return reservations.reservation_create(
        project=proj or w.project,
        name="job",
        spec=spec(w.model),
        window=Window(start, start + timedelta(hours=2)),
        container=ContainerSpec(image=image, secrets=secrets),
        actor=w.owner,
    )


def test_the_desired_state_carries_values_and_credentials_in_one_query_for_every_launch(w):
    services.secret_set(project=w.project, name="HF_TOKEN", value=SECRET_VALUE, actor=w.owner)
    services.secret_set(project=w.project, name="B", value="b-value", actor=w.owner)
    services.registry_set(project=w.project, registry="nvcr.io", username="$oauthtoken", password=PASSWORD, actor=None)
    services.secret_set(project=w.other, name="HF_TOKEN", value="theirs", actor=w.outsider)
    mine = _book(w, "nvcr.io/nvidia/pytorch:24.01-py3", [SecretRequest.of("HF_TOKEN", file=True)])
    both = _book(w, "ubuntu", [SecretRequest.of("HF_TOKEN", env="TOKEN", file=True), SecretRequest.of("B")])
    theirs = _book(w, "nvcr.io/nvidia/pytorch:24.01-py3", [SecretRequest.of("HF_TOKEN")], proj=w.other)
    for n, r in enumerate([mine, both, theirs]):
        _running(w, r, n)

    def desired() -> dict[str, Any]:
        items, _ = dispatch_services.node_desired_state(server=w.server)
        return {item.reservation: item for item in items}

    got = desired()
    first = got[str(mine.public_id)]
    assert first.registry_auth is not None and (first.registry_auth.registry, first.registry_auth.password) == (
        "nvcr.io",
        PASSWORD,
    )
    assert [(s.name, s.value, s.env, s.file) for s in first.secrets] == [("HF_TOKEN", SECRET_VALUE, None, True)]
    second = got[str(both.public_id)]
    assert second.registry_auth is None
    assert [(s.name, s.value, s.env, s.file) for s in second.secrets] == [
        ("HF_TOKEN", SECRET_VALUE, "TOKEN", True),
        ("B", "b-value", "B", False),
    ]
    third = got[str(theirs.public_id)]
    assert third.registry_auth is None and [(s.value) for s in third.secrets] == ["theirs"]
    # The values are not in the desired container's repr (what a log line of it would show).
    assert SECRET_VALUE not in repr(first) and PASSWORD not in repr(first)
    # A new value applies from the next read.
    services.secret_set(project=w.project, name="HF_TOKEN", value="rotated", actor=w.owner)
    assert desired()[str(mine.public_id)].secrets[0].value == "rotated"

    # One query for all of them: a fourth launch adds none.
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            dispatch_services.node_desired_state(server=w.server)
        return len(captured)

    before = queries()
    _running(w, _book(w, "nvcr.io/x/y:1", [SecretRequest.of("B")]), 9)
    assert queries() == before


def test_the_queue_keeps_secrets_and_checks_them(w):
    from controlplane.scheduling.models import PriorityClass
    from controlplane.scheduling.services import container_of, request_submit

    services.secret_set(project=w.project, name="HF_TOKEN", value=SECRET_VALUE, actor=w.owner)
    queued = request_submit(
        project=w.project,
        name="q",
        spec=spec(w.model),
        container=ContainerSpec(image="ubuntu", secrets=[SecretRequest.of("HF_TOKEN", file=True)]),
        duration=timedelta(hours=1),
        start_by=None,
        priority_class=PriorityClass.objects.get(name="normal"),
        actor=w.owner,
    )
    assert container_of(queued).secrets == [SecretRequest(name="HF_TOKEN", env=None, file=True)]
    no_values(queued.container)
    entry = VaultEntry.objects.get(project=w.project, name="HF_TOKEN")
    from controlplane.core.errors import Conflict

    with pytest.raises(Conflict) as refused:
        services.secret_delete(entry=entry, actor=w.owner)
    assert str(queued.public_id) in refused.value.message


def test_a_requeued_follow_up_keeps_its_secrets(w):
    from controlplane.dispatch.models import Requeue
    from tests.dispatch.test_services import lose, opened

    server(w.model, gpus=8)
    w.project.requeue_on_interrupt = True
    w.project.save(update_fields=["requeue_on_interrupt"])
    services.secret_set(project=w.project, name="HF_TOKEN", value=SECRET_VALUE, actor=w.owner)
    start = timezone.now()
    r = reservations.reservation_create(
        project=w.project,
        name="job",
        spec=spec(w.model),
        window=Window(start, start + timedelta(hours=2)),
        container=ContainerSpec(image="ubuntu", secrets=[SecretRequest.of("HF_TOKEN", env="T", file=True)]),
        actor=w.owner,
    )
    [launch] = opened(r)
    lose(launch.server)
    follow = Requeue.objects.get(interrupted=r).follow_up
    assert follow.secrets == r.secrets == [{"name": "HF_TOKEN", "env": "T", "file": True}]


# --- keys ---------------------------------------------------------------------------------------------------


def test_keys_rotate_and_a_wrong_key_is_a_clear_error(w, settings):
    from cryptography.fernet import Fernet
    from django.core.exceptions import ImproperlyConfigured

    from controlplane.vault.checks import encryption_keys, stored_values_open

    services.secret_set(project=w.project, name="HF_TOKEN", value=SECRET_VALUE, actor=w.owner)
    old = list(settings.CONTROLPLANE_ENCRYPTION_KEYS)
    new = Fernet.generate_key().decode()
    settings.CONTROLPLANE_ENCRYPTION_KEYS = [new, *old]
    assert services.rotate_keys() == 1
    settings.CONTROLPLANE_ENCRYPTION_KEYS = [new]
    assert crypto.unseal(VaultEntry.objects.get().sealed) == SECRET_VALUE
    # A key that opens nothing stored: the start-up check says so, without the value.
    settings.CONTROLPLANE_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    [error] = stored_values_open(databases=["default"])
    assert "CONTROLPLANE_ENCRYPTION_KEYS" in error.msg and SECRET_VALUE not in error.msg
    # The desired state goes on without the value, and says nothing of it.
    assert services.launch_material([]) == {}
    # Not a key at all: the start-up check, and no value is ever stored in the clear.
    settings.CONTROLPLANE_ENCRYPTION_KEYS = ["not-a-key"]
    [error] = encryption_keys()
    assert "key #1 is not a Fernet key" in error.msg and "not-a-key" not in error.msg
    with pytest.raises(ImproperlyConfigured):
        services.secret_set(project=w.project, name="OTHER", value="v", actor=w.owner)
    assert not VaultEntry.objects.filter(name="OTHER").exists()
