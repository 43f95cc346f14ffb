"""Sending emails through Django's email framework (SMTP from EMAIL_* settings, or the demo's file backend),
from a worker, with retries at the steps of NOTIFICATIONS_EMAIL_RETRY_S."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db.models import Q
from django.utils import timezone

from controlplane.notifications.choices import EmailState
from controlplane.notifications.models import EmailMessage

# While one worker sends, the row's next attempt is pushed this far ahead, so the reconciler does not send it too.
CLAIM_S = 120


def email_send(*, email_id: int, now: datetime | None = None) -> bool:
    """Send one stored email if it is due; True when the mail server took it."""
    now = now or timezone.now()
    claimed = (
        EmailMessage.objects.filter(pk=email_id, state=EmailState.PENDING)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .update(next_attempt_at=now + timedelta(seconds=CLAIM_S))
    )
    if claimed != 1:
        return False
    email = EmailMessage.objects.get(pk=email_id)
    message = EmailMultiAlternatives(
        subject=email.subject,
        body=email.body_text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[email.to_address],
        headers={"X-Gpucp-Email-Id": str(email.pk)},
    )
    if email.body_html:
        message.attach_alternative(email.body_html, "text/html")
    number = email.attempts + 1
    try:
        message.send(fail_silently=False)
    except Exception as exc:  # smtplib's and the socket's errors alike: the next attempt may work
        schedule = settings.NOTIFICATIONS_EMAIL_RETRY_S
        failed = number > len(schedule)
        EmailMessage.objects.filter(pk=email.pk).update(
            attempts=number,
            last_error=f"{type(exc).__name__}: {exc}"[:500],
            state=EmailState.FAILED if failed else EmailState.PENDING,
            next_attempt_at=None if failed else timezone.now() + timedelta(seconds=schedule[number - 1]),
        )
        return False
    EmailMessage.objects.filter(pk=email.pk).update(
        attempts=number, state=EmailState.SENT, sent_at=timezone.now(), next_attempt_at=None, last_error=""
    )
    return True


def due_emails(now: datetime, limit: int = 100) -> list[int]:
    return list(
        EmailMessage.objects.filter(state=EmailState.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
