"""Fencing: the lease a node's agent holds, and when the control plane may start a lost node's work elsewhere.

DESIGN invariant 8, a job runs in one place at a time. The agent stops its own containers once it has had no
answered heartbeat for its lease (``nodeagent.agent``); the control plane calls the server offline after the
offline threshold, and requeues its launches only once the lease, the stop grace a fenced container gets before
its SIGKILL, and a margin have passed since the last heartbeat, so the old copy is gone before the new one starts.
Both sides count from the same heartbeat: the agent from when it sent it, the control plane from when it recorded
it, which is later. The agent is told its lease in every heartbeat reply, so the two cannot disagree.

Settings (checked when they are read, see controlplane/settings.py): FLEET_HEARTBEAT_INTERVAL_S (per server,
``Server.heartbeat_interval_s``), FLEET_OFFLINE_AFTER_INTERVALS, FLEET_FENCE_AFTER_INTERVALS (fewer),
DISPATCH_STOP_GRACE_S and FLEET_REQUEUE_MARGIN_S. docs/fleet.md works the defaults through.
"""

from __future__ import annotations

from django.conf import settings


def offline_after_s(heartbeat_interval_s: float) -> float:
    """Seconds of silence after which a server is offline: nothing new is placed on it."""
    return float(settings.FLEET_OFFLINE_AFTER_INTERVALS * heartbeat_interval_s)


def lease_s(heartbeat_interval_s: float) -> float:
    """The agent's lease: seconds with no answered heartbeat after which it stops its containers."""
    return float(settings.FLEET_FENCE_AFTER_INTERVALS * heartbeat_interval_s)


def requeue_after_s(heartbeat_interval_s: float) -> float:
    """Seconds of silence after which a server's launches are lost and requeued: the agent's lease, the grace its
    fenced containers get before SIGKILL, and the margin (the agent's loop, the engine's kill, the clocks of the
    control plane's machines); never before the server is offline."""
    fenced_and_gone = (
        lease_s(heartbeat_interval_s) + float(settings.DISPATCH_STOP_GRACE_S) + float(settings.FLEET_REQUEUE_MARGIN_S)
    )
    return max(offline_after_s(heartbeat_interval_s), fenced_and_gone)


def outage_tolerance_s() -> float:
    """Seconds of silence that work nothing would replace survives: its agent keeps it running (to its window's
    end at most) and the control plane keeps its reservation running; past this, it is stopped and settled."""
    return float(settings.FLEET_OUTAGE_TOLERANCE_S)


def release_after_s(heartbeat_interval_s: float, *, replaceable: bool) -> float:
    """Seconds of silence after which a server's launches are given up: for replaceable work the requeue delay
    (its agent fenced it at the lease), for other work the outage tolerance, the stop grace and the margin
    (its agent stopped it at the tolerance)."""
    if replaceable:
        return requeue_after_s(heartbeat_interval_s)
    stopped_and_gone = (
        outage_tolerance_s() + float(settings.DISPATCH_STOP_GRACE_S) + float(settings.FLEET_REQUEUE_MARGIN_S)
    )
    return max(requeue_after_s(heartbeat_interval_s), stopped_and_gone)
