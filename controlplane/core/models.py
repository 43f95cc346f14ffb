from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane.core.choices import IdempotencyState


class IdempotencyRecord(models.Model):
    """The outcome of a POST sent with an ``Idempotency-Key``, replayed when the same request comes again.

    ``scope`` is a hash of the caller's identity, so two callers never share a key. The record is written in
    the request's own transaction (controlplane/core/idempotency.py): ``in_progress`` is only ever seen by
    that transaction, and a committed record holds the response that was committed with the effect.
    """

    scope = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    request_fingerprint = models.CharField(max_length=64, help_text="SHA-256 of method, path and body.")
    state = models.CharField(max_length=16, choices=IdempotencyState.choices, default=IdempotencyState.IN_PROGRESS)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    response_content_type = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="idempotency_unique_scope_key")]

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"


class StateChangeEvent(models.Model):
    """An audit-trail entry of one object's state change: from and to, by whom, when and why. Concrete events
    (a reservation's, a queued request's) add the object they belong to."""

    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # "user:alice", "system:dispatch": readable after the user is deleted.
    actor_label = models.CharField(max_length=150)
    reason = models.TextField()
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        abstract = True
        ordering = ["at", "id"]
