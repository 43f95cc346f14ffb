from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.notifications.support import Receiver, SmtpSink


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:  # type: ignore[no-untyped-def]
    # The receiver listens on loopback, which the SSRF rule refuses unless the operator allows it.
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = True
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def smtp(settings) -> Iterator[SmtpSink]:  # type: ignore[no-untyped-def]
    sink = SmtpSink().start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = sink.port
    settings.EMAIL_USE_TLS = False
    yield sink
    sink.stop()
