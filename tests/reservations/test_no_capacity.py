"""A ``no_capacity`` refusal says why: too few in the fleet, too few usable now, or all busy (and when not)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu
from controlplane.reservations.models import Reservation
from tests.factories import UserFactory
from tests.reservations.fleet import gpu_model, project, server
from tests.reservations.test_api import URL, body

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner():  # type: ignore[no-untyped-def]
    return UserFactory()


@pytest.fixture
def proj(owner):  # type: ignore[no-untyped-def]
    return project(owner=owner, grant="100000")


def book(client: APIClient, proj, count: int, *, hours: int = 2, whole: int | None = None):  # type: ignore[no-untyped-def]
    data = body(proj)
    data["spec"] = {"gpu_model": "H100-80GB", **({"whole_servers": whole} if whole else {"gpu_count": count})}
    start = timezone.now() + timedelta(hours=1)
    data["window"] = {"start": start.isoformat(), "end": (start + timedelta(hours=hours)).isoformat()}
    return client.post(URL, data, format="json")


@pytest.fixture
def client(owner) -> APIClient:  # type: ignore[no-untyped-def]
    api = APIClient()
    api.force_authenticate(owner)
    return api


def test_more_than_the_fleet_has_says_so_with_the_count(client, proj):
    model = gpu_model()
    server(model, gpus=8)
    server(model, gpus=8)
    response = book(client, proj, 17)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "no_capacity"
    assert "The fleet has 16 H100-80GB GPUs (16 healthy on ready servers)" in error["message"]
    assert "fewer than the 17 asked for" in error["message"]
    assert error["fields"] == {"spec.gpu_count": [error["message"]]}
    assert error["fleet"] == {"matching": 16, "usable": 16}
    assert error["earliest_window"] is None
    assert not Reservation.objects.exists()


def test_too_few_usable_names_the_healthy_count(client, proj):
    model = gpu_model()
    server(model, gpus=8)
    server(model, gpus=8, state=ServerState.DRAINING)
    Gpu.objects.filter(index=0, server__state=ServerState.READY).update(health=GpuHealth.UNHEALTHY)
    response = book(client, proj, 8)
    error = response.json()["error"]
    assert response.status_code == 409 and error["code"] == "no_capacity"
    assert "The fleet has 16 H100-80GB GPUs, but only 7 healthy on ready servers now" in error["message"]
    assert error["fleet"] == {"matching": 16, "usable": 7}
    assert list(error["fields"]) == ["spec.gpu_count"]


def test_all_busy_says_so_and_gives_the_earliest_window_that_fits(client, proj):
    server(gpu_model(), gpus=8)
    first = book(client, proj, 8, hours=2)
    assert first.status_code == 201, first.json()
    response = book(client, proj, 8, hours=1)
    error = response.json()["error"]
    assert response.status_code == 409 and error["code"] == "no_capacity"
    assert "Not enough H100-80GB GPUs are free for the whole window: 8 asked for" in error["message"]
    assert "bookings hold the rest of the fleet's 8 (8 healthy on ready servers)" in error["message"]
    assert list(error["fields"]) == ["window"]
    assert error["fleet"] == {"matching": 8, "usable": 8}
    # The first booking's end: the earliest window of the same length that fits.
    assert error["earliest_window"]["start"] == first.json()["ends_at"]
    assert f"starts at {first.json()['ends_at']}" in error["message"]
    # Booking what it says books.
    again = body(proj)
    again["window"] = error["earliest_window"]
    again["spec"] = {"gpu_model": "H100-80GB", "gpu_count": 8}
    assert client.post(URL, again, format="json").status_code == 201


def test_all_busy_for_the_whole_week_says_none_fits(client, proj):
    server(gpu_model(), gpus=8)
    assert book(client, proj, 8, hours=24 * 9).status_code == 201
    error = book(client, proj, 1, hours=1).json()["error"]
    assert error["code"] == "no_capacity"
    assert "None is free for a window of this length in the 7 days after its start" in error["message"]
    assert error["earliest_window"] is None


def test_whole_servers_are_counted_as_servers(client, proj):
    model = gpu_model()
    server(model, gpus=8)
    other = gpu_model("A100-40GB", memory_mib=40960)
    server(other, gpus=4)
    error = book(client, proj, 0, whole=2).json()["error"]
    assert error["code"] == "no_capacity"
    assert (
        "The fleet has 1 whole server of H100-80GB GPUs (1 healthy on ready servers): fewer than the 2"
        in error["message"]
    )
    assert error["fleet"] == {"matching": 1, "usable": 1}
    assert list(error["fields"]) == ["spec.whole_servers"]
