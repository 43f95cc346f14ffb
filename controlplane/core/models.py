from __future__ import annotations

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
