"""Every answer under /api/ is in the one error shape: unknown paths, browsers, bodies without a Content-Type."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def client() -> APIClient:
    client = APIClient()
    client.force_authenticate(UserFactory())
    return client


@pytest.mark.parametrize(
    "path",
    ["/api/", "/api/v1/", "/api/v1/nope/", "/api/v1/nope", "/api/v2/reservations/", "/api/v1/reservations/not-a-uuid/"],
)
@pytest.mark.parametrize("accept", ["application/json", "text/html,application/xhtml+xml", "*/*"])
def test_a_path_that_matches_nothing_is_a_json_404_naming_the_path(client, path, accept):
    response = client.get(path, HTTP_ACCEPT=accept)
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "not_found"
    assert path in error["message"]
    assert error["fields"] == {"path": [f"Not found: {path}"]}


def test_a_missing_object_reads_as_a_path_that_matches_nothing(client):
    missing = client.get("/api/v1/reservations/00000000-0000-0000-0000-000000000000/").json()
    unknown = client.get("/api/v1/reservations/not-a-uuid/").json()
    assert missing["error"]["message"].replace("00000000-0000-0000-0000-000000000000", "X") == unknown["error"][
        "message"
    ].replace("not-a-uuid", "X")


def test_a_browser_is_given_an_error_as_json_not_the_browsable_page():
    response = APIClient().get("/api/v1/reservations/", HTTP_ACCEPT="text/html")
    assert response.status_code == 401
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "not_authenticated"
    assert "WWW-Authenticate" in response


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_a_body_without_content_type_that_is_not_json_is_a_415_naming_the_header(client, method):
    response = client.generic(method, "/api/v1/reservations/", "project=x&name=y", content_type="")
    assert response.status_code == 415
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert "Content-Type" in error["message"] and "Content-Type" in error["fields"]


def test_an_empty_body_without_content_type_is_left_alone(client):
    # A command with no body (cancel, release) needs no header.
    response = client.generic(
        "POST", f"/api/v1/reservations/{'0' * 8}-0000-0000-0000-{'0' * 12}/cancel/", "", content_type=""
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_json_without_content_type_is_still_held_to_the_json_rules(client):
    response = client.generic("POST", "/api/v1/reservations/", '{"name": "a\\u0000b"}', content_type="")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"name": ["Null characters are not allowed."]}


def _a_path_that_resolves(template: str) -> str:
    """The schema's path with each parameter given a value its converter takes (a number, a UUID, a slug)."""
    import itertools
    import re

    from django.urls import Resolver404, resolve

    names = re.findall(r"\{(\w+)\}", template)
    for values in itertools.product(["1", "00000000-0000-0000-0000-000000000001", "x"], repeat=len(names)):
        path = template
        for name, value in zip(names, values, strict=True):
            path = path.replace("{" + name + "}", value)
        try:
            resolve(path)
        except Resolver404:
            continue
        return path
    raise AssertionError(f"no value resolves {template}")


def test_an_unknown_format_is_a_400_naming_it_on_every_endpoint():
    """One rule, the content negotiation's (controlplane/core/api/negotiation.py), before anything else the view
    does: no endpoint answers ?format=xml with its data (the logs answered 200), a 404 or a page in another
    format (the schema answered in YAML)."""
    from drf_spectacular.generators import SchemaGenerator

    from tests.factories import OperatorFactory

    schema = SchemaGenerator().get_schema(request=None, public=True)
    operator = APIClient()
    operator.force_authenticate(OperatorFactory())
    checked = []
    for template, operations in [*schema["paths"].items(), ("/api/v1/schema/", {"get": {}})]:
        path = _a_path_that_resolves(template)
        for method in operations:
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            response = operator.generic(method.upper(), f"{path}?format=xml", "{}", content_type="application/json")
            assert response.status_code == 400, (method, template, response.content[:300])
            assert response["Content-Type"].startswith("application/json"), (method, template)
            assert "format" in response.json()["error"]["fields"], (method, template)
            checked.append((method, template))
    assert ("get", "/api/v1/reservations/{id}/logs/") in checked and len(checked) > 100
