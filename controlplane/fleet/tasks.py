"""Periodic fleet reconcilers (scheduled in settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from controlplane.core.leader import leader_only
from controlplane.fleet import services


@shared_task(name="controlplane.fleet.tasks.detect_lost_servers", ignore_result=True)
@leader_only(skipped=0)
def detect_lost_servers() -> int:
    """Idempotent: a server already offline is not marked again. Beat runs it every heartbeat interval. Behind
    the leader lease: it judges the whole fleet at once (how many servers went silent together, one digest per
    incident), which two passes at the same instant would each judge alone."""
    return services.detect_lost_servers()


@shared_task(name="controlplane.fleet.tasks.prune_telemetry", ignore_result=True)
def prune_telemetry() -> int:
    return services.prune_telemetry()
