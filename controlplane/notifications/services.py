"""Notifications' writes: fan-out of an event, preferences, reading, webhook endpoints, the ends-soon check."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Cast
from django.utils import timezone

from controlplane.accounts.choices import Role
from controlplane.accounts.models import Membership, Project
from controlplane.core.errors import Conflict, PermissionDenied, ValidationFailed
from controlplane.notifications import messages, signing, urlcheck
from controlplane.notifications.choices import (
    DEFAULT_CHANNELS,
    OPERATOR_EVENTS,
    SUBSCRIBABLE_EVENTS,
    Channel,
    DeliveryState,
    EventType,
)
from controlplane.notifications.events import _once
from controlplane.notifications.models import (
    EmailMessage,
    Event,
    Notification,
    NotificationPreference,
    WebhookDelivery,
    WebhookEndpoint,
)
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation


# -- Fan-out --------------------------------------------------------------------------------------------------
def _data(event: Event) -> dict[str, Any]:
    """The event's payload as webhooks carry it and the texts read it: its facts plus what it is about."""
    from controlplane.reservations import hooks

    data: dict[str, Any] = {**event.payload, "event_id": str(event.public_id)}
    if event.reservation_id is not None:
        r = event.reservation
        assert r is not None
        data["reservation"] = {
            "id": str(r.public_id),
            "name": r.name,
            "state": r.state,
            "starts_at": r.starts_at.isoformat(),
            "ends_at": r.ends_at.isoformat(),
        }
        if event.type == EventType.RUNNING:
            data["connect"] = hooks.access_for(r)
    if event.project_id is not None:
        data["project"] = event.project.slug if event.project else ""
    if event.server_id is not None and event.server is not None:
        data["server"] = event.server.hostname
    data["link"] = messages.link(event)
    return data


def recipients(event: Event) -> list[Any]:
    """Who sees an event in their list: the project's members for a project's event, operators for the fleet's."""
    User = get_user_model()
    if event.type in OPERATOR_EVENTS:
        return list(User.objects.filter(is_staff=True, is_active=True).order_by("pk"))
    if event.project_id is None:
        return []
    ids = Membership.objects.filter(project_id=event.project_id).values_list("user_id", flat=True)
    return list(User.objects.filter(pk__in=ids, is_active=True).order_by("pk"))


def channels_for(users: list[Any], event_type: str) -> dict[int, str]:
    chosen = dict(
        NotificationPreference.objects.filter(user__in=users, event_type=event_type).values_list("user_id", "channel")
    )
    default = DEFAULT_CHANNELS.get(event_type, Channel.NONE)
    return {u.pk: chosen.get(u.pk, default) for u in users}


def event_fan_out(*, event_id: int, now: datetime | None = None) -> bool:
    """Write an event's notifications, emails and webhook deliveries, once: False when another fan-out did
    (or the event is gone). Sending happens in tasks after the commit."""
    return events_fan_out(event_ids=[event_id], now=now) == 1


@transaction.atomic
def events_fan_out(*, event_ids: list[int], now: datetime | None = None) -> int:
    """Fan out many events in one transaction, with a fixed number of statements however many they are: one
    bulk insert each of notifications, emails and deliveries, one update of the events. Returns how many it
    fanned out; events another fan-out holds (locked) or did are skipped, never waited for."""
    now = now or timezone.now()
    events = list(
        Event.objects.select_for_update(of=("self",), skip_locked=True)
        .select_related("reservation", "project", "server")
        .filter(pk__in=event_ids, fanned_out_at__isnull=True)
        .order_by("pk")
    )
    if not events:
        return 0
    # Who receives, and through which channel, is the same for every event of one project and type.
    people: dict[tuple[bool, int | None], list[Any]] = {}
    chosen: dict[tuple[bool, int | None, str], dict[int, str]] = {}
    hooks_of: dict[int, list[WebhookEndpoint]] = {}
    notifications: list[Notification] = []
    emails: list[EmailMessage] = []
    deliveries: list[WebhookDelivery] = []
    for event in events:
        data = _data(event)
        event.payload = data
        title, body = messages.describe(event, data)
        who = (event.type in OPERATOR_EVENTS, event.project_id)
        if who not in people:
            people[who] = recipients(event)
        users = people[who]
        if (*who, event.type) not in chosen:
            chosen[(*who, event.type)] = channels_for(users, event.type)
        channels = chosen[(*who, event.type)]
        notifications += [
            Notification(user=u, event=event, title=title[:200], body=body, created_at=now) for u in users
        ]
        emails += [
            _email_row(user=u, event=event, subject=title, text=body, link=data["link"], now=now)
            for u in users
            if channels[u.pk] == Channel.EMAIL and u.email
        ]
        if event.project_id is not None and event.type not in OPERATOR_EVENTS:
            if event.project_id not in hooks_of:
                hooks_of[event.project_id] = list(
                    WebhookEndpoint.objects.filter(project_id=event.project_id, enabled=True).order_by("pk")
                )
            deliveries += [
                WebhookDelivery(endpoint=e, event=event, next_attempt_at=now, created_at=now)
                for e in hooks_of[event.project_id]
                if event.type in e.events
            ]
    Notification.objects.bulk_create(notifications, ignore_conflicts=True)
    EmailMessage.objects.bulk_create(emails)
    WebhookDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)
    payload = Event._meta.get_field("payload")
    done = Event.objects.filter(pk__in=[e.pk for e in events], fanned_out_at__isnull=True).update(
        fanned_out_at=now,
        payload=Cast(
            Case(*[When(pk=e.pk, then=Value(e.payload, output_field=payload)) for e in events], output_field=payload),
            output_field=payload,
        ),
    )
    if done != len(events):
        # Under the row locks nobody else can have done it; kept as the conditional update the style asks for.
        raise Conflict("An event was fanned out meanwhile.", code="conflict")
    email_ids = [m.pk for m in emails]
    endpoint_ids = sorted({d.endpoint_id for d in deliveries})
    transaction.on_commit(lambda: _enqueue_sends(email_ids=email_ids, endpoint_ids=endpoint_ids))
    return len(events)


def _email(*, user: Any, event: Event | None, subject: str, text: str, link: str, now: datetime) -> EmailMessage:
    message = _email_row(user=user, event=event, subject=subject, text=text, link=link, now=now)
    message.save()
    return message


def _email_row(*, user: Any, event: Event | None, subject: str, text: str, link: str, now: datetime) -> EmailMessage:
    """An email to send, not yet saved (a fan-out inserts its emails together)."""
    from django.template.loader import render_to_string

    context = {"subject": subject, "text": text, "link": link, "user": user}
    return EmailMessage(
        user=user,
        event=event,
        to_address=user.email,
        subject=subject[:200],
        body_text=render_to_string("notifications/email.txt", context),
        body_html=render_to_string("notifications/email.html", context),
        next_attempt_at=now,
        created_at=now,
    )


def _enqueue_sends(*, email_ids: list[int], endpoint_ids: list[int]) -> None:
    import logging

    from controlplane.dispatch.services import publish_once
    from controlplane.notifications.tasks import deliver_endpoint, send_email

    try:
        for email_id in email_ids:
            publish_once(send_email, args=[email_id])
        for endpoint_id in endpoint_ids:
            publish_once(deliver_endpoint, args=[endpoint_id])
    except Exception as exc:
        # Everything is stored with its next attempt due now: the beat's reconciler sends it.
        logging.getLogger(__name__).warning("could not enqueue notification sends (%s); the beat sends them", exc)


# -- The list ---------------------------------------------------------------------------------------------------
def notifications_mark_read(*, user: Any, ids: list[int] | None, now: datetime | None = None) -> int:
    """Mark ``user``'s notifications read (all unread ones when ``ids`` is None); another's ids are ignored."""
    qs = Notification.objects.filter(user=user, read_at__isnull=True)
    if ids is not None:
        qs = qs.filter(pk__in=ids)
    return qs.update(read_at=now or timezone.now())


# -- Preferences ----------------------------------------------------------------------------------------------
def preference_types_for(user: Any) -> list[EventType]:
    """Fleet events are for operators: others neither receive nor choose them."""
    return [t for t in SUBSCRIBABLE_EVENTS if user.is_staff or t not in OPERATOR_EVENTS]


def preferences_of(user: Any) -> list[dict[str, Any]]:
    chosen = dict(NotificationPreference.objects.filter(user=user).values_list("event_type", "channel"))
    return [
        {
            "event_type": t.value,
            "description": t.label,
            "channel": chosen.get(t.value, DEFAULT_CHANNELS[t]),
            "default_channel": DEFAULT_CHANNELS[t],
        }
        for t in preference_types_for(user)
    ]


@transaction.atomic
def preferences_set(*, user: Any, changes: dict[str, str]) -> list[dict[str, Any]]:
    """Set the channel of each event type in ``changes``; all or nothing."""
    allowed = {t.value for t in preference_types_for(user)}
    # An event only operators receive, chosen by someone else: a refusal of who asks (403), as the schema's
    # list of events is everyone's.
    refused = {f"preferences.{t}": ["Only operators receive this event."] for t in changes if t not in allowed}
    if refused:
        raise PermissionDenied("Some of these events reach operators only.", fields=refused)
    errors = {}
    for event_type, channel in changes.items():
        if channel not in Channel.values:
            errors[f"preferences.{event_type}"] = [f"{channel!r} is not one of {', '.join(Channel.values)}."]
    if errors:
        raise ValidationFailed("Some preferences are not valid.", fields=errors)
    for event_type, channel in changes.items():
        NotificationPreference.objects.update_or_create(user=user, event_type=event_type, defaults={"channel": channel})
    return preferences_of(user)


# -- Webhook endpoints ----------------------------------------------------------------------------------------
def _check_url(url: str) -> str:
    url = (url or "").strip()
    try:
        urlcheck.resolve(url)
    except urlcheck.UrlRefused as exc:
        raise ValidationFailed(str(exc), fields={"url": [str(exc)]}) from exc
    return url


def _check_events(events: list[str]) -> list[str]:
    allowed = {t.value for t in SUBSCRIBABLE_EVENTS if t not in OPERATOR_EVENTS}
    bad = [e for e in events if e not in allowed]
    if bad:
        message = f"{bad[0]!r} is not an event a project's webhook can receive."
        raise ValidationFailed(message, fields={"events": [message]})
    if not events:
        raise ValidationFailed("Choose at least one event.", fields={"events": ["Choose at least one event."]})
    return sorted(set(events))


@transaction.atomic
def endpoint_create(*, project: Project, url: str, events: list[str], description: str, actor: Any) -> WebhookEndpoint:
    """A new endpoint with a fresh secret (shown in full to owners, who configure the receiver with it)."""
    return WebhookEndpoint.objects.create(
        project=project,
        url=_check_url(url),
        events=_check_events(events),
        description=description,
        secret=signing.new_secret(),
        created_by=actor if getattr(actor, "pk", None) else None,
    )


@transaction.atomic
def endpoint_update(
    *,
    endpoint: WebhookEndpoint,
    url: str | None = None,
    events: list[str] | None = None,
    description: str | None = None,
    enabled: bool | None = None,
) -> WebhookEndpoint:
    """Change an endpoint; ``enabled=True`` on a disabled one resumes its queue where it stopped."""
    fields: dict[str, Any] = {}
    if url is not None:
        fields["url"] = _check_url(url)
    if events is not None:
        fields["events"] = _check_events(events)
    if description is not None:
        fields["description"] = description
    if enabled is not None:
        fields["enabled"] = enabled
        if enabled:
            fields.update(disabled_reason="", disabled_at=None)
        elif endpoint.enabled:
            fields.update(disabled_reason="disabled by an owner", disabled_at=timezone.now())
    if fields:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(**fields)
    if enabled:
        # Attempts that were waiting are due now, not at the far end of their backoff.
        WebhookDelivery.objects.filter(endpoint=endpoint, state=DeliveryState.PENDING).update(
            next_attempt_at=timezone.now()
        )
        transaction.on_commit(lambda: _enqueue_sends(email_ids=[], endpoint_ids=[endpoint.pk]))
    endpoint.refresh_from_db()
    return endpoint


@transaction.atomic
def endpoint_rotate_secret(
    *, endpoint: WebhookEndpoint, overlap_s: int | None = None, now: datetime | None = None
) -> WebhookEndpoint:
    """A new secret; the old one still signs deliveries (a second signature) for ``overlap_s``."""
    now = now or timezone.now()
    overlap = settings.NOTIFICATIONS_SECRET_OVERLAP_S if overlap_s is None else overlap_s
    current = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    WebhookEndpoint.objects.filter(pk=current.pk).update(
        secret=signing.new_secret(),
        previous_secret=current.secret if overlap > 0 else "",
        previous_secret_expires_at=now + timedelta(seconds=overlap) if overlap > 0 else None,
    )
    current.refresh_from_db()
    return current


def signing_secrets(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    secrets_ = [endpoint.secret]
    if endpoint.previous_secret and endpoint.previous_secret_expires_at and endpoint.previous_secret_expires_at > now:
        secrets_.append(endpoint.previous_secret)
    return secrets_


@transaction.atomic
def endpoint_send_test(*, endpoint: WebhookEndpoint, actor: Any, now: datetime | None = None) -> WebhookDelivery:
    """A ``webhook.test`` event to this endpoint alone, queued behind what it has pending."""
    now = now or timezone.now()
    if not endpoint.enabled:
        raise Conflict("The endpoint is disabled; enable it first.", code="endpoint_disabled")
    event = Event(
        type=EventType.TEST,
        project_id=endpoint.project_id,
        occurred_at=now,
        fanned_out_at=now,
        payload={"sent_by": getattr(actor, "username", "system"), "endpoint": str(endpoint.public_id)},
    )
    event.save()
    event.payload = {**event.payload, "event_id": str(event.public_id)}
    Event.objects.filter(pk=event.pk).update(payload=event.payload)
    delivery = WebhookDelivery.objects.create(endpoint=endpoint, event=event, next_attempt_at=now, created_at=now)
    transaction.on_commit(lambda: _enqueue_sends(email_ids=[], endpoint_ids=[endpoint.pk]))
    return delivery


@transaction.atomic
def endpoint_delete(*, endpoint: WebhookEndpoint) -> None:
    endpoint.delete()


# -- Ends soon ------------------------------------------------------------------------------------------------
_LIVE = [ReservationState.STARTING, ReservationState.RUNNING]


def ends_soon_check(now: datetime | None = None) -> int:
    """Raise "ends in N" for each live reservation that crossed a lead (NOTIFICATIONS_ENDS_IN_S) since its last
    one; once per reservation, lead and end (an extension re-arms it). Only the nearest lead crossed: after an
    outage the 10-minute warning comes alone, not after a stale one-hour one. Returns how many it raised."""
    now = now or timezone.now()
    leads = sorted(settings.NOTIFICATIONS_ENDS_IN_S)
    if not leads:
        return 0
    widest = leads[-1]
    candidates = list(
        Reservation.objects.filter(state__in=_LIVE, ends_at__gt=now, ends_at__lte=now + timedelta(seconds=widest))
        .exclude(starts_at__gt=F("ends_at") - timedelta(seconds=leads[0]))
        .only("pk", "project_id", "starts_at", "ends_at")
    )
    if not candidates:
        return 0
    raised_keys = set(
        Event.objects.filter(type=EventType.ENDS_SOON, reservation__in=candidates).values_list("dedup_key", flat=True)
    )
    raised = 0
    for r in candidates:
        left = (r.ends_at - now).total_seconds()
        crossed = [lead for lead in leads if lead >= left and (r.ends_at - r.starts_at).total_seconds() >= lead]
        if not crossed:
            continue
        lead = crossed[0]
        key = f"{r.pk}:{lead}:{r.ends_at.isoformat()}"
        if key in raised_keys:
            continue
        event = Event(
            type=EventType.ENDS_SOON,
            project_id=r.project_id,
            reservation=r,
            payload={"lead_s": lead, "ends_at": r.ends_at.isoformat()},
            occurred_at=now,
            dedup_key=key,
        )
        with transaction.atomic():
            if _once(event) is not None:
                raised += 1
    return raised


def owners_of(project_id: int) -> list[Any]:
    User = get_user_model()
    ids = Membership.objects.filter(project_id=project_id, role=Role.OWNER).values_list("user_id", flat=True)
    return list(User.objects.filter(pk__in=ids, is_active=True))
