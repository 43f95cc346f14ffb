"""GET /api/v1/reservations/{id}/telemetry/: a reservation's GPU telemetry, for its members, inside its period."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.urls import resolve
from django.utils import timezone

from controlplane.accounting.api.telemetry import ReservationTelemetryView
from controlplane.inventory.models import Gpu, Server
from controlplane.reservations.models import Allocation, Reservation
from tests.accounting.helpers import book, finish, telemetry
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import project

pytestmark = pytest.mark.django_db

SAMPLE = {
    "DCGM_FI_DEV_GPU_UTIL": 87.0,
    "DCGM_FI_DEV_FB_USED": 40960.0,
    "DCGM_FI_DEV_POWER_USAGE": 612.5,
    "DCGM_FI_DEV_GPU_TEMP": 71.0,
}


def url(reservation: Reservation, since: datetime | str | None = None) -> str:
    base = f"/api/v1/reservations/{reservation.public_id}/telemetry/"
    if since is None:
        return base
    return f"{base}?since={since if isinstance(since, str) else since.isoformat().replace('+00:00', 'Z')}"


def held(reservation: Reservation) -> Any:
    # A fresh query: the booking service may leave its own prefetched list on the returned object.
    return Allocation.objects.filter(reservation=reservation)


def this_minute() -> datetime:
    return timezone.now().replace(second=0, microsecond=0)


def sample_now(gpu_id: int, at: datetime | None = None) -> None:
    Gpu.objects.filter(pk=gpu_id).update(telemetry=SAMPLE, telemetry_at=at or timezone.now())


@pytest.fixture
def people() -> dict[str, Any]:
    return {"owner": UserFactory(), "member": UserFactory(), "viewer": UserFactory(), "outsider": UserFactory()}


@pytest.fixture
def tenant(people: dict[str, Any]) -> Any:
    return project(owner=people["owner"], member=people["member"], viewer=people["viewer"])


@pytest.fixture
def running(tenant: Any, model: Any, rack: Any) -> Reservation:
    """Two GPUs held from 30.5 minutes ago for another hour, with minutes from before the booking began."""
    start = this_minute() - timedelta(minutes=30) + timedelta(seconds=30)
    reservation = book(tenant, model, start, start + timedelta(hours=1), count=2)
    for gpu_id in held(reservation).values_list("gpu_id", flat=True):
        telemetry(gpu_id, this_minute() - timedelta(minutes=40), 41, util=60.0, power_w=400.0, fb_mib=2048.0)
        sample_now(gpu_id)
    return reservation


@pytest.mark.parametrize("role", ["owner", "member", "viewer"])
def test_project_members_see_their_reservations_gpus_with_latest_sample_and_minutes(
    api_client: Any, people: dict[str, Any], running: Reservation, role: str
) -> None:
    api_client.force_authenticate(people[role])
    response = api_client.get(url(running))
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["reservation"] == str(running.public_id)
    assert len(body["gpus"]) == 2
    gpus = {a.gpu.uuid: a.gpu for a in held(running).select_related("gpu__server", "gpu__model")}
    for gpu in body["gpus"]:
        assert gpu["uuid"] in gpus
        assert gpu["server"] == gpus[gpu["uuid"]].server.hostname
        assert gpu["index"] == gpus[gpu["uuid"]].index
        assert gpu["model"] == "H100-80GB"
        assert gpu["simulated"] is False
        assert gpu["live"] is True
        assert gpu["latest"]["values"] == SAMPLE
        assert gpu["minutes"][-1] == {
            "minute": this_minute().isoformat().replace("+00:00", "Z"),
            "samples": 60,
            "util_avg": 60.0,
            "util_max": 60.0,
            "fb_used_max_mib": 2048.0,
            "power_avg_w": 400.0,
            "temp_max_c": None,
            # DCGM's profiling fields: none in these minutes (a GPU without GPM), so null, not zero.
            "sm_active_avg": None,
            "tensor_active_avg": None,
            "dram_active_avg": None,
        }


def test_another_tenants_reservation_is_not_found(
    api_client: Any, people: dict[str, Any], running: Reservation
) -> None:
    api_client.force_authenticate(people["outsider"])
    response = api_client.get(url(running))
    assert response.status_code == 404
    assert "DCGM" not in response.content.decode()


def test_unknown_reservation_is_not_found(api_client: Any, people: dict[str, Any], running: Reservation) -> None:
    api_client.force_authenticate(people["owner"])
    assert api_client.get("/api/v1/reservations/00000000-0000-0000-0000-000000000000/telemetry/").status_code == 404


def test_anonymous_caller_is_refused(api_client: Any, running: Reservation) -> None:
    response = api_client.get(url(running))
    assert response.status_code in (401, 403)
    assert "gpus" not in response.json()


def test_operators_see_any_reservations_telemetry(api_client: Any, running: Reservation) -> None:
    api_client.force_authenticate(OperatorFactory())
    response = api_client.get(url(running))
    assert response.status_code == 200
    assert all(gpu["latest"] is not None for gpu in response.json()["gpus"])


def test_minutes_outside_the_allocation_are_not_returned(
    api_client: Any, people: dict[str, Any], running: Reservation
) -> None:
    """The booking began 30.5 minutes ago: the minute it began in also holds the previous holder's samples."""
    api_client.force_authenticate(people["owner"])
    body = api_client.get(url(running)).json()
    started = held(running).first().starts_at  # type: ignore[union-attr]
    for gpu in body["gpus"]:
        minutes = [datetime.fromisoformat(m["minute"]) for m in gpu["minutes"]]
        assert minutes == sorted(minutes)
        assert minutes[0] == this_minute() - timedelta(minutes=29)
        assert all(m >= started for m in minutes)
        assert len(minutes) == 30


def test_since_narrows_the_series(api_client: Any, people: dict[str, Any], running: Reservation) -> None:
    api_client.force_authenticate(people["owner"])
    since = this_minute() - timedelta(minutes=5, seconds=-10)
    body = api_client.get(url(running, since)).json()
    for gpu in body["gpus"]:
        # The minute that contains ``since`` overlaps the range, so it counts.
        assert gpu["minutes"][0]["minute"] == (this_minute() - timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
        assert len(gpu["minutes"]) == 6


def test_no_latest_sample_and_no_minutes_after_the_reservation_ended(
    api_client: Any, people: dict[str, Any], tenant: Any, model: Any, rack: Any
) -> None:
    start = this_minute() - timedelta(minutes=60)
    reservation = book(tenant, model, start, start + timedelta(hours=2))
    gpu_id = held(reservation).get().gpu_id
    telemetry(gpu_id, start, 61)
    ended = this_minute() - timedelta(minutes=20) + timedelta(seconds=30)
    finish(reservation, ended_at=ended)
    # The GPU went on to someone else, whose sample is the GPU's latest now.
    sample_now(gpu_id)

    api_client.force_authenticate(people["owner"])
    (gpu,) = api_client.get(url(reservation)).json()["gpus"]
    assert gpu["live"] is False
    assert gpu["latest"] is None
    last = datetime.fromisoformat(gpu["minutes"][-1]["minute"])
    assert last == this_minute() - timedelta(minutes=21)
    assert last + timedelta(minutes=1) <= ended


def test_a_sample_taken_before_the_allocation_began_is_not_shown(
    api_client: Any, people: dict[str, Any], tenant: Any, model: Any, rack: Any
) -> None:
    start = timezone.now() - timedelta(minutes=1)
    reservation = book(tenant, model, start, start + timedelta(hours=1))
    # The agent's last heartbeat predates the booking: the figures are the previous holder's.
    sample_now(held(reservation).get().gpu_id, at=start - timedelta(seconds=5))
    api_client.force_authenticate(people["owner"])
    (gpu,) = api_client.get(url(reservation)).json()["gpus"]
    assert gpu["live"] is True
    assert gpu["latest"] is None


def test_a_future_reservation_has_gpus_but_no_figures(
    api_client: Any, people: dict[str, Any], tenant: Any, model: Any, rack: Any
) -> None:
    start = timezone.now() + timedelta(hours=2)
    reservation = book(tenant, model, start, start + timedelta(hours=1))
    gpu_id = held(reservation).get().gpu_id
    telemetry(gpu_id, this_minute() - timedelta(minutes=10), 11)
    sample_now(gpu_id)
    api_client.force_authenticate(people["owner"])
    (gpu,) = api_client.get(url(reservation)).json()["gpus"]
    assert gpu["live"] is False
    assert gpu["latest"] is None
    assert gpu["minutes"] == []


def test_a_reservation_without_allocations_answers_with_no_gpus(
    api_client: Any, people: dict[str, Any], running: Reservation
) -> None:
    Allocation.objects.filter(reservation=running).delete()
    api_client.force_authenticate(people["viewer"])
    response = api_client.get(url(running))
    assert response.status_code == 200
    assert response.json()["gpus"] == []


def test_simulated_gpus_are_labelled(api_client: Any, people: dict[str, Any], running: Reservation) -> None:
    Server.objects.filter(gpus__allocations__reservation=running).update(simulated=True)
    api_client.force_authenticate(people["owner"])
    assert all(gpu["simulated"] for gpu in api_client.get(url(running)).json()["gpus"])


@pytest.mark.parametrize(
    ("since", "message"),
    [("yesterday", "since"), ((timezone.now() - timedelta(days=2)).isoformat(), "24 hours")],
)
def test_bad_since_is_refused_naming_the_field(
    api_client: Any, people: dict[str, Any], running: Reservation, since: str, message: str
) -> None:
    api_client.force_authenticate(people["owner"])
    response = api_client.get(url(running, since.replace("+00:00", "Z")))
    assert response.status_code == 400
    error = response.json()["error"]
    assert "since" in error["fields"]
    assert message in error["message"]


def test_telemetry_costs_two_queries_whatever_the_gpu_count(
    api_client: Any, people: dict[str, Any], tenant: Any, model: Any, rack: Any, django_assert_max_num_queries: Any
) -> None:
    start = this_minute() - timedelta(minutes=10)
    reservation = book(tenant, model, start, start + timedelta(hours=1), count=4)
    for gpu_id in held(reservation).values_list("gpu_id", flat=True):
        telemetry(gpu_id, start, 11)
        sample_now(gpu_id)
    api_client.force_authenticate(people["owner"])
    with django_assert_max_num_queries(2):
        body = api_client.get(url(reservation)).json()
    assert len(body["gpus"]) == 4
    assert all(len(gpu["minutes"]) == 11 for gpu in body["gpus"])


def test_route_does_not_collide_with_the_reservations_router(running: Reservation) -> None:
    assert resolve(url(running)).func.view_class is ReservationTelemetryView  # type: ignore[attr-defined]
    assert resolve(f"/api/v1/reservations/{running.public_id}/").func.cls.__name__ == "ReservationViewSet"  # type: ignore[attr-defined]
