"""Idempotency-Key: a POST sent again with the same key is answered from the first, never run twice."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.accounts.models import ApiToken
from controlplane.core.choices import IdempotencyState
from controlplane.core.idempotency import REPLAYED_HEADER, IdempotencyMiddleware, caller_scope
from controlplane.core.models import IdempotencyRecord
from controlplane.core.tasks import prune_idempotency_records
from tests.core import urls as test_urls
from tests.factories import ApiTokenFactory, UserFactory
from tests.runtime.support import wait_for


def bearer_client(token: ApiToken) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.plaintext}")  # type: ignore[attr-defined]
    return client


@pytest.fixture
def token(db) -> ApiToken:
    return ApiTokenFactory(name="automation")


def created_tokens(token: ApiToken) -> int:
    return ApiToken.objects.filter(user=token.user).exclude(pk=token.pk).count()


def post_token(client: APIClient, key: str, name: str = "ci"):  # type: ignore[no-untyped-def]
    return client.post("/api/v1/tokens/", {"name": name}, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_replay_returns_the_first_response_and_creates_nothing_new(token):
    client = bearer_client(token)
    first = post_token(client, "k-1")
    second = post_token(client, "k-1")
    assert first.status_code == second.status_code == 201
    assert "Idempotent-Replayed" not in first
    assert second["Idempotent-Replayed"] == "true"
    assert second.json() == first.json()
    assert created_tokens(token) == 1


def test_a_new_key_runs_the_request_again(token):
    client = bearer_client(token)
    post_token(client, "k-1")
    post_token(client, "k-2")
    assert created_tokens(token) == 2


def test_same_key_with_another_body_is_422(token):
    client = bearer_client(token)
    post_token(client, "k-1", name="ci")
    response = post_token(client, "k-1", name="other")
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert "Idempotency-Key" in response.json()["error"]["fields"]
    assert created_tokens(token) == 1


@pytest.mark.parametrize(
    "again",
    [
        b'{"name": "ci"}',
        b'{\n  "name" :\t"ci"\n}\n',
        b'{"name":"\\u0063i"}',
    ],
    ids=["spaces", "newlines-and-tabs", "escapes"],
)
def test_a_json_body_is_compared_as_parsed_not_as_bytes(token, again):
    """Whitespace, escapes or key order do not make another request: the retry replays."""
    client = bearer_client(token)
    first = client.post("/api/v1/tokens/", b'{"name":"ci"}', content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
    second = client.post("/api/v1/tokens/", again, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
    assert first.status_code == second.status_code == 201
    assert second["Idempotent-Replayed"] == "true"
    assert second.json() == first.json()
    assert created_tokens(token) == 1


def test_non_ascii_json_is_compared_as_parsed_too(token):
    client = bearer_client(token)
    raw = rb'{"name": "caf\u00e9 \ud83d\ude80"}'  # JSON's escapes, a surrogate pair among them
    same = '{"name":"café 🚀"}'.encode()
    assert (
        client.post("/api/v1/tokens/", raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k").status_code
        == 201
    )
    again = client.post("/api/v1/tokens/", same, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
    assert again["Idempotent-Replayed"] == "true"
    assert created_tokens(token) == 1


def test_key_order_does_not_make_another_request(token):
    client = bearer_client(token)
    first = client.post(
        "/api/v1/tokens/", b'{"name":"ci","expires_at":null}', content_type="application/json", HTTP_IDEMPOTENCY_KEY="k"
    )
    second = client.post(
        "/api/v1/tokens/",
        b'{"expires_at": null, "name": "ci"}',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k",
    )
    assert first.status_code == 201 and second["Idempotent-Replayed"] == "true"
    assert created_tokens(token) == 1


def test_a_json_equal_body_with_another_value_is_still_422(token):
    client = bearer_client(token)
    client.post("/api/v1/tokens/", b'{"name": "ci"}', content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
    response = client.post(
        "/api/v1/tokens/", b'{"name": "ci2"}', content_type="application/json", HTTP_IDEMPOTENCY_KEY="k"
    )
    assert response.status_code == 422
    assert created_tokens(token) == 1


def test_a_form_body_is_still_compared_as_sent(token):
    client = bearer_client(token)
    form = "application/x-www-form-urlencoded"
    assert client.post("/api/v1/tokens/", "name=ci", content_type=form, HTTP_IDEMPOTENCY_KEY="k").status_code == 201
    assert client.post("/api/v1/tokens/", "name=ci&", content_type=form, HTTP_IDEMPOTENCY_KEY="k").status_code == 422


def test_same_key_on_another_path_is_422(token):
    client = bearer_client(token)
    post_token(client, "k-1")
    response = client.post(f"/api/v1/tokens/{token.pk}/revoke/", HTTP_IDEMPOTENCY_KEY="k-1")
    assert response.status_code == 422
    token.refresh_from_db()
    assert token.revoked_at is None


@pytest.mark.parametrize("key", ["", "   ", "x" * 256])
def test_invalid_key_is_400_naming_the_header(token, key):
    response = post_token(bearer_client(token), key)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_idempotency_key"
    assert list(error["fields"]) == ["Idempotency-Key"]
    assert created_tokens(token) == 0


def test_a_255_character_key_is_accepted(token):
    assert post_token(bearer_client(token), "x" * 255).status_code == 201


def test_two_callers_never_share_a_key(token):
    other = ApiTokenFactory()
    post_token(bearer_client(token), "shared")
    response = post_token(bearer_client(other), "shared", name="theirs")
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    assert ApiToken.objects.filter(user=other.user, name="theirs").count() == 1


def test_session_callers_are_scoped_by_user(db):
    alice, bob = UserFactory(), UserFactory()
    a, b = APIClient(), APIClient()
    a.force_login(alice)
    b.force_login(bob)
    assert post_token(a, "same").status_code == 201
    response = post_token(b, "same")
    assert "Idempotent-Replayed" not in response
    assert post_token(a, "same")["Idempotent-Replayed"] == "true"
    assert ApiToken.objects.filter(user=alice).count() == 1
    assert ApiToken.objects.filter(user=bob).count() == 1


def test_a_4xx_outcome_is_stored_and_replayed(token):
    client = bearer_client(token)
    first = client.post("/api/v1/tokens/", {"name": ""}, format="json", HTTP_IDEMPOTENCY_KEY="bad")
    second = client.post("/api/v1/tokens/", {"name": ""}, format="json", HTTP_IDEMPOTENCY_KEY="bad")
    assert first.status_code == second.status_code == 400
    assert second["Idempotent-Replayed"] == "true"
    assert second.json() == first.json()


def test_an_authentication_failure_is_not_stored(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer gcp_000000000000_wrong")
    assert post_token(client, "k").status_code == 401
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.urls("tests.core.urls")
def test_a_5xx_frees_the_key_so_a_retry_runs(token):
    client = bearer_client(token)
    test_urls.calls.clear()
    body = {"outcome": "crash"}
    assert client.post("/api/v1/test/echo/", body, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 500
    assert not IdempotencyRecord.objects.exists()
    assert client.post("/api/v1/test/echo/", body, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 500
    assert test_urls.calls == ["crash", "crash"]


@pytest.mark.urls("tests.core.urls")
def test_agent_endpoints_are_exempt(token):
    client = bearer_client(token)
    test_urls.calls.clear()
    client.post("/api/v1/agent/ping/", HTTP_IDEMPOTENCY_KEY="k")
    client.post("/api/v1/agent/ping/", HTTP_IDEMPOTENCY_KEY="k")
    assert test_urls.calls == ["agent", "agent"]
    assert not IdempotencyRecord.objects.exists()


def test_a_request_without_the_header_is_not_recorded(token):
    client = bearer_client(token)
    client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert created_tokens(token) == 2
    assert not IdempotencyRecord.objects.exists()


def test_an_in_progress_record_left_committed_is_taken_over(token):
    """The middleware never commits a record in progress (the claim and the response share one transaction);
    one written so before that, by a process that died mid-request, holds nothing up."""
    client = bearer_client(token)
    post_token(client, "k")
    IdempotencyRecord.objects.update(state=IdempotencyState.IN_PROGRESS, response_status=None, response_body=None)
    ApiToken.objects.filter(user=token.user).exclude(pk=token.pk).delete()
    response = post_token(client, "k")
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    assert created_tokens(token) == 1
    assert IdempotencyRecord.objects.get().state == IdempotencyState.COMPLETED


def keyed_request(rf: RequestFactory, token: ApiToken, key: str, body: bytes = b'{"name": "ci"}') -> HttpRequest:
    return rf.post(  # type: ignore[no-any-return]
        "/api/v1/tokens/",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token.plaintext}",  # type: ignore[attr-defined]
        HTTP_IDEMPOTENCY_KEY=key,
    )


def writing_view(token: ApiToken, *, status: int, calls: list[str], hold: threading.Event | None = None):  # type: ignore[no-untyped-def]
    """A view that makes one token (its effect), then answers ``status``; with ``hold``, only once it is set."""

    def view(request: HttpRequest) -> HttpResponse:
        calls.append("run")
        ApiToken.objects.create(user=token.user, name=f"made-{len(calls)}", lookup=secrets.token_hex(6), digest="d")
        if hold is not None:
            assert hold.wait(timeout=30)
        return JsonResponse({"n": len(calls)}, status=status)

    return view


def made_tokens(token: ApiToken) -> int:
    return ApiToken.objects.filter(user=token.user, name__startswith="made-").count()


def test_a_5xx_rolls_back_what_the_view_wrote(token, rf):
    calls: list[str] = []
    middleware = IdempotencyMiddleware(writing_view(token, status=500, calls=calls))
    assert middleware(keyed_request(rf, token, "k")).status_code == 500
    assert made_tokens(token) == 0
    assert not IdempotencyRecord.objects.exists()
    assert middleware(keyed_request(rf, token, "k")).status_code == 500
    assert calls == ["run", "run"]


def test_a_stored_response_and_its_effect_are_kept_together(token, rf):
    calls: list[str] = []
    middleware = IdempotencyMiddleware(writing_view(token, status=201, calls=calls))
    first = middleware(keyed_request(rf, token, "k"))
    again = middleware(keyed_request(rf, token, "k"))
    assert (first.status_code, again.status_code) == (201, 201)
    assert again[REPLAYED_HEADER] == "true" and again.content == first.content
    assert calls == ["run"] and made_tokens(token) == 1
    record = IdempotencyRecord.objects.get()
    assert (record.state, record.response_status) == (IdempotencyState.COMPLETED, 201)


class HeldKey:
    """A keyed request running in a thread of its own, its view stopped after its write until ``release()``:
    the key is really in progress, its transaction open."""

    def __init__(self, rf: RequestFactory, token: ApiToken, key: str, *, status: int, calls: list[str]) -> None:
        self._hold = threading.Event()
        self.response: HttpResponse | None = None
        middleware = IdempotencyMiddleware(writing_view(token, status=status, calls=calls, hold=self._hold))
        request = keyed_request(rf, token, key)

        def run() -> None:
            try:
                self.response = middleware(request)
            finally:
                connection.close()

        self._thread = threading.Thread(target=run)
        self._thread.start()
        wait_for(lambda: calls, what="the first request to run its view")

    def release(self) -> None:
        self._hold.set()
        self._thread.join(timeout=30)


@pytest.fixture
def held(rf, token) -> Iterator[Callable[..., HeldKey]]:  # type: ignore[no-untyped-def]
    started: list[HeldKey] = []

    def hold(key: str, *, status: int = 201, calls: list[str]) -> HeldKey:
        started.append(HeldKey(rf, token, key, status=status, calls=calls))
        return started[-1]

    yield hold
    for h in started:
        h.release()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_duplicate_of_a_request_still_running_waits_on_its_lock_then_gets_409(token, rf, held, settings):
    settings.IDEMPOTENCY_WAIT_S = 0.5
    calls: list[str] = []
    held("k", calls=calls)
    duplicate = IdempotencyMiddleware(writing_view(token, status=201, calls=calls))
    t0 = time.monotonic()
    with CaptureQueriesContext(connection) as queries:
        response = duplicate(keyed_request(rf, token, "k"))
    elapsed = time.monotonic() - t0
    error = json.loads(response.content)["error"]
    assert response.status_code == 409
    assert error["code"] == "idempotency_request_in_progress"
    assert "still in progress" in error["message"]
    assert calls == ["run"]
    assert 0.4 < elapsed < 5
    # It blocked on the lock: a handful of statements, not an INSERT every few milliseconds.
    assert len(queries) <= 8, [q["sql"] for q in queries]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_duplicate_replays_the_first_response_as_soon_as_it_is_committed(token, rf, held):
    calls: list[str] = []
    first = held("k", calls=calls)
    threading.Timer(0.3, first.release).start()
    response = IdempotencyMiddleware(writing_view(token, status=201, calls=calls))(keyed_request(rf, token, "k"))
    assert response.status_code == 201
    assert response[REPLAYED_HEADER] == "true"
    assert first.response is not None and response.content == first.response.content
    assert calls == ["run"] and made_tokens(token) == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_duplicate_runs_the_request_itself_when_the_first_one_failed(token, rf, held):
    calls: list[str] = []
    first = held("k", status=503, calls=calls)
    threading.Timer(0.3, first.release).start()
    response = IdempotencyMiddleware(writing_view(token, status=201, calls=calls))(keyed_request(rf, token, "k"))
    assert first.response is not None and first.response.status_code == 503
    assert response.status_code == 201
    assert REPLAYED_HEADER not in response
    assert calls == ["run", "run"]
    assert made_tokens(token) == 1  # the failed first request's write went with its rollback


def test_an_expired_key_runs_again(token):
    client = bearer_client(token)
    post_token(client, "k")
    IdempotencyRecord.objects.update(created_at=timezone.now() - timedelta(hours=25))
    response = post_token(client, "k", name="new body is fine after expiry")
    assert response.status_code == 201
    assert created_tokens(token) == 2


def test_prune_deletes_only_expired_records(token):
    client = bearer_client(token)
    post_token(client, "old")
    post_token(client, "fresh")
    IdempotencyRecord.objects.filter(key="old").update(created_at=timezone.now() - timedelta(hours=25))
    assert prune_idempotency_records() == 1
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["fresh"]


def test_scope_is_a_hash_not_the_credential(token):
    record_client = bearer_client(token)
    post_token(record_client, "k")
    scope = IdempotencyRecord.objects.get().scope
    assert token.plaintext not in scope and len(scope) == 64  # type: ignore[attr-defined]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_replays_create_exactly_one_token():
    token = ApiTokenFactory(name="automation")
    n = 8
    barrier = threading.Barrier(n)
    results: list[tuple[int, bool, dict]] = []
    errors: list[BaseException] = []

    def send() -> None:
        try:
            client = bearer_client(token)
            barrier.wait(timeout=10)
            response = post_token(client, "race")
            results.append((response.status_code, response.has_header("Idempotent-Replayed"), response.json()))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert [status for status, _, _ in results] == [201] * n
    assert sum(1 for _, replayed, _ in results if not replayed) == 1
    assert len({body["id"] for _, _, body in results}) == 1
    assert created_tokens(token) == 1
    assert IdempotencyRecord.objects.get().state == IdempotencyState.COMPLETED


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_replays_with_different_bodies_run_one_and_refuse_the_rest():
    token = ApiTokenFactory(name="automation")
    n = 6
    barrier = threading.Barrier(n)
    statuses: list[int] = []

    def send(i: int) -> None:
        try:
            client = bearer_client(token)
            barrier.wait(timeout=10)
            statuses.append(post_token(client, "race", name=f"t{i}").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(statuses) == [201] + [422] * (n - 1)
    assert created_tokens(token) == 1


def test_caller_scope_ignores_anonymous_requests(rf):
    from django.contrib.auth.models import AnonymousUser

    request = rf.post("/api/v1/auth/login/")
    request.user = AnonymousUser()
    assert caller_scope(request) is None
