"""The OpenAPI schema generates, validates, and has no warnings: the whole API, and the accounts and core
endpoints alone."""

from __future__ import annotations

import pytest
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

OWN_PATHS = [
    "/api/v1/projects/",
    "/api/v1/projects/{project_pk}/members/{username}/",
    "/api/v1/tokens/",
    "/api/v1/tokens/{id}/revoke/",
    "/api/v1/me/",
    "/api/v1/auth/login/",
    "/api/v1/auth/logout/",
    "/api/v1/auth/csrf/",
    "/api/v1/auth/session/",
]


def generate(patterns: list | None = None) -> dict:
    GENERATOR_STATS.reset()
    with GENERATOR_STATS.silence():
        return SchemaGenerator(patterns=patterns).get_schema(request=None, public=True)


@pytest.fixture
def schema() -> dict:
    """The schema of the accounts endpoints alone, so another app's schema problem does not mask ours."""
    return generate([path("api/v1/", include("controlplane.accounts.api.urls"))])


def test_schema_is_valid_openapi(schema):
    validate_schema(schema)
    assert set(OWN_PATHS) <= set(schema["paths"])


def test_the_whole_api_schema_generates_with_our_paths():
    assert set(OWN_PATHS) <= set(generate()["paths"])


def test_the_whole_api_schema_is_valid_openapi_without_warnings():
    """What `manage.py spectacular --validate` checks, for every app: a client generator must be able to read it."""
    whole = generate()
    validate_schema(whole)
    assert whole["openapi"].startswith("3.1")
    assert [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache] == []


def test_accounts_and_core_endpoints_generate_without_warnings(schema):
    assert schema["paths"]
    assert [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache] == []


def test_bearer_tokens_are_a_documented_security_scheme(schema):
    assert schema["components"]["securitySchemes"]["bearerToken"]["scheme"] == "bearer"


def test_token_create_documents_the_one_time_plaintext(schema):
    response = schema["paths"]["/api/v1/tokens/"]["post"]["responses"]["201"]
    ref = response["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert "token" in schema["components"]["schemas"][ref]["properties"]


def test_schema_endpoint_and_swagger_ui_render(db):
    client = APIClient()
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert "/api/v1/projects/" in schema.json()["paths"]
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content
