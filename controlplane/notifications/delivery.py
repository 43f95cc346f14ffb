"""Sending webhooks: one endpoint's queue at a time, in the order of its events, with retries.

A worker takes an endpoint's lease (a conditional update), then sends its oldest pending delivery, and the next,
until one fails or is not due yet: a failing endpoint holds back its later events, so a receiver sees them in
order. It works in batches (one read, the sends over one kept-alive connection, one commit of the outcomes), so
a busy queue costs the database a few statements per hundred deliveries, not one commit each. A failed attempt
waits for the next step of NOTIFICATIONS_WEBHOOK_RETRY_S (exponential, about a day in all); once the last one
fails, the delivery is failed, the endpoint disabled and its project's owners emailed.
Nothing here runs inside a request: the tasks and the beat's reconciler call it.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta
from typing import Any, cast

import urllib3
from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import BigIntegerField, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from controlplane.notifications import messages, signing, urlcheck
from controlplane.notifications.choices import DeliveryState
from controlplane.notifications.models import Event, WebhookDelivery, WebhookEndpoint

# Longer than one attempt can take (connect plus read timeout), renewed before each attempt.
LEASE_S = 120
EXCERPT_CHARS = 500
USER_AGENT = "gpucp-webhooks/1"
# Deliveries read, sent and recorded together (one read, one commit); a slow receiver renews the lease mid-batch.
BATCH = 100
# The first event whose fan-out has not committed yet; with none, every event id is below the bound.
_first_unfanned = Event.objects.filter(fanned_out_at__isnull=True).order_by("id").values("id")[:1]
_NO_EVENT = 2**63 - 1
# Typed: an untyped Value is an IntegerField, which PostgreSQL's server-side binding sends as an int4 (this one
# wrapped round to -1, and nothing was sent at all).
_NO_EVENT_VALUE = Value(_NO_EVENT, output_field=BigIntegerField())

_pools = threading.local()


def _pool(target: urlcheck.Target) -> urllib3.HTTPConnectionPool:
    """A keep-alive pool per checked address, per thread. The connection goes to the address that passed the
    check; the URL's host is only the Host header and the TLS name."""
    cache: dict[tuple[str, str, int, str], urllib3.HTTPConnectionPool] = _pools.__dict__.setdefault("cache", {})
    key = (target.scheme, target.address, target.port, target.host)
    pool = cache.get(key)
    if pool is None:
        timeout = urllib3.Timeout(total=settings.NOTIFICATIONS_WEBHOOK_TIMEOUT_S)
        if target.scheme == "https":
            pool = urllib3.HTTPSConnectionPool(
                target.address,
                target.port,
                timeout=timeout,
                retries=False,
                maxsize=1,
                server_hostname=target.host,
                assert_hostname=target.host,
                cert_reqs="CERT_REQUIRED",
            )
        else:
            pool = urllib3.HTTPConnectionPool(target.address, target.port, timeout=timeout, retries=False, maxsize=1)
        cache[key] = pool
    return pool


def post_to(target: urlcheck.Target, *, body: bytes, headers: dict[str, str]) -> tuple[int | None, str, str]:
    """One POST to an address that passed the check, over this thread's kept-alive connection to it."""
    default_port = 443 if target.scheme == "https" else 80
    host_header = target.host if target.port == default_port else f"{target.host}:{target.port}"
    if ":" in target.host and not target.host.startswith("["):
        host_header = f"[{target.host}]" if target.port == default_port else f"[{target.host}]:{target.port}"
    try:
        response = _pool(target).urlopen(
            "POST",
            target.path,
            body=body,
            headers={**headers, "host": host_header, "user-agent": USER_AGENT},
            redirect=False,
            preload_content=False,
        )
        try:
            excerpt = response.read(EXCERPT_CHARS * 4, decode_content=True)[: EXCERPT_CHARS * 4]
        finally:
            response.release_conn()
        return response.status, excerpt.decode("utf-8", "replace")[:EXCERPT_CHARS], ""
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return None, "", f"{type(exc).__name__}: {exc}"[:EXCERPT_CHARS]


def _claim(endpoint_id: int, now: datetime) -> datetime | None:
    until = now + timedelta(seconds=LEASE_S)
    won = (
        WebhookEndpoint.objects.filter(pk=endpoint_id, enabled=True)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .update(lease_until=until)
    )
    return until if won == 1 else None


def _check(url: str) -> urlcheck.Target | str:
    """The checked address to connect to, or the refusal every attempt of this batch records."""
    try:
        return urlcheck.resolve(url)
    except urlcheck.UrlRefused as exc:
        return f"refused: {exc}"


def deliver_endpoint(*, endpoint_id: int, limit: int = 500, clock: Any = timezone.now) -> int:
    """Send what is due of one endpoint's queue, in order; returns how many attempts it made. A second worker
    on the same endpoint finds the lease taken and returns 0.

    The queue goes in batches of BATCH: one read, the sends one after the other over one kept-alive
    connection, then one transaction recording every outcome (a bulk update). The URL's host is resolved and
    checked once per batch and again whenever the lease is renewed (at least every LEASE_S / 2), so a name that
    moves inside is refused within a batch or a minute. A worker that dies mid-batch leaves those deliveries
    pending: they are sent again, with the same webhook-id (at least once, as the specification allows)."""
    lease = _claim(endpoint_id, clock())
    if lease is None:
        return 0
    attempts = 0
    try:
        while attempts < limit:
            wanted = min(BATCH, limit - attempts)
            batch = list(
                WebhookDelivery.objects.filter(endpoint_id=endpoint_id, state=DeliveryState.PENDING)
                # Order across fan-outs: two fan-out workers may commit event 102's deliveries before event
                # 101's; nothing past the first event still waiting for its fan-out goes out yet, so 101 can
                # never arrive after 102 (a read of the pending events' partial index).
                .filter(event_id__lt=Coalesce(Subquery(_first_unfanned), _NO_EVENT_VALUE))
                .select_related("event", "endpoint__project")
                .order_by("event_id")[:wanted]
            )
            if not batch or not batch[0].endpoint.enabled:
                return attempts
            endpoint = batch[0].endpoint
            target = _check(endpoint.url)
            outcomes: list[tuple[WebhookDelivery, dict[str, Any]]] = []
            go_on = len(batch) == wanted
            try:
                for d in batch:
                    now = clock()
                    if d.next_attempt_at is not None and d.next_attempt_at > now:
                        go_on = False  # not due: the later ones wait behind it
                        break
                    if (lease - now).total_seconds() < LEASE_S / 2:
                        _record(endpoint, outcomes)
                        outcomes = []
                        renewed = now + timedelta(seconds=LEASE_S)
                        if (
                            WebhookEndpoint.objects.filter(pk=endpoint_id, lease_until=lease).update(
                                lease_until=renewed
                            )
                            != 1
                        ):
                            return attempts  # the lease ran out and another worker holds it now
                        lease = renewed
                        target = _check(endpoint.url)
                    attempts += 1
                    ok, fields = _send(d, endpoint, target, now=now, clock=clock)
                    outcomes.append((d, fields))
                    if not ok:
                        go_on = False  # a failure holds back the rest of the queue, in order
                        break
            finally:
                _record(endpoint, outcomes)
            if not go_on:
                return attempts
    finally:
        WebhookEndpoint.objects.filter(pk=endpoint_id, lease_until=lease).update(lease_until=None)
    return attempts


def _send(
    delivery: WebhookDelivery,
    endpoint: WebhookEndpoint,
    target: urlcheck.Target | str,
    *,
    now: datetime,
    clock: Any = timezone.now,
) -> tuple[bool, dict[str, Any]]:
    """One attempt of one delivery, not yet recorded: (2xx?, the fields its outcome sets)."""
    from controlplane.notifications.services import signing_secrets

    event = delivery.event
    body = json.dumps(messages.webhook_body(event, event.payload), separators=(",", ":")).encode()
    msg_id = f"msg_{event.public_id.hex}"
    headers = signing.headers(signing_secrets(endpoint, now), msg_id=msg_id, timestamp=int(now.timestamp()), body=body)
    started = time.perf_counter()
    if isinstance(target, str):
        status, excerpt, error = None, "", target
    else:
        status, excerpt, error = post_to(target, body=body, headers=headers)
    elapsed_ms = round((time.perf_counter() - started) * 1000, 1)
    done = clock()
    ok = status is not None and 200 <= status < 300
    number = delivery.attempts + 1
    entry = {"attempt": number, "at": done.isoformat(), "status_code": status, "error": error, "ms": elapsed_ms}
    fields: dict[str, Any] = {
        "attempts": number,
        "last_status_code": status,
        "last_response": excerpt,
        "last_error": error or ("" if ok else f"HTTP {status}"),
        "history": [*delivery.history, entry][-50:],
        "delivered_at": None,
    }
    schedule = settings.NOTIFICATIONS_WEBHOOK_RETRY_S
    if ok:
        fields.update(state=DeliveryState.DELIVERED, delivered_at=done, next_attempt_at=None)
    elif number > len(schedule):
        fields.update(state=DeliveryState.FAILED, next_attempt_at=None)
    else:
        fields.update(state=DeliveryState.PENDING, next_attempt_at=done + timedelta(seconds=schedule[number - 1]))
    return ok, fields


_RECORDED = (
    "state",
    "attempts",
    "next_attempt_at",
    "last_status_code",
    "last_response",
    "last_error",
    "history",
    "delivered_at",
)


@transaction.atomic
def _record(endpoint: WebhookEndpoint, outcomes: list[tuple[WebhookDelivery, dict[str, Any]]]) -> None:
    """A batch's outcomes in one commit; a last attempt that failed disables the endpoint in the same
    transaction. Conditional on the delivery still pending, like every state change here."""
    if not outcomes:
        return
    # One parametrized statement per delivery, sent together (psycopg pipelines executemany) in one commit: a
    # CASE over a whole batch costs more to build than it saves.
    model_fields = [cast("models.Field[Any, Any]", WebhookDelivery._meta.get_field(name)) for name in _RECORDED]
    table = connection.ops.quote_name(WebhookDelivery._meta.db_table)
    sets = ", ".join(f"{connection.ops.quote_name(f.get_attname_column()[1] or f.name)} = %s" for f in model_fields)
    rows = [
        [*(f.get_db_prep_save(fields[f.name], connection) for f in model_fields), d.pk, DeliveryState.PENDING.value]
        for d, fields in outcomes
    ]
    with connection.cursor() as cursor:
        # Only quoted model names go into the text; every value is a parameter.
        cursor.executemany(f"UPDATE {table} SET {sets} WHERE id = %s AND state = %s", rows)  # noqa: S608
    last, fields = outcomes[-1]
    if fields["state"] == DeliveryState.FAILED:
        _disable(
            endpoint, delivery=last, error=fields["last_error"], now=datetime.fromisoformat(fields["history"][-1]["at"])
        )


def _disable(endpoint: WebhookEndpoint, *, delivery: WebhookDelivery, error: str, now: datetime) -> None:
    from controlplane.notifications import services

    reason = (
        f"Every attempt of delivery {delivery.pk} ({delivery.event.type}) failed over the retry window "
        f"({len(settings.NOTIFICATIONS_WEBHOOK_RETRY_S) + 1} attempts); the last: {error}"
    )
    if (
        WebhookEndpoint.objects.filter(pk=endpoint.pk, enabled=True).update(
            enabled=False, disabled_reason=reason, disabled_at=now
        )
        != 1
    ):
        return
    link = f"{settings.NOTIFICATIONS_PORTAL_URL.rstrip('/')}/projects/{endpoint.project.slug}/webhooks"
    subject = f"Webhook disabled: {endpoint.url}"[:200]
    text = f"The webhook endpoint {endpoint.url} of project {endpoint.project.slug} was disabled.\n\n{reason}"
    emails = [
        services._email(user=owner, event=None, subject=subject, text=text, link=link, now=now)
        for owner in services.owners_of(endpoint.project_id)
        if owner.email
    ]
    ids = [m.pk for m in emails]
    transaction.on_commit(lambda: services._enqueue_sends(email_ids=ids, endpoint_ids=[]))


def due_endpoints(now: datetime, limit: int = 100) -> list[int]:
    """Enabled endpoints with a pending delivery due and no live lease: the reconciler's work."""
    return list(
        WebhookEndpoint.objects.filter(enabled=True)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .filter(deliveries__state=DeliveryState.PENDING, deliveries__next_attempt_at__lte=now)
        .values_list("pk", flat=True)
        .distinct()
        .order_by("pk")[:limit]
    )
