"""``Idempotency-Key`` for every POST under /api/v1/ (the agent's endpoints have their own sequence numbers).

A client that is not sure its POST arrived (a timeout, a dropped connection) sends it again with the same key
and gets the first response back, with ``Idempotent-Replayed: true``, instead of booking twice.

- The first request with a key inserts an ``in_progress`` record in its own committed transaction; the unique
  (scope, key) constraint makes concurrent duplicates race safely: exactly one insert wins.
- The winner runs the view and stores the response when it is a 2xx or a 4xx that describes the request.
  A 5xx (and 401, 403, 429, which describe the caller's credentials or rate, not the request) deletes the
  record so that a retry runs again.
- A duplicate that loses the insert polls until the winner completes, then replays; past
  ``IDEMPOTENCY_WAIT_S`` it gets a 409 and may retry later.
- The same key with a different method, path or body is a 422 ``idempotency_key_reused``.
- Records expire after ``IDEMPOTENCY_TTL_S`` (24 h); ``controlplane.core.tasks.prune_idempotency_records``
  deletes them. An ``in_progress`` record older than ``IDEMPOTENCY_STALE_AFTER_S`` belongs to a process that
  died mid-request and is taken over.
- A request with no identity (no Authorization header, no session) has no scope to keep keys apart in, so the
  header is ignored for it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone

from controlplane.core import rows
from controlplane.core.api.errors import error_body
from controlplane.core.choices import IdempotencyState
from controlplane.core.models import IdempotencyRecord

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
API_PREFIX = "/api/v1/"
EXEMPT_PREFIXES = ("/api/v1/agent/",)
# Responses that say nothing final about the request itself: a retry must run it again.
NOT_STORED = frozenset({401, 403, 408, 429})


def ttl() -> timedelta:
    return timedelta(seconds=getattr(settings, "IDEMPOTENCY_TTL_S", 24 * 3600))


def _wait_s() -> float:
    return float(getattr(settings, "IDEMPOTENCY_WAIT_S", 10.0))


def _poll_s() -> float:
    return float(getattr(settings, "IDEMPOTENCY_POLL_S", 0.05))


def _stale_after() -> timedelta:
    return timedelta(seconds=getattr(settings, "IDEMPOTENCY_STALE_AFTER_S", 600))


def caller_scope(request: HttpRequest) -> str | None:
    """A hash of who is calling: the Authorization header, else the session's user. None for nobody."""
    authorization = request.headers.get("Authorization")
    if authorization:
        identity = f"authorization:{authorization}"
    else:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        identity = f"session-user:{user.pk}"
    return hashlib.sha256(identity.encode()).hexdigest()


def request_fingerprint(request: HttpRequest) -> str:
    h = hashlib.sha256()
    h.update(request.method.encode() if request.method else b"")
    h.update(b"\n")
    h.update(request.get_full_path().encode())
    h.update(b"\n")
    h.update(request.body)
    return h.hexdigest()


def _error(status: int, code: str, message: str, fields: dict[str, list[str]] | None = None) -> JsonResponse:
    return JsonResponse(error_body(code, message, fields), status=status)


class IdempotencyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path_info
        if request.method != "POST" or not path.startswith(API_PREFIX) or path.startswith(EXEMPT_PREFIXES):
            return self.get_response(request)
        key = request.headers.get(HEADER)
        if key is None:
            return self.get_response(request)
        if not key.strip() or len(key) > MAX_KEY_LENGTH:
            message = f"The {HEADER} header must be 1 to {MAX_KEY_LENGTH} characters, not all blank."
            return _error(400, "invalid_idempotency_key", message, {HEADER: [message]})
        scope = caller_scope(request)
        if scope is None:
            return self.get_response(request)
        return self._handle(request, scope=scope, key=key, fingerprint=request_fingerprint(request))

    def _handle(self, request: HttpRequest, *, scope: str, key: str, fingerprint: str) -> HttpResponse:
        deadline = time.monotonic() + _wait_s()
        while True:
            record, created = _claim(scope=scope, key=key, fingerprint=fingerprint)
            if created:
                assert record is not None
                return self._run(request, record)
            if record is not None:
                if record.request_fingerprint != fingerprint:
                    return _error(
                        422,
                        "idempotency_key_reused",
                        f"This {HEADER} was already used for a different request (another method, "
                        "path or body). Use a new key for a new request.",
                        {HEADER: ["Already used for a different request."]},
                    )
                if record.state == IdempotencyState.COMPLETED:
                    return _replay(record)
            # record is None: the first request failed and freed the key between our insert and our read.
            if time.monotonic() >= deadline:
                return _error(
                    409,
                    "idempotency_request_in_progress",
                    f"A request with this {HEADER} is still in progress; retry it later.",
                )
            time.sleep(_poll_s())

    def _run(self, request: HttpRequest, record: IdempotencyRecord) -> HttpResponse:
        try:
            response = self.get_response(request)
        except BaseException:
            IdempotencyRecord.objects.filter(pk=record.pk).delete()
            raise
        status = response.status_code
        storable = (200 <= status < 300 or 400 <= status < 500) and status not in NOT_STORED
        if not storable or response.streaming:
            IdempotencyRecord.objects.filter(pk=record.pk).delete()
            return response
        _complete(record, status=status, body=bytes(response.content), content_type=response.get("Content-Type", ""))
        return response


_COMPLETE_SQL = (
    f"UPDATE {IdempotencyRecord._meta.db_table} SET state = %s, response_status = %s, response_body = %s, "  # noqa: S608 - name from metadata
    "response_content_type = %s, completed_at = %s WHERE id = %s AND state = %s"
)


def _complete(record: IdempotencyRecord, *, status: int, body: bytes, content_type: str) -> None:
    """Store the response, if the record is still ours (in progress): a hand-written UPDATE, as it runs on
    every keyed POST."""
    body_field = IdempotencyRecord._meta.get_field("response_body")
    params = [
        IdempotencyState.COMPLETED.value,
        status,
        body_field.get_db_prep_save(body, connection),  # type: ignore[union-attr]
        content_type,
        connection.ops.adapt_datetimefield_value(timezone.now()),
        record.pk,
        IdempotencyState.IN_PROGRESS.value,
    ]
    with connection.cursor() as cursor:
        cursor.execute(_COMPLETE_SQL, params)


def _new(*, scope: str, key: str, fingerprint: str) -> IdempotencyRecord:
    record = IdempotencyRecord(scope=scope, key=key, request_fingerprint=fingerprint)
    rows.insert([record])
    return record


def _claim(*, scope: str, key: str, fingerprint: str) -> tuple[IdempotencyRecord | None, bool]:
    """Insert the record (True) or return the one already there (False; None when it vanished meanwhile).

    The insert comes first: a new key, by far the common case, costs one round trip instead of a read, a
    BEGIN, the insert and a COMMIT. Outside a transaction the failed insert needs no savepoint."""
    try:
        if connection.in_atomic_block:
            with transaction.atomic():
                return _new(scope=scope, key=key, fingerprint=fingerprint), True
        return _new(scope=scope, key=key, fingerprint=fingerprint), True
    except IntegrityError:
        pass
    existing = IdempotencyRecord.objects.filter(scope=scope, key=key).first()
    if existing is not None and _abandoned(existing):
        # Conditional on created_at: of two takers-over, one deletes and both race on the insert.
        IdempotencyRecord.objects.filter(pk=existing.pk, created_at=existing.created_at).delete()
        try:
            with transaction.atomic():
                record = IdempotencyRecord.objects.create(scope=scope, key=key, request_fingerprint=fingerprint)
        except IntegrityError:
            return IdempotencyRecord.objects.filter(scope=scope, key=key).first(), False
        return record, True
    return existing, False


def _abandoned(record: IdempotencyRecord) -> bool:
    age = timezone.now() - record.created_at
    if age > ttl():
        return True
    return record.state == IdempotencyState.IN_PROGRESS and age > _stale_after()


def _replay(record: IdempotencyRecord) -> HttpResponse:
    response = HttpResponse(
        bytes(record.response_body or b""),
        status=record.response_status or 200,
        content_type=record.response_content_type or None,
    )
    response[REPLAYED_HEADER] = "true"
    return response
