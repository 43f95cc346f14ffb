from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from controlplane.core.idempotency import ttl
from controlplane.core.models import IdempotencyRecord


@shared_task
def prune_idempotency_records() -> int:
    """Delete Idempotency-Key records past their 24 h lifetime; returns how many went."""
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=timezone.now() - ttl()).delete()
    return deleted
