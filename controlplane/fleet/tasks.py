"""Periodic fleet reconcilers (scheduled in settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from controlplane.core.leader import leader_only
from controlplane.fleet import services


@shared_task(name="controlplane.fleet.tasks.detect_lost_servers", ignore_result=True)
@leader_only(skipped=0)
def detect_lost_servers() -> int:
    """Beat runs it every heartbeat interval. Behind the leader lease, so one beat's pass judges the fleet at a
    time; correct without it too: each pass judges under the row lock of the detector's record
    (``NodeLossWatch``), marking and giving up are conditional updates, and a pass that finds the last pass at or
    after its own time does nothing (controlplane/fleet/nodeloss.py)."""
    return services.detect_lost_servers()


@shared_task(name="controlplane.fleet.tasks.prune_telemetry", ignore_result=True)
def prune_telemetry() -> int:
    return services.prune_telemetry()
