"""Notifications' tasks: fan-out after a commit, one endpoint's queue, one email; and the beat's reconcilers,
which do the same for whatever a lost task (a broker that was down) left behind."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from controlplane.notifications import delivery, emails, services
from controlplane.notifications.models import Event

# Younger events are left to the fan-out task their commit queued.
RECONCILE_AFTER_S = 5


@shared_task
def fan_out(event_id: int) -> bool:
    return services.event_fan_out(event_id=event_id)


@shared_task
def deliver_endpoint(endpoint_id: int) -> int:
    return delivery.deliver_endpoint(endpoint_id=endpoint_id)


@shared_task
def send_email(email_id: int) -> bool:
    return emails.email_send(email_id=email_id)


@shared_task
def reconcile() -> bool:
    """Fan out events left behind, send what is due (first attempts and retries); True when it found work."""
    now = timezone.now()
    found = False
    stale = now - timedelta(seconds=RECONCILE_AFTER_S)
    left = list(
        Event.objects.filter(fanned_out_at__isnull=True, occurred_at__lt=stale).values_list("pk", flat=True)[:500]
    )
    if left:  # together: one transaction and a handful of statements for all of them
        found = services.events_fan_out(event_ids=left) > 0
    now = timezone.now()  # what the fan-out just queued is due now too
    for email_id in emails.due_emails(now):
        found = True
        emails.email_send(email_id=email_id, now=now)
    for endpoint_id in delivery.due_endpoints(now):
        found = delivery.deliver_endpoint(endpoint_id=endpoint_id) > 0 or found
    return found


@shared_task
def ends_soon() -> int:
    return services.ends_soon_check()
