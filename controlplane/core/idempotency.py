"""``Idempotency-Key`` for every POST under /api/v1/ (the agent's endpoints have their own sequence numbers).

A client that is not sure its POST arrived (a timeout, a dropped connection, a 5xx) sends it again with the
same key and gets the first response back, with ``Idempotent-Replayed: true``, instead of booking twice.

A keyed request runs in one database transaction together with its record, so the record can never say
anything but the truth about the effect:

- The middleware opens the transaction and claims the key: it inserts an ``in_progress`` record while taking
  a transaction-level advisory lock on (scope, key) (PostgreSQL). The view runs inside that transaction (its
  services' atomic blocks become savepoints) and its response, when it is a 2xx or a 4xx that describes the
  request, is written into the record before the one COMMIT. The booking and its stored response are
  committed together, or neither is; no other transaction ever sees an ``in_progress`` record.
- Anything that fails before the COMMIT (a 5xx, the connection dropped at any step, PostgreSQL restarted,
  the process killed) rolls the record back with the effect, and the lock goes with the transaction or its
  connection: a retry with the key runs again at once, and the effect happens once. When the COMMIT went
  through but its answer was lost, the retry finds the stored response and replays it: the booking it
  made is returned, never made a second time.
- A 5xx is rolled back whole: a retry that runs the request again must not add to something already done.
  401, 403, 408 and 429 describe the caller's credentials or rate, not the request, and a streaming response
  has no body to keep: for those the view's effect is kept and the record is not, so a retry runs again.
- When the middleware's own statements or the COMMIT fail, the caller gets a 503 ``database_unavailable``,
  never the view's answer about an effect that may not have been kept; a retry with the key tells which.
- A duplicate that arrives while the first request runs finds the lock taken and blocks on it, with no
  polling, for at most ``IDEMPOTENCY_WAIT_S`` (10 s): then it replays the stored response, or runs the
  request itself if the first one failed; if the first is still running, it gets a 409
  ``idempotency_request_in_progress`` and may retry later.
- The same key with a different method, path or body is a 422 ``idempotency_key_reused``. A JSON body is
  compared as parsed (``canonical_body``): whitespace and key order do not make another request.
- Records expire after ``IDEMPOTENCY_TTL_S`` (24 h): an expired record is replaced by the next request with
  its key, and ``controlplane.core.tasks.prune_idempotency_records`` deletes the rest.
- A request with no identity (no Authorization header, no session) has no scope to keep keys apart in, so the
  header is ignored for it.

SQLite has no advisory locks, and needs none: its BEGIN IMMEDIATE makes a keyed request hold the database's
write lock from its claim to its COMMIT, so a duplicate queues on that lock (SQLite's own timeout, 20 s)
and then replays. Everything else above holds there too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import Error, connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from rest_framework.exceptions import APIException

from controlplane.core.api.errors import database_unavailable, error_body
from controlplane.core.api.parsers import parse_json, text_problem
from controlplane.core.choices import IdempotencyState
from controlplane.core.db import LOCK_NOT_AVAILABLE, sqlstate
from controlplane.core.models import IdempotencyRecord

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
API_PREFIX = "/api/v1/"
EXEMPT_PREFIXES = ("/api/v1/agent/",)
# Responses that say nothing final about the request itself: a retry must run it again.
NOT_STORED = frozenset({401, 403, 408, 429})
# The advisory locks' first key: keys of this module never meet another user's two-key locks.
LOCK_CLASS = 0x49444B59  # "IDKY"


def ttl() -> timedelta:
    return timedelta(seconds=getattr(settings, "IDEMPOTENCY_TTL_S", 24 * 3600))


def _wait_s() -> float:
    return float(getattr(settings, "IDEMPOTENCY_WAIT_S", 10.0))


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


def _is_json(request: HttpRequest) -> bool:
    """Whether the API reads the body as JSON: a JSON media type, or none at all (parsers.py)."""
    media_type = request.content_type or ""
    return media_type in ("", "application/json") or media_type.endswith("+json")


def canonical_body(request: HttpRequest) -> bytes:
    """The body as the request means it: a JSON body as its parsed value written one way (keys sorted, no
    spaces), so that a retry whose JSON differs only in whitespace or key order is the same request, as
    Stripe compares parameters rather than bytes. Any other body, or JSON the API refuses, stays as sent."""
    raw = request.body
    if not raw or not _is_json(request):
        return raw
    try:
        data = parse_json(raw, (request.content_params or {}).get("charset") or settings.DEFAULT_CHARSET)
    except (APIException, LookupError):
        return raw
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def request_fingerprint(request: HttpRequest) -> str:
    h = hashlib.sha256()
    h.update(request.method.encode() if request.method else b"")
    h.update(b"\n")
    h.update(request.get_full_path().encode())
    h.update(b"\n")
    h.update(canonical_body(request))
    return h.hexdigest()


def lock_key(scope: str, key: str) -> int:
    """The advisory lock's second key: 32 bits of the hash of (scope, key). Two keys that share it only
    make one request wait for the other."""
    digest = hashlib.sha256(f"{scope}\n{key}".encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def _error(status: int, code: str, message: str, fields: dict[str, list[str]] | None = None) -> JsonResponse:
    return JsonResponse(error_body(code, message, fields), status=status)


def _in_progress() -> JsonResponse:
    return _error(
        409, "idempotency_request_in_progress", f"A request with this {HEADER} is still in progress; retry it later."
    )


def _unavailable() -> HttpResponse:
    return database_unavailable(
        "The database failed while this request was being completed. Retry it with the same "
        f"{HEADER}: it runs again if nothing of it was kept, or answers as it did."
    )


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
        if not key.strip() or len(key) > MAX_KEY_LENGTH or text_problem(key):
            message = f"The {HEADER} header must be 1 to {MAX_KEY_LENGTH} characters, not all blank, and no NUL."
            return _error(400, "invalid_idempotency_key", message, {HEADER: [message]})
        scope = caller_scope(request)
        if scope is None:
            return self.get_response(request)
        return self._handle(request, scope=scope, key=key, fingerprint=request_fingerprint(request))

    def _handle(self, request: HttpRequest, *, scope: str, key: str, fingerprint: str) -> HttpResponse:
        response: HttpResponse | None = None
        stored: IdempotencyRecord | None = None
        try:
            with transaction.atomic():
                claim = _claim(scope=scope, key=key, fingerprint=fingerprint)
                if isinstance(claim, int):
                    # get_response never raises an Exception: Django turns the view's into a 500 response.
                    response = self.get_response(request)
                    _settle(claim, response)
                else:
                    stored = claim
        except Error as exc:
            if response is None and sqlstate(exc) == LOCK_NOT_AVAILABLE:
                return _in_progress()
            # The claim, the stored response or the COMMIT failed: whether the effect was kept is for a
            # retry to find out, not for the view's response to claim.
            log.warning("Idempotency-Key request not completed: %s", exc)
            return _unavailable()
        if response is not None:
            return response
        if stored is None:
            return _in_progress()
        if stored.request_fingerprint != fingerprint:
            return _error(
                422,
                "idempotency_key_reused",
                f"This {HEADER} was already used for a different request (another method, "
                "path or body). Use a new key for a new request.",
                {HEADER: ["Already used for a different request."]},
            )
        return _replay(stored)


def _settle(record_id: int, response: HttpResponse) -> None:
    """Inside the request's transaction: keep the response with the effect, keep the effect alone, or roll
    both back (a 5xx)."""
    status = response.status_code
    if status >= 500:
        transaction.set_rollback(True)
        return
    storable = (200 <= status < 300 or 400 <= status < 500) and status not in NOT_STORED
    if storable and not response.streaming:
        _store(record_id, status=status, body=bytes(response.content), content_type=response.get("Content-Type", ""))
    else:
        IdempotencyRecord.objects.filter(pk=record_id).delete()


# Statements written out, as they run on every keyed POST; names come from the model's metadata.
@functools.cache
def _sql(vendor: str) -> dict[str, str]:
    meta = IdempotencyRecord._meta
    qn = connection.ops.quote_name
    table = qn(meta.db_table)

    columns_by_name = {f.name: str(f.column) for f in meta.concrete_fields}

    def col(name: str) -> str:
        return qn(columns_by_name[name])

    scope, key, state, created = col("scope"), col("key"), col("state"), col("created_at")
    fresh = ", ".join(
        f"{col(name)} = {value}"
        for name, value in (
            ("request_fingerprint", f"excluded.{col('request_fingerprint')}"),
            ("state", f"excluded.{state}"),
            ("response_status", "NULL"),
            ("response_body", "NULL"),
            ("response_content_type", "''"),
            ("created_at", f"excluded.{created}"),
            ("completed_at", "NULL"),
        )
    )
    columns = f"{scope}, {key}, {col('request_fingerprint')}, {state}, {col('response_content_type')}, {created}"
    if vendor == "postgresql":
        # The row goes in only under the lock: a request that finds it taken inserts nothing and waits.
        source = (
            "SELECT %s, %s, %s, %s, '', %s WHERE pg_try_advisory_xact_lock(CAST(%s AS integer), CAST(%s AS integer))"
        )
    else:
        source = "VALUES (%s, %s, %s, %s, '', %s)"
    return {
        # An expired record, or one left in progress by a version that committed it so, is replaced.
        "claim": (
            f"INSERT INTO {table} ({columns}) {source} "
            f"ON CONFLICT ({scope}, {key}) DO UPDATE SET {fresh} "
            f"WHERE {table}.{created} < %s OR {table}.{state} = %s RETURNING {col('id')}"
        ),
        "store": (
            f"UPDATE {table} SET {state} = %s, {col('response_status')} = %s, {col('response_body')} = %s, "  # noqa: S608
            f"{col('response_content_type')} = %s, {col('completed_at')} = %s WHERE {col('id')} = %s"
        ),
    }


def _claim(*, scope: str, key: str, fingerprint: str) -> int | IdempotencyRecord | None:
    """Inside the request's transaction: the id of the record this request now holds, the stored record of
    an earlier request with the key, or None when another one still holds the key after the wait.

    The insert comes first: a new key, by far the common case, costs that one statement."""
    now = timezone.now()
    lock = lock_key(scope, key)
    waited = False
    deadline = time.monotonic() + _wait_s()
    while True:
        record_id = _insert(scope=scope, key=key, fingerprint=fingerprint, lock=lock, now=now)
        if record_id is not None:
            return record_id
        stored = (
            IdempotencyRecord.objects.filter(
                scope=scope, key=key, state=IdempotencyState.COMPLETED, created_at__gte=now - ttl()
            )
            .only("request_fingerprint", "response_status", "response_body", "response_content_type")
            .first()
        )
        if stored is not None:
            return stored
        # No stored response and no claim: on PostgreSQL another request holds the lock right now.
        if waited or connection.vendor != "postgresql":
            return None
        _wait_for_lock(lock, seconds=deadline - time.monotonic())
        waited = True


def _insert(*, scope: str, key: str, fingerprint: str, lock: int, now: datetime) -> int | None:
    created = connection.ops.adapt_datetimefield_value(now)
    params: list[Any] = [scope, key, fingerprint, IdempotencyState.IN_PROGRESS.value, created]
    if connection.vendor == "postgresql":
        params += [LOCK_CLASS, lock]
    params += [connection.ops.adapt_datetimefield_value(now - ttl()), IdempotencyState.IN_PROGRESS.value]
    with connection.cursor() as cursor:
        cursor.execute(_sql(connection.vendor)["claim"], params)
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def _wait_for_lock(lock: int, *, seconds: float) -> None:
    """Block until the request holding the key ends (its COMMIT, its rollback, or its connection's end),
    at most ``seconds``; past that PostgreSQL raises lock_not_available. The view then runs with the
    server's own lock timeout again."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{max(1, int(seconds * 1000))}ms"])
        cursor.execute("SELECT pg_advisory_xact_lock(CAST(%s AS integer), CAST(%s AS integer))", [LOCK_CLASS, lock])
        cursor.execute("SET LOCAL lock_timeout TO DEFAULT")


def _store(record_id: int, *, status: int, body: bytes, content_type: str) -> None:
    body_field = IdempotencyRecord._meta.get_field("response_body")
    params = [
        IdempotencyState.COMPLETED.value,
        status,
        body_field.get_db_prep_save(body, connection),  # type: ignore[union-attr]
        content_type,
        connection.ops.adapt_datetimefield_value(timezone.now()),
        record_id,
    ]
    with connection.cursor() as cursor:
        cursor.execute(_sql(connection.vendor)["store"], params)


def _replay(record: IdempotencyRecord) -> HttpResponse:
    response = HttpResponse(
        bytes(record.response_body or b""),
        status=record.response_status or 200,
        content_type=record.response_content_type or None,
    )
    response[REPLAYED_HEADER] = "true"
    return response
