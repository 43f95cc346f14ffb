"""Emails through Django's SMTP backend to a real SMTP server (aiosmtpd) on loopback."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.notifications import emails, services
from controlplane.notifications.choices import EmailState
from controlplane.notifications.models import EmailMessage, Event
from controlplane.reservations import services as reservations
from controlplane.reservations.choices import ReservationState
from tests.factories import UserFactory
from tests.notifications.support import SmtpSink
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window

pytestmark = pytest.mark.django_db


def _running_email() -> EmailMessage:
    owner = UserFactory(email="olive@example.org")
    proj = project(owner=owner)
    model = gpu_model()
    server(model, gpus=1)
    r = reservations.reservation_create(
        project=proj, name="train", spec=spec(model), window=window(), container=CONTAINER, actor=owner
    )
    for to in (ReservationState.STARTING, ReservationState.RUNNING):
        reservations.reservation_mark(
            reservation=r, from_states=[r.state], to=to, actor_label="system:test", reason="x"
        )
    for pk in Event.objects.order_by("id").values_list("pk", flat=True):
        services.event_fan_out(event_id=pk)
    return EmailMessage.objects.get()


def test_an_email_is_plain_text_and_html_with_a_link_to_the_reservation(smtp: SmtpSink) -> None:
    email = _running_email()
    assert emails.email_send(email_id=email.pk)
    (message,) = smtp.messages
    assert smtp.envelopes[0][1] == ["olive@example.org"]
    assert message["Subject"] == "Running: train"
    parts = {p.get_content_type(): p.get_payload(decode=True).decode() for p in message.walk() if not p.is_multipart()}
    event = Event.objects.get(type="reservation.running")
    link = f"/reservations/{event.reservation.public_id}"
    assert link in parts["text/plain"] and f'href="http://127.0.0.1:8000{link}"' in parts["text/html"]
    email.refresh_from_db()
    assert email.state == EmailState.SENT and email.attempts == 1
    assert not emails.email_send(email_id=email.pk)  # sent once
    assert len(smtp.messages) == 1


def test_a_mail_server_that_is_down_is_retried_later_then_given_up(smtp: SmtpSink, settings: Any) -> None:
    settings.NOTIFICATIONS_EMAIL_RETRY_S = [30]
    email = _running_email()
    port = smtp.port
    smtp.stop()
    settings.EMAIL_PORT = port
    assert not emails.email_send(email_id=email.pk)
    email.refresh_from_db()
    assert email.state == EmailState.PENDING and email.attempts == 1 and email.last_error
    assert email.next_attempt_at is not None
    assert not emails.email_send(email_id=email.pk)  # not due yet: nothing tried
    email.refresh_from_db()
    assert email.attempts == 1
    assert not emails.email_send(email_id=email.pk, now=email.next_attempt_at)
    email.refresh_from_db()
    assert email.state == EmailState.FAILED and email.attempts == 2


def test_the_demo_backend_writes_the_message_under_var(settings: Any, tmp_path: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path)
    email = _running_email()
    assert emails.email_send(email_id=email.pk)
    (written,) = list(tmp_path.iterdir())
    assert "Subject: Running: train" in written.read_text()
