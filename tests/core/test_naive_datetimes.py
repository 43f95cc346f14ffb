"""A date-time without a time zone is refused everywhere the API reads one, not only in bookings: token
expiry, report ranges, telemetry, and the list filters. It was read as UTC, hours off outside UTC."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.accounts.models import ApiToken
from tests.factories import UserFactory
from tests.reservations.fleet import project

pytestmark = pytest.mark.django_db

NAIVE = "add Z or an offset, e.g. 2026-05-01T14:00:00Z"


@pytest.fixture
def owner():  # type: ignore[no-untyped-def]
    return UserFactory()


@pytest.fixture
def client(owner) -> APIClient:  # type: ignore[no-untyped-def]
    api = APIClient()
    api.force_authenticate(owner)
    return api


@pytest.fixture
def slug(owner) -> str:  # type: ignore[no-untyped-def]
    return project(owner=owner, grant="10").slug


def _in(hours: int, *, aware: bool) -> str:
    at = (timezone.now() + timedelta(hours=hours)).replace(minute=0, second=0, microsecond=0)
    return at.isoformat() if aware else at.replace(tzinfo=None).isoformat()


def _refused(response, field: str) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert NAIVE in error["fields"][field][0], error


def test_token_expiry_without_a_zone_is_refused(client, owner):
    _refused(
        client.post("/api/v1/tokens/", {"name": "ci", "expires_at": _in(48, aware=False)}, format="json"), "expires_at"
    )
    assert not ApiToken.objects.filter(user=owner).exists()
    ok = client.post("/api/v1/tokens/", {"name": "ci", "expires_at": _in(48, aware=True)}, format="json")
    assert ok.status_code == 201, ok.content


@pytest.mark.parametrize("path", ["/api/v1/usage/report", "/api/v1/usage/timeseries"])
@pytest.mark.parametrize("field", ["start", "end"])
def test_a_report_range_without_a_zone_is_refused(client, slug, path, field):
    query = {"project": slug, "start": "2026-05-01T00:00:00Z", "end": "2026-05-02T00:00:00Z"}
    query[field] = query[field].removesuffix("Z")
    _refused(client.get(path, query), field)


def test_a_report_range_of_dates_is_still_read_as_utc_days(client, slug):
    response = client.get("/api/v1/usage/report", {"project": slug, "start": "2026-05-01", "end": "2026-05-02"})
    assert response.status_code == 200, response.content
    assert response.json()["start"] == "2026-05-01T00:00:00Z"


def test_telemetry_since_without_a_zone_is_refused(client):
    since = (timezone.now() - timedelta(minutes=30)).replace(tzinfo=None).isoformat()
    _refused(client.get(f"/api/v1/reservations/{uuid.uuid4()}/telemetry/", {"since": since}), "since")


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/api/v1/ledger/entries/", "created_after"),
        ("/api/v1/ledger/entries/", "created_before"),
        ("/api/v1/reservations/", "ends_after"),
        ("/api/v1/reservations/", "starts_before"),
    ],
)
def test_list_filters_without_a_zone_are_refused(client, slug, path, param):
    _refused(client.get(path, {param: "2026-05-01T14:00:00"}), param)
    assert client.get(path, {param: "2026-05-01T14:00:00Z"}).status_code == 200
    assert client.get(path, {param: "2026-05-01T16:00:00+02:00"}).status_code == 200
