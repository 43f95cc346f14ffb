"""A booking's window given by its length: ``{"start": "now", "duration": "10m"}``, re-runnable as written."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.reservations.api.fields import parse_duration
from controlplane.reservations.models import Reservation
from tests.factories import ApiTokenFactory
from tests.reservations.fleet import gpu_model, project, server
from tests.reservations.test_api import URL, body

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    model = gpu_model()
    server(model, gpus=8)
    return model


@pytest.fixture
def owner_token(fleet):  # type: ignore[no-untyped-def]
    token = ApiTokenFactory(name="automation")
    return token, project(owner=token.user, grant="1000")


def bearer(token) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.plaintext}")
    return client


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10m", timedelta(minutes=10)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("90s", timedelta(seconds=90)),
        ("PT10M", timedelta(minutes=10)),
        ("P1DT12H", timedelta(days=1, hours=12)),
        ("P2W", timedelta(weeks=2)),
        ("PT1H5S", timedelta(hours=1, seconds=5)),
    ],
)
def test_duration_texts(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "10", "10M", "m10", "1m1h", "PT", "P1DT", "P1Y", "P1M", "pt10m", " 10m", "10m\n", "0m", "PT0S", "0h10m"],
)
def test_texts_that_are_not_durations(text):
    assert parse_duration(text) is None


@pytest.mark.parametrize(
    ("duration", "seconds"), [("10m", 600), ("PT10M", 600), (600, 600), ("2h", 7200), ("1d", 86400)]
)
def test_a_window_given_by_its_duration_books(api_client, owner_token, duration, seconds):
    token, proj = owner_token
    data = body(proj)
    data["window"] = {"start": "now", "duration": duration}
    before = timezone.now()
    response = bearer(token).post(URL, data, format="json")
    assert response.status_code == 201, response.json()
    booked = Reservation.objects.get()
    assert before <= booked.starts_at <= timezone.now()
    assert booked.ends_at - booked.starts_at == timedelta(seconds=seconds)


def test_a_duration_from_a_given_start(owner_token):
    token, proj = owner_token
    start = (timezone.now() + timedelta(hours=3)).replace(microsecond=0)
    data = body(proj)
    data["window"] = {"start": start.isoformat(), "duration": "1h30m"}
    assert bearer(token).post(URL, data, format="json").status_code == 201
    booked = Reservation.objects.get()
    assert (booked.starts_at, booked.ends_at) == (start, start + timedelta(hours=1, minutes=30))


@pytest.mark.parametrize(
    ("window", "field", "words"),
    [
        ({"start": "now", "end": "2099-01-01T00:00:00Z", "duration": "10m"}, "window.duration", "not both"),
        ({"start": "now"}, "window.end", "window.end or window.duration"),
        ({"start": "now", "duration": "10 minutes"}, "window.duration", "Not a duration"),
        ({"start": "now", "duration": "0m"}, "window.duration", "longer than zero"),
        ({"start": "now", "duration": "PT0S"}, "window.duration", "longer than zero"),
        ({"start": "now", "duration": 0}, "window.duration", "longer than zero"),
        ({"start": "now", "duration": -60}, "window.duration", "longer than zero"),
        ({"start": "now", "duration": True}, "window.duration", "Not a duration"),
        ({"start": "now", "duration": "P1M"}, "window.duration", "Not a duration"),
        ({"start": "now", "duration": 10**12}, "window.duration", "less than or equal"),
        ({"start": "9999-12-30T23:00:00Z", "duration": "2d"}, "window.duration", "year 9999"),
        ({"start": "9999-12-31T23:00:00Z", "duration": "2h"}, "window.start", "out of range"),
    ],
)
def test_bad_windows_are_400_naming_the_field(owner_token, window, field, words):
    token, proj = owner_token
    data = body(proj)
    data["window"] = window
    response = bearer(token).post(URL, data, format="json")
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert words in error["fields"][field][0], error
    assert not Reservation.objects.exists()


def test_start_end_and_duration_name_both_conflicting_fields(owner_token):
    token, proj = owner_token
    data = body(proj)
    data["window"]["duration"] = "10m"
    fields = bearer(token).post(URL, data, format="json").json()["error"]["fields"]
    assert set(fields) == {"window.end", "window.duration"}


def test_a_retry_of_start_now_with_a_duration_replays_the_first_booking(owner_token):
    """The README's command, sent again a while later: the same request, so nothing new is booked."""
    token, proj = owner_token
    data = body(proj)
    data["window"] = {"start": "now", "duration": "10m"}
    client = bearer(token)
    first = client.post(URL, data, format="json", HTTP_IDEMPOTENCY_KEY="first-booking")
    assert first.status_code == 201, first.json()
    again = client.post(URL, data, format="json", HTTP_IDEMPOTENCY_KEY="first-booking")
    assert again.status_code == 201, again.json()
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert Reservation.objects.count() == 1


def test_the_schema_states_the_duration(client):
    import yaml

    schema = yaml.safe_load(client.get("/api/v1/schema/").content)
    window = schema["components"]["schemas"]["WindowRequest"]
    assert window["required"] == ["start"]
    assert window["oneOf"] == [{"required": ["end"]}, {"required": ["duration"]}]
    forms = window["properties"]["duration"]["oneOf"]
    assert {f["type"] for f in forms} == {"string", "integer"}
    import re

    pattern = next(f["pattern"] for f in forms if f["type"] == "string")
    for text in ("10m", "PT10M", "1h30m", "P2W"):
        assert re.search(pattern, text)
    for text in ("0m", "10", "P1M", "PT", "0h10m"):
        assert not re.search(pattern, text)
