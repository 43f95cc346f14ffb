"""Periodic fleet reconcilers (scheduled in settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from controlplane.fleet import services


@shared_task(name="controlplane.fleet.tasks.detect_lost_servers", ignore_result=True)
def detect_lost_servers() -> int:
    """Idempotent: a server already offline is not marked again. Beat runs it every heartbeat interval."""
    return services.detect_lost_servers()


@shared_task(name="controlplane.fleet.tasks.prune_telemetry", ignore_result=True)
def prune_telemetry() -> int:
    return services.prune_telemetry()
