"""Booking MIG slices through the API: the spec, the answer, and bad specs as 400s naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.reservations.models import Reservation
from tests.factories import UserFactory
from tests.reservations.fleet import gpu_model, project
from tests.reservations.test_api import URL, body
from tests.reservations.test_mig_booking import SEVEN_ONES, mig_server

pytestmark = pytest.mark.django_db


@pytest.fixture
def member_project() -> dict[str, Any]:
    member = UserFactory()
    return {"member": member, "project": project(member=member, grant="1000")}


def test_a_slice_booking_answers_its_mig_devices_and_spans(api_client, member_project):  # type: ignore[no-untyped-def]
    mig_server(gpu_model(weight="2"), [SEVEN_ONES])
    api_client.force_authenticate(member_project["member"])
    response = api_client.post(
        URL, body(member_project["project"], spec={"mig_profile": "1g.10gb", "gpu_count": 2}), format="json"
    )
    assert response.status_code == 201, response.data
    data = response.data
    assert data["spec"]["mig_profile"] == "1g.10gb" and data["spec"]["gpu_model"] is None
    assert [a["slices"] for a in data["allocations"]] == [[0, 1], [1, 2]]
    assert all(a["mig_device"].startswith("MIG-") for a in data["allocations"])
    # 2 slices x 1/8 of weight 2: half a credit an hour.
    assert data["cost"]["credits_per_hour"] == "0.5000"
    detail = api_client.get(f"{URL}{data['id']}/")
    assert detail.status_code == 200
    assert [a["mig_device"] for a in detail.data["allocations"]] == [a["mig_device"] for a in data["allocations"]]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"mig_profile": "huge", "gpu_count": 1}, "spec.mig_profile"),
        ({"mig_profile": "1g.10gb", "gpu_model": "H100-80GB", "gpu_count": 1}, "spec.mig_profile"),
        ({"mig_profile": "1g.10gb", "min_memory_mib": 100, "gpu_count": 1}, "spec.mig_profile"),
        ({"mig_profile": "1g.10gb", "whole_servers": 1}, "spec.whole_servers"),
        ({"mig_profile": "1g.10gb"}, "spec.gpu_count"),
        ({"mig_profile": 7, "gpu_count": 1}, "spec.mig_profile"),
    ],
)
def test_bad_slice_specs_are_400_naming_the_field(api_client, member_project, spec, field):  # type: ignore[no-untyped-def]
    mig_server(gpu_model(), [SEVEN_ONES])
    api_client.force_authenticate(member_project["member"])
    response = api_client.post(URL, body(member_project["project"], spec=spec), format="json")
    assert response.status_code == 400, response.data
    assert field in response.data["error"]["fields"], response.data
    assert not Reservation.objects.exists()


def test_no_free_slice_is_a_409_naming_the_profile(api_client, member_project):  # type: ignore[no-untyped-def]
    mig_server(gpu_model(), [[("3g.40gb", 0)]])
    api_client.force_authenticate(member_project["member"])
    response = api_client.post(
        URL, body(member_project["project"], spec={"mig_profile": "3g.40gb", "gpu_count": 2}), format="json"
    )
    assert response.status_code == 409, response.data
    assert response.data["error"]["code"] == "no_capacity"
    assert "spec.mig_profile" in response.data["error"]["fields"]
