"""/projects/{slug}/volumes/, /datasets/ and /projects/{slug}/egress/: who may do what, what each refuses,
the usage shown, the agents' measurements, and a fixed query count for the lists."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.access.datasets import dataset_create
from controlplane.access.models import GIB, Dataset, ProjectNetwork, Volume
from controlplane.access.volumes import volume_create, volumes_reported
from controlplane.dispatch.models import Launch
from controlplane.inventory.models import Server
from nodeagent.schema import VolumeUsage
from tests.access.volume_world import VolumeWorld, measured, volume

pytestmark = pytest.mark.django_db
VOLUMES = "/api/v1/projects/atlas/volumes/"


@pytest.fixture
def w(db: Any) -> VolumeWorld:
    return VolumeWorld()


# --- volumes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("who", "status"), [("owner", 201), ("member", 201), ("viewer", 403), ("outsider", 404)])
def test_who_may_create_a_volume(w, who, status):
    res = w.client(getattr(w, who)).post(VOLUMES, {"name": "scratch", "size_limit_gib": 5, "shared": True})
    assert res.status_code == status, res.content
    assert Volume.objects.filter(project=w.project, name="scratch").exists() == (status == 201)
    if status == 201:
        body = res.json()
        assert {k: body[k] for k in ("name", "project", "size_limit_gib", "limit_bytes", "shared")} == {
            "name": "scratch", "project": "atlas", "size_limit_gib": 5, "limit_bytes": 5 * GIB, "shared": True,
        }  # fmt: skip
        assert (body["used_bytes"], body["measured_at"], body["used_percent"]) == (None, None, None)


def test_the_list_shows_usage_as_a_percent_of_the_limit(w):
    at = timezone.now()
    measured(w.data, 5 * GIB // 2, at)
    rows = w.client(w.viewer).get(VOLUMES).json()["results"]
    assert [r["name"] for r in rows] == ["data"]
    assert rows[0]["used_bytes"] == 5 * GIB // 2 and rows[0]["used_percent"] == 25.0
    assert rows[0]["over_limit"] is False and rows[0]["created_by"] == "olive"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "Data", "size_limit_gib": 1}, "name"),
        ({"name": "-x", "size_limit_gib": 1}, "name"),
        ({"name": " data2", "size_limit_gib": 1}, "name"),
        ({"name": "a/b", "size_limit_gib": 1}, "name"),
        ({"name": "x" * 64, "size_limit_gib": 1}, "name"),
        ({"name": "ok", "size_limit_gib": 0}, "size_limit_gib"),
        ({"name": "ok", "size_limit_gib": "ten"}, "size_limit_gib"),
        ({"name": "ok"}, "size_limit_gib"),
        ({"size_limit_gib": 1}, "name"),
    ],
)
def test_a_bad_volume_is_a_400_naming_the_field(w, body, field):
    res = w.client(w.owner).post(VOLUMES, body, format="json")
    assert res.status_code == 400, res.content
    assert list(res.json()["error"]["fields"]) == [field]
    assert Volume.objects.filter(project=w.project).count() == 1


def test_a_taken_name_is_refused_but_another_project_may_use_it(w):
    res = w.client(w.owner).post(VOLUMES, {"name": "data", "size_limit_gib": 1})
    assert res.status_code == 400 and res.json()["error"]["code"] == "duplicate_name"
    other = w.client(w.outsider).post("/api/v1/projects/zephyr/volumes/", {"name": "data", "size_limit_gib": 1})
    assert other.status_code == 201


def test_another_tenants_project_and_volume_read_as_absent(w):
    outsider = w.client(w.outsider)
    for url in (VOLUMES, VOLUMES + "data/", "/api/v1/projects/no-such/volumes/"):
        res = outsider.get(url)
        assert res.status_code == 404 and res.json()["error"]["code"] == "not_found"
    # Their own project does not hold atlas's volume either.
    assert outsider.get("/api/v1/projects/zephyr/volumes/data/").status_code == 404
    assert outsider.delete(VOLUMES + "data/").status_code == 404
    assert Volume.objects.filter(pk=w.data.pk).exists()


def test_a_member_changes_the_size_and_sharing_but_not_the_name(w):
    client = w.client(w.member)
    res = client.patch(VOLUMES + "data/", {"size_limit_gib": 50, "shared": True}, format="json")
    assert res.status_code == 200 and (res.json()["size_limit_gib"], res.json()["shared"]) == (50, True)
    res = client.patch(VOLUMES + "data/", {"name": "renamed"}, format="json")
    assert res.status_code == 400 and list(res.json()["error"]["fields"]) == ["name"]
    assert w.client(w.viewer).patch(VOLUMES + "data/", {"size_limit_gib": 1}, format="json").status_code == 403
    assert Volume.objects.get(pk=w.data.pk).size_limit_gib == 50


def test_put_is_not_offered(w):
    assert w.client(w.owner).put(VOLUMES + "data/", {"size_limit_gib": 2}, format="json").status_code == 405


def test_deleting_a_volume_mounted_by_a_scheduled_reservation_is_a_409(w):
    reservation = w.book(volume())
    res = w.client(w.owner).delete(VOLUMES + "data/")
    assert res.status_code == 409 and res.json()["error"]["code"] == "volume_in_use"
    assert str(reservation.public_id) in res.json()["error"]["message"]
    assert w.client(w.viewer).delete(VOLUMES + "data/").status_code == 403


def test_deleting_an_unmounted_volume_forgets_it(w):
    assert w.client(w.member).delete(VOLUMES + "data/").status_code == 204
    assert not Volume.objects.filter(pk=w.data.pk).exists()
    assert w.client(w.member).delete(VOLUMES + "data/").status_code == 404


def test_the_volume_list_reads_a_fixed_number_of_queries(w):
    client = w.client(w.owner)
    client.get(VOLUMES)  # warm: token, session
    with CaptureQueriesContext(connection) as one:
        assert client.get(VOLUMES).status_code == 200
    for n in range(12):
        volume_create(project=w.project, name=f"v{n}", size_limit_gib=1, actor=w.member if n % 2 else w.owner)
    with CaptureQueriesContext(connection) as many:
        assert len(client.get(VOLUMES).json()["results"]) == 13
    assert len(many) == len(one), [q["sql"] for q in many.captured_queries]


# --- datasets ---------------------------------------------------------------------------------------------


def test_a_tenant_lists_only_the_datasets_its_projects_may_mount(w):
    dataset_create(name="both", allowed_projects=[w.project, w.other], actor=w.operator)
    dataset_create(name="nobody", actor=w.operator)
    rows = w.client(w.viewer).get("/api/v1/datasets/").json()["results"]
    # Another tenant's project is not named, even where the dataset is shared with it.
    assert [(r["name"], r["allowed_projects"]) for r in rows] == [("both", ["atlas"]), ("imagenet", ["atlas"])]
    assert w.client(w.viewer).get("/api/v1/datasets/private/").status_code == 404
    everything = w.client(w.operator).get("/api/v1/datasets/").json()["results"]
    assert [(r["name"], r["allowed_projects"]) for r in everything] == [
        ("both", ["atlas", "zephyr"]), ("imagenet", ["atlas"]), ("nobody", []), ("private", ["zephyr"]),
    ]  # fmt: skip


def test_only_operators_declare_change_and_remove_datasets(w):
    body = {"name": "coco", "description": "COCO 2017", "allowed_projects": ["atlas"]}
    for who in (w.owner, w.member, w.viewer, w.outsider):
        assert w.client(who).post("/api/v1/datasets/", body, format="json").status_code == 403
        assert w.client(who).patch("/api/v1/datasets/imagenet/", {"description": "x"}).status_code == 403
        assert w.client(who).delete("/api/v1/datasets/imagenet/").status_code == 403
    operator = w.client(w.operator)
    res = operator.post("/api/v1/datasets/", body, format="json")
    assert res.status_code == 201 and res.json()["allowed_projects"] == ["atlas"]
    res = operator.patch("/api/v1/datasets/coco/", {"allowed_projects": ["atlas", "zephyr"]}, format="json")
    assert res.status_code == 200 and res.json()["allowed_projects"] == ["atlas", "zephyr"]
    assert operator.patch("/api/v1/datasets/coco/", {"name": "other"}, format="json").status_code == 400
    assert operator.delete("/api/v1/datasets/coco/").status_code == 204
    assert not Dataset.objects.filter(name="coco").exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "Bad Name"}, "name"),
        ({"name": "imagenet"}, "name"),
        ({"name": "ok", "allowed_projects": ["no-such"]}, "allowed_projects"),
        ({"name": "ok", "allowed_projects": "atlas"}, "allowed_projects"),
    ],
)
def test_a_bad_dataset_is_a_400_naming_the_field(w, body, field):
    res = w.client(w.operator).post("/api/v1/datasets/", body, format="json")
    assert res.status_code == 400, res.content
    assert list(res.json()["error"]["fields"]) == [field]
    assert Dataset.objects.count() == 2


def test_the_dataset_list_reads_a_fixed_number_of_queries(w):
    client = w.client(w.viewer)
    client.get("/api/v1/datasets/")
    with CaptureQueriesContext(connection) as one:
        client.get("/api/v1/datasets/")
    for n in range(10):
        dataset_create(name=f"d{n}", allowed_projects=[w.project, w.other], actor=w.operator)
    with CaptureQueriesContext(connection) as many:
        assert len(client.get("/api/v1/datasets/").json()["results"]) == 11
    assert len(many) == len(one)


# --- the egress network -----------------------------------------------------------------------------------


def test_members_read_the_egress_network_and_only_operators_set_it(w):
    url = "/api/v1/projects/atlas/egress/"
    assert w.client(w.viewer).get(url).json() == {"project": "atlas", "allowed": False, "network_name": None}
    for who in (w.owner, w.member, w.viewer, w.outsider):
        assert w.client(who).put(url, {"network_name": "x"}, format="json").status_code == 403
    assert w.client(w.outsider).get(url).status_code == 404
    operator = w.client(w.operator)
    res = operator.put(url, {"network_name": "atlas-egress"}, format="json")
    assert res.json() == {"project": "atlas", "allowed": True, "network_name": "atlas-egress"}
    assert ProjectNetwork.objects.get(project=w.project).updated_by == w.operator
    assert operator.delete(url).status_code == 204
    assert not ProjectNetwork.objects.filter(project=w.project).exists()


@pytest.mark.parametrize("name", ["host", "none", "a b", "-x", "", "x" * 129])
def test_the_hosts_network_and_bad_names_cannot_be_an_egress_network(w, name):
    res = w.client(w.operator).put("/api/v1/projects/atlas/egress/", {"network_name": name}, format="json")
    assert res.status_code == 400 and list(res.json()["error"]["fields"]) == ["network_name"]
    assert not ProjectNetwork.objects.exists()


# --- measurements from the agents -------------------------------------------------------------------------


def _ran_here(w: VolumeWorld) -> Server:
    Launch.objects.create(reservation=w.book(volume()), server=w.server, launch_id="l-1")
    return w.server


def _usage(name: str, used: int, at: Any, project: str = "atlas") -> VolumeUsage:
    return VolumeUsage(project=project, name=name, used_bytes=used, measured_at=at)


def test_the_newest_measurement_wins(w):
    server = _ran_here(w)
    now = timezone.now()
    volumes_reported(server, [_usage("data", 100, now - timedelta(minutes=1))], now)
    volumes_reported(server, [_usage("data", 50, now - timedelta(minutes=5))], now)  # late, older
    fresh = Volume.objects.get(pk=w.data.pk)
    assert (fresh.used_bytes, fresh.measured_at) == (100, now - timedelta(minutes=1))
    # Two in one heartbeat: the newer one.
    volumes_reported(server, [_usage("data", 7, now), _usage("data", 9, now - timedelta(seconds=1))], now)
    assert Volume.objects.get(pk=w.data.pk).used_bytes == 7


def test_a_measurement_from_the_future_counts_as_now(w):
    server = _ran_here(w)
    now = timezone.now()
    volumes_reported(server, [_usage("data", 100, now + timedelta(days=365))], now)
    assert Volume.objects.get(pk=w.data.pk).measured_at == now
    volumes_reported(server, [_usage("data", 200, now + timedelta(seconds=1))], now + timedelta(seconds=1))
    assert Volume.objects.get(pk=w.data.pk).used_bytes == 200


def test_an_agent_reports_only_for_projects_that_ran_on_its_node(w):
    server = _ran_here(w)
    stranger = Server.objects.create(hostname="elsewhere")
    now = timezone.now()
    volumes_reported(stranger, [_usage("data", 1, now)], now)
    volumes_reported(server, [_usage("secret", 1, now, project="zephyr"), _usage("nope", 1, now)], now)
    assert Volume.objects.get(pk=w.data.pk).used_bytes is None
    assert Volume.objects.get(pk=w.foreign.pk).used_bytes is None


def test_the_heartbeat_hook_is_registered():
    from controlplane.fleet import desired

    assert volumes_reported in desired._volumes_reported


def test_a_project_whose_slug_the_agent_cannot_use_as_a_directory_gets_no_volume(w):
    from controlplane.accounts.models import Project
    from controlplane.core.errors import ValidationFailed

    long = Project.objects.create(name="Long", slug="x" * 70)
    with pytest.raises(ValidationFailed) as exc:
        volume_create(project=long, name="data", size_limit_gib=1, actor=w.operator)
    assert exc.value.code == "invalid_project"
