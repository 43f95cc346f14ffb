"""Notifications' reads, each narrowed to what the caller may see."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from controlplane.accounts.models import Project
from controlplane.notifications.models import EmailMessage, Notification, WebhookDelivery, WebhookEndpoint


def notifications_of(user: Any) -> QuerySet[Notification]:
    return Notification.objects.filter(user=user).select_related("event__reservation", "event__project")


def unread_count(user: Any) -> int:
    return Notification.objects.filter(user=user, read_at__isnull=True).count()


def endpoints_of(project: Project) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(project=project).order_by("pk")


def deliveries_of(endpoint: WebhookEndpoint) -> QuerySet[WebhookDelivery]:
    return WebhookDelivery.objects.filter(endpoint=endpoint).select_related("event").order_by("-id")


def outbox_for(user: Any) -> QuerySet[EmailMessage]:
    """The demo outbox: operators see every email, anyone else those sent to them."""
    qs = EmailMessage.objects.order_by("-id")
    return qs if user.is_staff else qs.filter(user=user)
