"""Every refusal has the one error shape: {"error": {"code", "message", "fields", ...}}."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient
from rest_framework.throttling import AnonRateThrottle

from controlplane.core.api.errors import flatten_errors
from tests.factories import UserFactory

pytestmark = pytest.mark.urls("tests.core.urls")


@pytest.fixture
def client(db) -> APIClient:
    client = APIClient()
    client.force_authenticate(UserFactory())
    return client


def assert_shape(body: dict) -> dict:
    assert set(body) == {"error"}
    error = body["error"]
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["fields"], dict)
    return error


def test_nested_validation_errors_name_dotted_fields(client):
    response = client.post(
        "/api/v1/test/echo/",
        {
            "spec": {"gpu_count": 0, "env": [{"name": "OK", "value": "1"}, {"name": "bad name", "value": "2"}]},
        },
        format="json",
    )
    assert response.status_code == 400
    error = assert_shape(response.json())
    assert error["code"] == "validation_error"
    assert set(error["fields"]) == {"spec.gpu_count", "spec.env.1.name", "image"}
    assert "greater than or equal to 1" in error["fields"]["spec.gpu_count"][0]
    assert error["message"].startswith("spec.gpu_count: ")


def test_flatten_keeps_non_field_errors_at_their_level():
    assert flatten_errors({"non_field_errors": ["Window is empty."], "spec": {"non_field_errors": ["Bad."]}}) == {
        "non_field_errors": ["Window is empty."],
        "spec": ["Bad."],
    }


def test_domain_error_maps_to_its_status_code_and_extra(client):
    response = client.post("/api/v1/test/echo/", {"outcome": "conflict"}, format="json")
    assert response.status_code == 409
    error = assert_shape(response.json())
    assert error == {
        "code": "gpu_taken",
        "message": "GPU 3 is already booked in that window.",
        "fields": {"spec.gpu_count": ["Not enough free GPUs."]},
        "free_gpus": 2,
    }


def test_not_found_has_the_shape(client):
    response = client.get("/api/v1/projects/999999/")
    assert response.status_code == 404
    assert assert_shape(response.json())["code"] == "not_found"


def test_unauthenticated_is_401_with_the_shape_and_a_challenge(db):
    response = APIClient().get("/api/v1/me/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert assert_shape(response.json())["code"] == "not_authenticated"


def test_malformed_bearer_token_is_401(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer not-a-token")
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    assert assert_shape(response.json())["code"] == "authentication_failed"


def test_wrong_method_is_405_with_the_shape(client):
    response = client.delete("/api/v1/me/")
    assert response.status_code == 405
    assert assert_shape(response.json())["code"] == "method_not_allowed"


def test_throttled_request_is_429_with_the_shape_and_retry_after(db, monkeypatch):
    from django.core.cache import cache

    cache.clear()
    monkeypatch.setattr(AnonRateThrottle, "THROTTLE_RATES", {"anon": "2/min", "user": "1000/min"})
    client = APIClient()
    statuses = [client.get("/api/v1/auth/csrf/").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    response = client.get("/api/v1/auth/csrf/")
    error = assert_shape(response.json())
    assert error["code"] == "throttled"
    assert error["retry_after_s"] > 0
    assert int(response["Retry-After"]) > 0
    cache.clear()
