"""Bearer token authentication: one read per request, and every refusal still refused."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.accounts.authentication import token_for
from controlplane.accounts.models import ApiToken
from controlplane.core import tokens
from tests.factories import ApiTokenFactory, UserFactory

pytestmark = pytest.mark.django_db


def _client(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def test_token_and_user_come_whole_from_one_read():
    user = UserFactory(username="ada", email="ada@example.org", is_staff=True)
    token = ApiTokenFactory(user=user, expires_at=timezone.now() + timedelta(days=1))
    with CaptureQueriesContext(connection) as queries:
        found = token_for(token.lookup)
        assert found is not None
        loaded = found.user
        stored = get_user_model().objects.get(pk=user.pk)
        fields = [f.attname for f in get_user_model()._meta.concrete_fields]
        assert {f: getattr(loaded, f) for f in fields} == {f: getattr(stored, f) for f in fields}
    assert len(queries.captured_queries) == 2  # the token's read and the reference read above, nothing deferred
    assert (found.pk, found.digest, found.expires_at, found.revoked_at) == (
        token.pk,
        token.digest,
        token.expires_at,
        None,
    )
    assert token_for("000000000000") is None


def test_a_request_with_a_token_reads_it_once_and_notes_its_use_once_a_minute():
    token = ApiTokenFactory(user=UserFactory(username="bo"))
    client = _client(token.plaintext)
    assert client.get("/api/v1/me/").json()["username"] == "bo"
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/api/v1/me/").status_code == 200
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    assert not any(q["sql"].upper().startswith("UPDATE") for q in queries.captured_queries)
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now() - timedelta(minutes=2))
    assert client.get("/api/v1/me/").status_code == 200
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"expires_at": timezone.now() - timedelta(seconds=1)}, "The API token has expired or was revoked."),
        ({"revoked_at": timezone.now()}, "The API token has expired or was revoked."),
        ({"digest": tokens.digest("gcp_000000000000_other")}, "The API token is not valid."),
    ],
)
def test_expired_revoked_or_wrong_tokens_are_refused(change, message):
    token = ApiTokenFactory(user=UserFactory())
    ApiToken.objects.filter(pk=token.pk).update(**change)
    response = _client(token.plaintext).get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["error"]["message"] == message


def test_a_disabled_users_token_is_refused():
    token = ApiTokenFactory(user=UserFactory(is_active=False))
    response = _client(token.plaintext).get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "The token's user is disabled."


@pytest.mark.parametrize("value", ["gcp_nosuchtoken_x", "gcn_000000000000_secret", "gcp_000000000000_secret"])
def test_unknown_or_foreign_tokens_are_refused(value):
    assert _client(value).get("/api/v1/me/").status_code == 401
