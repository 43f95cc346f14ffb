"""Booking with volumes, datasets and a network: what is stored and shown, every refusal naming its field, the
overlap rule under the project's lock (a race on PostgreSQL), extensions, and the desired state."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from controlplane.access.models import GIB, Volume
from controlplane.access.volumes import project_network_set, volume_create, volume_delete, volume_update
from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.dispatch import services as dispatch_services
from controlplane.dispatch.models import Launch
from controlplane.reservations import services
from controlplane.reservations.api.serializers import ReservationDetailSerializer, reservation_detail
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import MountRequest
from tests.access.racing import race
from tests.access.volume_world import BOOKINGS, VolumeWorld, measured, volume

pytestmark = pytest.mark.django_db


@pytest.fixture
def w(db: Any) -> VolumeWorld:
    return VolumeWorld()


def _json(data: Any) -> Any:
    return json.loads(JSONRenderer().render(data))


def refused(w: VolumeWorld, status: int, **container: Any) -> dict[str, Any]:
    before = Reservation.objects.count()
    res = w.client(w.owner).post(BOOKINGS, w.body(**container), format="json")
    assert res.status_code == status, res.content
    assert Reservation.objects.count() == before, "a refused booking wrote nothing"
    return dict(res.json()["error"])


# --- what a booking stores and shows ----------------------------------------------------------------------


def test_a_booking_mounts_a_volume_and_a_dataset_and_shows_them(w):
    res = w.client(w.member).post(
        BOOKINGS,
        w.body(volumes=[{"volume": "data", "path": "/workspace"}, {"dataset": "imagenet"}]),
        format="json",
    )
    assert res.status_code == 201, res.content
    body = res.json()
    assert body["volumes"] == [
        {"kind": "volume", "name": "data", "path": "/workspace", "read_only": False},
        {"kind": "dataset", "name": "imagenet", "path": "/datasets/imagenet", "read_only": True},
    ]
    assert body["network"] == "none"
    stored = Reservation.objects.get(public_id=body["id"])
    assert stored.volumes == body["volumes"]
    again = w.client(w.viewer).get(f"{BOOKINGS}{body['id']}/").json()
    assert (again["volumes"], again["network"]) == (body["volumes"], "none")


def test_a_volume_defaults_to_workspace_and_may_be_read_only(w):
    res = w.client(w.owner).post(
        BOOKINGS, w.body(volumes=[{"volume": "data", "read_only": True}], network="none"), format="json"
    )
    assert res.status_code == 201, res.content
    assert res.json()["volumes"] == [{"kind": "volume", "name": "data", "path": "/workspace", "read_only": True}]


def test_the_booking_answer_equals_the_detail_serializer_with_mounts(w):
    project_network_set(project=w.project, network_name="atlas-egress", actor=w.operator)
    created = w.book(volume(), MountRequest(kind="dataset", name="imagenet", path="/data/in"), network="egress")
    stored = Reservation.objects.get(pk=created.pk)
    assert _json(reservation_detail(created)) == _json(ReservationDetailSerializer(stored).data)
    assert stored.network == "egress"
    assert stored.volumes[1] == {"kind": "dataset", "name": "imagenet", "path": "/data/in", "read_only": True}


# --- refusals, each naming the field ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mounts", "field"),
    [
        ([{"volume": "data", "path": "workspace"}], "container.volumes.0.path"),
        ([{"volume": "data", "path": "/proc/x"}], "container.volumes.0.path"),
        ([{"volume": "data", "path": "/etc"}], "container.volumes.0.path"),
        ([{"volume": "data", "path": "/a/../etc"}], "container.volumes.0.path"),
        ([{"volume": "data", "path": "/w/"}], "container.volumes.0.path"),
        ([{"dataset": "imagenet", "path": "/run/gpucp/x"}], "container.volumes.0.path"),
        ([{"volume": "data", "path": "/w"}, {"dataset": "imagenet", "path": "/w"}], "container.volumes.1.path"),
        ([{"volume": "data", "path": "/w"}, {"dataset": "imagenet", "path": "/w/in"}], "container.volumes.1.path"),
        ([{"dataset": "imagenet", "path": "/d/x"}, {"volume": "data", "path": "/d"}], "container.volumes.1.path"),
        ([{"volume": "data", "path": "/a"}, {"volume": "data", "path": "/b"}], "container.volumes.1.volume"),
        ([{"dataset": "imagenet", "read_only": False}], "container.volumes.0.read_only"),
        ([{"volume": "data", "dataset": "imagenet"}], "container.volumes.0.volume"),
        ([{"path": "/w"}], "container.volumes.0.volume"),
        ([{"volume": 7}], "container.volumes.0.volume"),
    ],
)
def test_a_bad_mount_is_a_400_naming_the_exact_field(w, mounts, field):
    error = refused(w, 400, volumes=mounts)
    assert list(error["fields"]) == [field], error


def test_more_mounts_than_the_agent_takes_are_refused(w):
    mounts = [{"dataset": "imagenet", "path": f"/d{i}"} for i in range(33)]
    assert list(refused(w, 400, volumes=mounts)["fields"]) == ["container.volumes"]


def test_an_unknown_volume_and_another_projects_volume_read_the_same(w):
    unknown = refused(w, 400, volumes=[{"volume": "nope"}])
    foreign = refused(w, 400, volumes=[{"volume": "secret"}])
    assert list(unknown["fields"]) == list(foreign["fields"]) == ["container.volumes.0.volume"]
    assert unknown["fields"]["container.volumes.0.volume"] == ["Project atlas has no volume 'nope'."]
    assert foreign["fields"]["container.volumes.0.volume"] == ["Project atlas has no volume 'secret'."]


def test_a_dataset_the_project_may_not_mount_is_refused_like_an_unknown_one(w):
    for name in ("private", "nope"):
        error = refused(w, 400, volumes=[{"dataset": name}])
        assert error["fields"] == {
            "container.volumes.0.dataset": [f"There is no dataset '{name}' that project atlas may mount."]
        }


def test_egress_without_an_egress_network_is_refused_and_allowed_once_an_operator_sets_one(w):
    error = refused(w, 400, network="egress")
    assert list(error["fields"]) == ["container.network"]
    assert "an operator must allow it" in error["message"]
    assert list(refused(w, 400, network="internet")["fields"]) == ["container.network"]
    project_network_set(project=w.project, network_name="atlas-egress", actor=w.operator)
    res = w.client(w.owner).post(BOOKINGS, w.body(network="egress"), format="json")
    assert res.status_code == 201 and res.json()["network"] == "egress"


def test_a_volume_over_its_limit_when_last_measured_is_a_409(w):
    measured(w.data, 10 * GIB + 1)
    error = refused(w, 409, volumes=[{"volume": "data"}])
    assert error["code"] == "volume_over_limit"
    assert list(error["fields"]) == ["container.volumes.0.volume"]
    assert error["used_bytes"] == 10 * GIB + 1 and error["limit_bytes"] == 10 * GIB
    # At the limit, or once raised, it books again.
    volume_update(volume=w.data, actor=w.owner, size_limit_gib=11)
    assert w.client(w.owner).post(BOOKINGS, w.body(volumes=[{"volume": "data"}]), format="json").status_code == 201


def test_a_non_shared_volume_in_an_overlapping_live_reservation_is_a_409(w):
    first = w.book(volume(), start_in=timedelta(hours=1), hours=2)
    error = refused(w, 409, volumes=[{"dataset": "imagenet"}, {"volume": "data"}], start_in=timedelta(hours=2))
    assert error["code"] == "volume_in_use"
    assert list(error["fields"]) == ["container.volumes.1.volume"]
    assert error["reservation"] == str(first.public_id) and str(first.public_id) in error["message"]


def test_back_to_back_windows_share_a_volume_and_a_cancelled_reservation_frees_it(w):
    now = timezone.now()
    first = w.book(volume(), start_in=timedelta(hours=1), hours=2, now=now)
    w.book(volume(), start_in=timedelta(hours=3), hours=1, now=now)  # starts as the first ends
    with pytest.raises(Conflict) as exc:
        w.book(volume(), start_in=timedelta(hours=2), hours=1, now=now)
    assert exc.value.code == "volume_in_use"
    services.reservation_cancel(reservation=first, actor=w.owner)
    w.book(volume(), start_in=timedelta(hours=2), hours=1, now=now)


def test_a_shared_volume_may_be_mounted_by_overlapping_reservations(w):
    volume_update(volume=w.data, actor=w.owner, shared=True)
    w.book(volume())
    w.book(volume())
    assert Reservation.objects.filter(project=w.project).count() == 2


def test_a_volume_stops_being_shared_only_when_its_mounts_no_longer_overlap(w):
    volume_update(volume=w.data, actor=w.owner, shared=True)
    a = w.book(volume())
    w.book(volume())
    with pytest.raises(Conflict) as exc:
        volume_update(volume=w.data, actor=w.owner, shared=False)
    assert exc.value.code == "volume_in_use" and list(exc.value.fields) == ["shared"]
    services.reservation_cancel(reservation=a, actor=w.owner)
    assert volume_update(volume=w.data, actor=w.owner, shared=False).shared is False


def test_extending_into_another_reservations_window_on_the_volume_is_refused(w):
    first = w.book(volume(), start_in=timedelta(hours=1), hours=2)
    w.book(volume(), start_in=timedelta(hours=4), hours=1)
    with pytest.raises(Conflict) as exc:
        services.reservation_extend(reservation=first, ends_at=first.ends_at + timedelta(hours=2), actor=w.owner)
    assert exc.value.code == "volume_in_use" and list(exc.value.fields) == ["ends_at"]
    assert Reservation.objects.get(pk=first.pk).ends_at == first.ends_at
    # Up to the other's start is fine.
    extended = services.reservation_extend(reservation=first, ends_at=first.ends_at + timedelta(hours=1), actor=w.owner)
    assert extended.ends_at == first.ends_at + timedelta(hours=1)


def test_extending_through_the_api_names_ends_at(w):
    first = w.book(volume(), start_in=timedelta(hours=1), hours=2)
    w.book(volume(), start_in=timedelta(hours=4), hours=1)
    res = w.client(w.member).post(
        f"{BOOKINGS}{first.public_id}/extend/", {"ends_at": (first.ends_at + timedelta(hours=3)).isoformat()}
    )
    assert res.status_code == 409 and res.json()["error"]["code"] == "volume_in_use"
    assert list(res.json()["error"]["fields"]) == ["ends_at"]


# --- who may book -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("who", "status"), [("owner", 201), ("member", 201), ("viewer", 403), ("outsider", 404)])
def test_who_may_book_a_volume(w, who, status):
    res = w.client(getattr(w, who)).post(BOOKINGS, w.body(volumes=[{"volume": "data"}]), format="json")
    assert res.status_code == status, res.content


def test_an_outsider_cannot_mount_their_volume_in_another_project_nor_learn_of_atlas_volumes(w):
    # Booking in their own project, naming atlas's volume: unknown, as any name that is not theirs.
    body = {**w.body(volumes=[{"volume": "data"}]), "project": "zephyr"}
    res = w.client(w.outsider).post(BOOKINGS, body, format="json")
    assert res.status_code == 400
    assert res.json()["error"]["fields"] == {"container.volumes.0.volume": ["Project zephyr has no volume 'data'."]}


# --- deleting a mounted volume ------------------------------------------------------------------------------


def test_a_volume_mounted_by_a_live_reservation_cannot_be_deleted(w):
    r = w.book(volume())
    with pytest.raises(Conflict) as exc:
        volume_delete(volume=w.data, actor=w.owner)
    assert exc.value.code == "volume_in_use"
    services.reservation_cancel(reservation=r, actor=w.owner)
    volume_delete(volume=w.data, actor=w.owner)
    assert not Volume.objects.filter(pk=w.data.pk).exists()


# --- the desired state ------------------------------------------------------------------------------------


def _running(w: VolumeWorld, reservation: Reservation) -> Launch:
    now = timezone.now()
    Reservation.objects.filter(pk=reservation.pk).update(starts_at=now - timedelta(minutes=1), state="running")
    return Launch.objects.create(
        reservation=reservation,
        server=w.server,
        launch_id=f"l-{reservation.pk}",
        gpu_uuids=[a.gpu.uuid for a in reservation.allocations.all()],
        state="running",
    )


def test_the_desired_container_mounts_with_the_limit_of_now_and_joins_the_egress_network(w):
    project_network_set(project=w.project, network_name="atlas-egress", actor=w.operator)
    r = w.book(volume(), MountRequest(kind="dataset", name="imagenet"), network="egress")
    _running(w, r)
    volume_update(volume=w.data, actor=w.owner, size_limit_gib=20)  # after booking: the new limit goes
    desired, stop = dispatch_services.node_desired_state(server=w.server)
    assert stop == [] and len(desired) == 1
    container = desired[0]
    assert [m.model_dump() for m in container.volumes] == [
        {"kind": "volume", "name": "data", "project": "atlas", "path": "/workspace", "read_only": False,
         "limit_bytes": 20 * GIB},
        {"kind": "dataset", "name": "imagenet", "project": None, "path": "/datasets/imagenet", "read_only": True,
         "limit_bytes": None},
    ]  # fmt: skip
    assert (container.network, container.network_name) == ("egress", "atlas-egress")
    # Withdrawn since booking: the next launch has no network.
    project_network_set(project=w.project, network_name=None, actor=w.operator)
    container = dispatch_services.node_desired_state(server=w.server)[0][0]
    assert (container.network, container.network_name) == ("none", None)


def test_a_plain_reservations_desired_container_has_no_mounts(w):
    _running(w, w.book())
    container = dispatch_services.node_desired_state(server=w.server)[0][0]
    assert (container.volumes, container.network, container.network_name) == ([], "none", None)


def test_a_requeued_follow_up_keeps_its_mounts_and_network(w):
    from controlplane.dispatch.models import Requeue
    from tests.dispatch.test_services import lose, opened
    from tests.reservations.fleet import server

    server(w.model, gpus=8)  # somewhere to go
    project_network_set(project=w.project, network_name="atlas-egress", actor=w.operator)
    w.project.requeue_on_interrupt = True
    w.project.save(update_fields=["requeue_on_interrupt"])
    r = w.book(volume(), MountRequest(kind="dataset", name="imagenet"), network="egress", start_in=timedelta(0))
    [launch] = opened(r)
    lose(launch.server)
    follow = Requeue.objects.get(interrupted=r).follow_up
    assert (follow.volumes, follow.network) == (r.volumes, "egress")


# --- the race, on PostgreSQL ------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_racing_bookings_of_one_volume_cannot_both_pass():
    w = VolumeWorld()
    start = timezone.now() + timedelta(hours=1)
    # Eight bookings of overlapping windows, on GPUs enough for all: only the volume keeps them apart.
    outcomes = race(
        *(lambda i=i: w.book(volume(), start_in=timedelta(hours=1, minutes=i), now=start) for i in range(8))
    )
    assert outcomes == ["ok"] + ["volume_in_use"] * 7
    assert Reservation.objects.filter(project=w.project).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_booking_racing_the_volumes_delete_either_mounts_it_or_finds_it_gone():
    w = VolumeWorld()
    outcomes = race(lambda: w.book(volume()), lambda: volume_delete(volume=w.data, actor=w.owner))
    mounted = Reservation.objects.filter(project=w.project).exists()
    kept = Volume.objects.filter(pk=w.data.pk).exists()
    if mounted:
        assert outcomes == ["ok", "volume_in_use"] and kept
    else:
        assert outcomes == ["ok", "validation_error"] and not kept


def test_a_code_caller_gets_the_same_refusals(w):
    with pytest.raises(ValidationFailed) as exc:
        w.book(MountRequest(kind="volume", name="data", path="/sys/fs"))
    assert list(exc.value.fields) == ["container.volumes.0.path"]
    volume_create(project=w.project, name="other", size_limit_gib=1, actor=w.owner)
    with pytest.raises(ValidationFailed) as exc:
        w.book(volume("data"), volume("other"))  # both at /workspace
    assert list(exc.value.fields) == ["container.volumes.1.path"]
