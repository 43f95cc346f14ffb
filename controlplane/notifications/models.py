"""Notifications: the outbox of events, each person's list and preferences, webhook endpoints and their
deliveries, and the log of emails sent."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.inventory.models import Server
from controlplane.notifications.choices import Channel, DeliveryState, EmailState, EventType
from controlplane.reservations.models import Reservation


class Event(models.Model):
    """One thing that happened, written in the transaction of the change itself (the outbox).

    ``fanned_out_at`` is set once its notifications, emails and webhook deliveries exist: a fan-out task does
    that at once after the commit, and the beat's reconciler does it for any event whose task was lost (a broker
    that was down). ``dedup_key`` makes an event that a periodic check raises (ends soon) happen once.
    """

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    type = models.CharField(max_length=40, choices=EventType.choices)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    reservation = models.ForeignKey(
        Reservation, on_delete=models.CASCADE, null=True, blank=True, related_name="notification_events"
    )
    server = models.ForeignKey(Server, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    payload = models.JSONField(default=dict, blank=True)
    occurred_at = models.DateTimeField(default=timezone.now)
    dedup_key = models.CharField(max_length=120, blank=True)
    fanned_out_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["id"], condition=Q(fanned_out_at__isnull=True), name="notif_event_pending"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["type", "dedup_key"], condition=~Q(dedup_key=""), name="notif_event_once_per_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.pk}"


class Notification(models.Model):
    """One event in one person's list (the bell); unread until they mark it read."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="notifications")
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["user", "-id"], name="notif_user_recent")]
        constraints = [models.UniqueConstraint(fields=["user", "event"], name="notif_once_per_user_event")]

    def __str__(self) -> str:
        return f"{self.user_id}: {self.title}"


class NotificationPreference(models.Model):
    """A person's choice for one event type; without a row, choices.DEFAULT_CHANNELS decides."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    event_type = models.CharField(max_length=40, choices=EventType.choices)
    channel = models.CharField(max_length=16, choices=Channel.choices)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "event_type"], name="notif_pref_once")]

    def __str__(self) -> str:
        return f"{self.user_id} {self.event_type}: {self.channel}"


class WebhookEndpoint(models.Model):
    """A project's receiver of events, signed per the Standard Webhooks specification.

    A rotation keeps the previous secret valid (deliveries carry both signatures) until
    ``previous_secret_expires_at``. ``lease_until`` is held by the one worker sending this endpoint's queue, so
    deliveries go out one at a time, in the order of the events.
    """

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=200, blank=True)
    events = models.JSONField(default=list)
    secret = models.CharField(max_length=100)
    previous_secret = models.CharField(max_length=100, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.TextField(blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.project_id}: {self.url}"


class WebhookDelivery(models.Model):
    """One event to one endpoint: its attempts so far, the last answer, and when the next attempt is due.
    ``history`` keeps each attempt (time, status code or error, duration): the delivery log."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_response = models.TextField(blank=True)
    last_error = models.TextField(blank=True)
    history = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["endpoint", "event"], condition=Q(state="pending"), name="notif_delivery_queue"),
            models.Index(fields=["next_attempt_at"], condition=Q(state="pending"), name="notif_delivery_due"),
        ]
        constraints = [models.UniqueConstraint(fields=["endpoint", "event"], name="notif_delivery_once")]

    def __str__(self) -> str:
        return f"{self.event_id} -> {self.endpoint_id}: {self.state}"


class EmailMessage(models.Model):
    """An email to send or sent, with its attempts: the outbox a worker sends from, and the log the portal
    shows under the demo's file backend."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    event = models.ForeignKey(Event, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    to_address = models.EmailField()
    subject = models.CharField(max_length=200)
    body_text = models.TextField()
    body_html = models.TextField(blank=True)
    state = models.CharField(max_length=16, choices=EmailState.choices, default=EmailState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["next_attempt_at"], condition=Q(state="pending"), name="notif_email_due")]

    def __str__(self) -> str:
        return f"{self.to_address}: {self.subject}"
