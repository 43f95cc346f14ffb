"""Passes of the node-loss detector for tests: a detector that has been running all along, and fleets of servers
that heartbeat at chosen times."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from controlplane.fleet.models import NodeLossWatch
from controlplane.fleet.nodeloss import detect_lost_servers


def steady_pass(now: datetime) -> int:
    """One pass at ``now`` of a detector that has been passing every beat period until then, so no grace is
    open and silence counts from each server's last heartbeat, as it did before the grace existed. Tests of
    the grace call ``detect_lost_servers`` itself."""
    before = now - timedelta(seconds=float(settings.FLEET_HEARTBEAT_INTERVAL_S))
    watch, _ = NodeLossWatch.objects.get_or_create(pk=1)
    if watch.last_pass_at is None or watch.last_pass_at < before:
        NodeLossWatch.objects.filter(pk=1).update(last_pass_at=before)
    return detect_lost_servers(now)


def passes(start: datetime, until: datetime, *, every: float | None = None) -> int:
    """Passes every beat period from ``start`` up to and including ``until``, as Celery beat runs them; the sum
    of what they acted on."""
    step = timedelta(seconds=every if every is not None else float(settings.FLEET_HEARTBEAT_INTERVAL_S))
    acted, at = 0, start
    while at < until:
        acted += detect_lost_servers(at)
        at += step
    return acted + detect_lost_servers(until)
