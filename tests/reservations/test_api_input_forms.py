"""The forms of input people send that the API used to misread or answer badly."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.reservations.api.serializers import ReservationCreateSerializer
from controlplane.reservations.models import Reservation
from tests.factories import UserFactory
from tests.reservations.fleet import gpu_model, project, server
from tests.reservations.test_api import URL, body

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    model = gpu_model()
    server(model, gpus=8)
    return model


@pytest.fixture
def team():  # type: ignore[no-untyped-def]
    owner, outsider = UserFactory(), UserFactory()
    return {"project": project(owner=owner, grant="1000"), "owner": owner, "outsider": outsider}


NAIVE = "add Z or an offset, e.g. 2026-05-01T14:00:00Z"


def _naive(hours: int) -> str:
    return (timezone.now() + timedelta(hours=hours)).replace(tzinfo=None).isoformat()


@pytest.mark.parametrize("field", ["start", "end"])
def test_a_window_time_without_a_time_zone_is_refused_naming_the_field(api_client, fleet, team, field):
    api_client.force_authenticate(team["owner"])
    data = body(team["project"])
    data["window"][field] = _naive(3 if field == "start" else 5)
    response = api_client.post(URL, data, format="json")
    assert response.status_code == 400, response.data
    assert NAIVE in response.data["error"]["fields"][f"window.{field}"][0]
    assert not Reservation.objects.exists()


@pytest.mark.parametrize("value", ["2026-05-01T14:00:00", "2026-05-01 14:00", "2026-05-01"])
def test_the_booking_serializer_refuses_a_naive_time(team, value):
    gpu_model()
    data = body(team["project"])
    data["window"]["end"] = value
    serializer = ReservationCreateSerializer(data=data)
    assert not serializer.is_valid()
    assert NAIVE in str(serializer.errors["window"]["end"][0])


def test_an_offset_is_read_as_that_offset(api_client, fleet, team):
    api_client.force_authenticate(team["owner"])
    start = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    data = body(team["project"])
    berlin = timezone.get_fixed_timezone(120)
    data["window"] = {
        "start": start.astimezone(berlin).isoformat(),
        "end": (start + timedelta(hours=1)).astimezone(berlin).isoformat(),
    }
    response = api_client.post(URL, data, format="json")
    assert response.status_code == 201, response.data
    assert Reservation.objects.get().starts_at == start


def test_availability_refuses_a_naive_time(api_client, fleet, team):
    api_client.force_authenticate(team["owner"])
    query = {"gpu_model": "H100-80GB", "gpu_count": 1, "start": "now", "end": _naive(4)}
    response = api_client.get("/api/v1/availability/free/", query)
    assert response.status_code == 400
    assert NAIVE in response.data["error"]["fields"]["end"][0]


def test_json_sent_without_content_type_books(api_client, fleet, team):
    api_client.force_authenticate(team["owner"])
    response = api_client.generic("POST", URL, json.dumps(body(team["project"])), content_type="")
    assert response.status_code == 201, response.content
    assert Reservation.objects.count() == 1


def _booked(api_client, team):  # type: ignore[no-untyped-def]
    api_client.force_authenticate(team["owner"])
    response = api_client.post(URL, body(team["project"]), format="json")
    assert response.status_code == 201, response.data
    return response.data["id"]


def test_delete_is_a_405_naming_the_cancel_command(api_client, fleet, team):
    rid = _booked(api_client, team)
    response = api_client.delete(f"{URL}{rid}/")
    assert response.status_code == 405
    error = response.json()["error"]
    assert error["code"] == "method_not_allowed"
    assert f"POST /api/v1/reservations/{rid}/cancel/" in error["message"]
    assert "DELETE" not in response["Allow"]
    assert Reservation.objects.get().state == "scheduled"


def test_delete_by_an_outsider_does_not_confirm_the_reservation(api_client, fleet, team):
    rid = _booked(api_client, team)
    api_client.force_authenticate(team["outsider"])
    mine = api_client.delete(f"{URL}{rid}/").json()["error"]["message"]
    missing = "00000000-0000-0000-0000-000000000000"
    theirs = api_client.delete(f"{URL}{missing}/").json()["error"]["message"]
    assert mine.replace(rid, missing) == theirs
    assert Reservation.objects.get().state == "scheduled"


@pytest.mark.parametrize("form", ["ends_at", "window"])
def test_extend_takes_ends_at_or_the_bookings_window_end(api_client, fleet, team, form):
    rid = _booked(api_client, team)
    new_end = Reservation.objects.get().ends_at + timedelta(hours=1)
    data = {"ends_at": new_end.isoformat()} if form == "ends_at" else {"window": {"end": new_end.isoformat()}}
    response = api_client.post(f"{URL}{rid}/extend/", data, format="json")
    assert response.status_code == 200, response.data
    assert Reservation.objects.get().ends_at == new_end


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "ends_at"),
        ({"window": {}}, "window.end"),
        ({"window": {"end": "2030-01-01T00:00:00"}}, "window.end"),
        ({"ends_at": "2030-01-01T00:00:00Z", "window": {"end": "2030-01-01T00:00:00Z"}}, "ends_at"),
    ],
)
def test_extend_refuses_a_missing_naive_or_doubled_end(api_client, fleet, team, data, field):
    rid = _booked(api_client, team)
    before = Reservation.objects.get().ends_at
    response = api_client.post(f"{URL}{rid}/extend/", data, format="json")
    assert response.status_code == 400, response.data
    assert field in response.data["error"]["fields"]
    assert Reservation.objects.get().ends_at == before


def test_extend_by_an_outsider_is_404_in_either_form(api_client, fleet, team):
    rid = _booked(api_client, team)
    api_client.force_authenticate(team["outsider"])
    response = api_client.post(f"{URL}{rid}/extend/", {"window": {"end": "2030-01-01T00:00:00Z"}}, format="json")
    assert response.status_code == 404


@pytest.mark.parametrize("name", ["h100-80gb", "H100-80gb"])
def test_a_gpu_model_name_in_another_case_books(api_client, fleet, team, name):
    api_client.force_authenticate(team["owner"])
    response = api_client.post(URL, body(team["project"], spec={"gpu_model": name, "gpu_count": 1}), format="json")
    assert response.status_code == 201, response.data
    assert response.data["spec"]["gpu_model"] == "H100-80GB"


def test_an_unknown_gpu_model_lists_the_valid_names(api_client, fleet, team):
    gpu_model("A100-40GB", memory_mib=40960)
    api_client.force_authenticate(team["owner"])
    response = api_client.post(
        URL, body(team["project"], spec={"gpu_model": "H100-80G", "gpu_count": 1}), format="json"
    )
    assert response.status_code == 400
    message = response.data["error"]["fields"]["spec.gpu_model"][0]
    assert '"H100-80G"' in message and "A100-40GB, H100-80GB" in message
    assert "Object with" not in message


def test_the_timeline_filter_takes_a_gpu_model_in_any_case(api_client, fleet, team):
    api_client.force_authenticate(team["owner"])
    end = (timezone.now() + timedelta(days=1)).isoformat()
    response = api_client.get("/api/v1/availability/timeline/", {"start": "now", "end": end, "gpu_model": "h100-80gb"})
    assert response.status_code == 200, response.data


def test_an_ending_reservation_names_its_state_with_the_right_article(api_client, fleet, team):
    rid = _booked(api_client, team)
    Reservation.objects.filter(public_id=rid).update(state="ending", starts_at=timezone.now() - timedelta(minutes=5))
    response = api_client.post(f"{URL}{rid}/release/", {}, format="json")
    assert response.status_code == 409
    message = response.data["error"]["message"]
    assert message.startswith("An ending reservation cannot be ended: it is in state ending")
