from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.reservations import services
from controlplane.reservations.models import Reservation
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window

pytestmark = pytest.mark.django_db
URL = "/api/v1/reservations/"


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    model = gpu_model()
    server(model, gpus=8)
    return model


@pytest.fixture
def team():  # type: ignore[no-untyped-def]
    owner, member, viewer, outsider = (UserFactory() for _ in range(4))
    proj = project(owner=owner, member=member, viewer=viewer, grant="1000")
    return {"project": proj, "owner": owner, "member": member, "viewer": viewer, "outsider": outsider}


def body(proj, **over):  # type: ignore[no-untyped-def]
    start = timezone.now() + timedelta(hours=1)
    data = {
        "project": proj.slug,
        "name": "train",
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 2},
        "window": {"start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat()},
        "container": {"image": "registry.example/train:1", "command": ["python", "train.py"], "env": {"A": "1"}},
    }
    data.update(over)
    return data


@pytest.mark.parametrize(("role", "expected"), [("owner", 201), ("member", 201), ("viewer", 403), ("outsider", 404)])
def test_booking_needs_owner_or_member(api_client, fleet, team, role, expected):
    api_client.force_authenticate(team[role])
    response = api_client.post(URL, body(team["project"]), format="json")
    assert response.status_code == expected, response.data
    if role == "outsider":
        # Another tenant's project reads as not existing, never as "forbidden".
        assert response.data["error"]["code"] == "not_found"


def test_booking_returns_allocations_and_events(api_client, fleet, team):
    api_client.force_authenticate(team["member"])
    response = api_client.post(URL, body(team["project"]), format="json")
    assert response.status_code == 201
    data = response.data
    assert data["state"] == "scheduled" and len(data["allocations"]) == 2
    assert len({a["server"] for a in data["allocations"]}) == 1
    assert [e["to_state"] for e in data["events"]] == ["pending", "scheduled"]
    assert data["spec"] == {
        "gpu_model": "H100-80GB",
        "min_memory_mib": None,
        "gpu_count": 2,
        "whole_servers": None,
        "mig_profile": None,
    }


def test_start_now_is_accepted(api_client, fleet, team):
    api_client.force_authenticate(team["owner"])
    end = (timezone.now() + timedelta(hours=1)).isoformat()
    response = api_client.post(URL, body(team["project"], window={"start": "now", "end": end}), format="json")
    assert response.status_code == 201, response.data


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"spec": {"gpu_model": "H100-80GB", "gpu_count": 0}}, "spec.gpu_count"),
        ({"spec": {"gpu_model": "NOPE", "gpu_count": 1}}, "spec.gpu_model"),
        ({"spec": {"gpu_count": 1}}, "spec.gpu_model"),
        ({"spec": {"gpu_model": "H100-80GB", "min_memory_mib": 1000, "gpu_count": 1}}, "spec.gpu_model"),
        ({"spec": {"gpu_model": "H100-80GB"}}, "spec.gpu_count"),
        ({"container": {"command": []}}, "container.image"),
        ({"container": {"image": "x", "env": {"A": 1}}}, "container.env.A"),
        ({"container": {"image": "x", "env": ["A=1"]}}, "container.env"),
        ({"container": {"image": "x", "command": "python train.py"}}, "container.command"),
        ({"window": {"start": "2020-01-01T00:00:00Z", "end": "2020-01-01T01:00:00Z"}}, "window.start"),
        ({"window": {"start": "now", "end": "2020-01-01T01:00:00Z"}}, "window.end"),
        ({"name": ""}, "name"),
    ],
)
def test_bad_input_names_the_field(api_client, fleet, team, change, field):
    api_client.force_authenticate(team["owner"])
    response = api_client.post(URL, body(team["project"], **change), format="json")
    assert response.status_code == 400, response.data
    assert field in response.data["error"]["fields"], response.data
    assert not Reservation.objects.exists()


def test_double_booking_is_a_409(api_client, team):
    server(gpu_model(), gpus=2)
    api_client.force_authenticate(team["owner"])
    assert api_client.post(URL, body(team["project"]), format="json").status_code == 201
    response = api_client.post(URL, body(team["project"]), format="json")
    assert response.status_code == 409
    assert response.data["error"]["code"] == "no_capacity"


def test_quota_refusal_names_quota_need_and_what_is_left(api_client, fleet):
    owner = UserFactory()
    proj = project(owner=owner, grant="1")
    api_client.force_authenticate(owner)
    response = api_client.post(URL, body(proj), format="json")
    assert response.status_code == 409
    error = response.data["error"]
    assert error["code"] == "quota_exceeded"
    assert (error["quota"], error["needed"], error["available"]) == ("credits", "4.0000", "1.0000")


def test_another_tenants_reservation_is_404(api_client, fleet, team):
    r = services.reservation_create(
        project=team["project"], name="x", spec=spec(fleet), window=window(), container=CONTAINER, actor=team["owner"]
    )
    api_client.force_authenticate(team["outsider"])
    assert api_client.get(f"{URL}{r.public_id}/").status_code == 404
    assert api_client.post(f"{URL}{r.public_id}/cancel/", {}, format="json").status_code == 404
    assert api_client.get(URL).data["count"] == 0
    api_client.force_authenticate(team["viewer"])
    assert api_client.get(f"{URL}{r.public_id}/").status_code == 200
    assert api_client.post(f"{URL}{r.public_id}/cancel/", {}, format="json").status_code == 403
    api_client.force_authenticate(OperatorFactory())
    assert api_client.get(f"{URL}{r.public_id}/").status_code == 200


def test_cancel_release_and_extend_through_the_api(api_client, fleet, team):
    api_client.force_authenticate(team["member"])
    created = api_client.post(URL, body(team["project"]), format="json").data
    rid = created["id"]
    new_end = (Reservation.objects.get(public_id=rid).ends_at + timedelta(hours=1)).isoformat()
    extended = api_client.post(f"{URL}{rid}/extend/", {"ends_at": new_end, "reason": "more epochs"}, format="json")
    assert extended.status_code == 200, extended.data
    assert extended.data["events"][-1]["reason"] == "more epochs"
    bad = api_client.post(f"{URL}{rid}/extend/", {"ends_at": created["starts_at"]}, format="json")
    assert bad.status_code == 400 and "ends_at" in bad.data["error"]["fields"]
    cancelled = api_client.post(f"{URL}{rid}/cancel/", {"reason": "not needed"}, format="json")
    assert cancelled.status_code == 200 and cancelled.data["state"] == "cancelled"
    again = api_client.post(f"{URL}{rid}/release/", {}, format="json")
    assert again.status_code == 409


def test_list_filters_by_state_and_time_without_n_plus_one(api_client, fleet, team):
    for i in range(6):
        services.reservation_create(
            project=team["project"],
            name=f"r{i}",
            spec=spec(fleet),
            window=window(start_in=timedelta(hours=1 + 3 * i), hours=2),
            container=CONTAINER,
            actor=team["owner"],
        )
    first = Reservation.objects.order_by("starts_at").first()
    services.reservation_cancel(reservation=first, actor=None)
    api_client.force_authenticate(team["viewer"])
    with CaptureQueriesContext(connection) as ctx:
        response = api_client.get(URL, {"state": "scheduled", "project": team["project"].slug})
    assert response.data["count"] == 5
    assert len(ctx.captured_queries) <= 6
    later = (timezone.now() + timedelta(hours=8)).isoformat()
    assert api_client.get(URL, {"starts_before": later}).data["count"] == 3


def test_availability_free_and_earliest(api_client, fleet, team):
    api_client.force_authenticate(team["viewer"])
    w = window(hours=2)
    services.reservation_create(
        project=team["project"],
        name="big",
        spec=spec(fleet, count=8),
        window=w,
        container=CONTAINER,
        actor=team["owner"],
    )
    params = {"gpu_model": "H100-80GB", "gpu_count": 2, "start": w.starts_at.isoformat(), "end": w.ends_at.isoformat()}
    free = api_client.get("/api/v1/availability/free/", params)
    assert free.status_code == 200 and free.data["free_gpus"] == 0 and free.data["proposal"] is None
    earliest = api_client.get(
        "/api/v1/availability/earliest/",
        {"gpu_model": "H100-80GB", "gpu_count": 4, "duration_hours": "3", "within_days": 2},
    )
    assert earliest.data["found"] is True
    # Three hours do not fit before the booked window opens in an hour, so the first fit is at its end.
    assert earliest.data["start"] == w.ends_at and len(earliest.data["gpus"]) == 4
    bad = api_client.get("/api/v1/availability/free/", {"gpu_count": 1, "start": "now", "end": "x"})
    assert bad.status_code == 400 and "end" in bad.data["error"]["fields"]
    neither = api_client.get("/api/v1/availability/free/", {"gpu_count": 1, "start": "now", "end": params["end"]})
    assert neither.status_code == 400 and "gpu_model" in neither.data["error"]["fields"]


def test_timeline_hides_other_tenants_reservations(api_client, fleet, team):
    other_owner = UserFactory()
    other = project(owner=other_owner)
    w = window(hours=2)
    mine = services.reservation_create(
        project=team["project"], name="mine", spec=spec(fleet), window=w, container=CONTAINER, actor=team["owner"]
    )
    services.reservation_create(
        project=other, name="theirs", spec=spec(fleet), window=w, container=CONTAINER, actor=other_owner
    )
    api_client.force_authenticate(team["viewer"])
    response = api_client.get(
        "/api/v1/availability/timeline/", {"start": "now", "end": (w.ends_at + timedelta(hours=1)).isoformat()}
    )
    assert response.status_code == 200
    segments = [s for g in response.data["gpus"] for s in g["segments"]]
    assert len(segments) == 2
    assert {s["reservation"] for s in segments} == {str(mine.public_id), None}
    assert {s["project"] for s in segments} == {team["project"].slug, None}


def _statements(queries) -> list[str]:  # type: ignore[no-untyped-def]
    """The statements that do work: transaction control (BEGIN, SAVEPOINT, ...) aside."""
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")
    return [q["sql"] for q in queries if not q["sql"].upper().startswith(control)]


def test_booking_through_the_api_reads_little_and_never_per_gpu(api_client, team):  # type: ignore[no-untyped-def]
    model = gpu_model()
    for _ in range(3):
        server(model, gpus=8)
    api_client.force_authenticate(team["owner"])
    counts = {}
    for n, gpus in enumerate((1, 8)):
        data = body(team["project"])
        start = timezone.now() + timedelta(hours=1 + 3 * n)
        data["spec"]["gpu_count"] = gpus
        data["window"] = {"start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat()}
        with CaptureQueriesContext(connection) as queries:
            response = api_client.post(URL, data, format="json")
        assert response.status_code == 201, response.content
        assert len(response.data["allocations"]) == gpus and len(response.data["events"]) == 2
        assert {a["server"] for a in response.data["allocations"]} and response.data["spec"]["gpu_model"] == model.name
        counts[gpus] = len(_statements(queries.captured_queries))
    # Project + role + GPU model, project lock, free counts, topology, GPU locks, re-check, quota and balance,
    # four inserts, the notifications outbox row (it commits with the booking, docs/notifications.md), the
    # allocations and events the response shows, read back by one prefetch each, and the GPU count of their servers
    # for what the container gets there (``container_resources``, reservations/resources.py).
    assert counts[1] == counts[8] <= 15, counts
