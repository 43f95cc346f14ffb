"""Node loss, told apart from our own fault (docs/fleet.md, "Outages and node loss").

Kubernetes' node lifecycle controller is the model: a node is not declared lost while the controller itself was
away (a grace after it starts again), and when most nodes fall silent at once the fault is far more likely ours
(the control plane's network, its database, its web tier) than theirs, so evictions stop (zone disruption).

A pass of the detector (Celery beat, every FLEET_HEARTBEAT_INTERVAL_S; two beats may run it at once):

1. **Judge**, in one transaction under the row lock of ``NodeLossWatch`` (so two passes judge in turn):

   - a pass that finds no previous pass, or the previous one more than ``GAP_PERIODS`` beat periods back (the
     detector, its beat or worker, or the database was away) opens a grace of FLEET_STARTUP_GRACE_S, and from
     then on a server's silence counts from the grace's start at the earliest: the silence that accrued during
     our own absence does not count;
   - a disruption is more than FLEET_DISRUPTION_SHARE of the live servers (not retired, ever heard), and at
     least FLEET_DISRUPTION_MIN_SERVERS of them, silent past the offline threshold together: node-loss handling
     is held (nothing marked offline, nothing interrupted or requeued), recorded as a ``NodeLossDisruption``
     (one notification when it starts and one when it ends); its end opens a grace for the stragglers;
   - outside a grace and a hold, each silent server goes offline (a conditional update on the heartbeat we
     judged, so one that raced in keeps it online), and all that this pass marked are announced together (one
     digest).

2. **Release**, each offline server in a transaction of its own under its row lock (which a heartbeat takes
   first too): dispatch gives up the launches whose time has come, by kind of work (``desired.server_lost``):
   replaceable work after ``fencing.requeue_after_s`` of silence, other work after ``fencing.release_after_s(...,
   replaceable=False)``.

Both steps only ever act later than the plain silence would say (the grace moves the start of silence later, a
hold acts not at all), so the agents' own fences (their lease, their outage tolerance) always come first:
DESIGN invariants 8 and 12.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from controlplane.core import domain_events
from controlplane.fleet import desired, fencing
from controlplane.fleet.models import NodeLossDisruption, NodeLossWatch
from controlplane.inventory.choices import EventKind, ServerState
from controlplane.inventory.models import Server, ServerEvent
from controlplane.inventory.services import NODE_LOSS_ACTOR, server_event

log = logging.getLogger(__name__)

# A pass further apart from the previous one than this many beat periods means passes were missed. Two, not
# one: a beat is punctual to a second or so, and a worker busy with a long task may run one pass late.
GAP_PERIODS = 2.0
# The domain event the detector publishes for a disruption that starts or ends (notifications listens).
DISRUPTION_EVENT = "node_loss_disruption"


@dataclass(frozen=True)
class Judgement:
    """What one pass found: whether it may act, and from when silence counts."""

    acts: bool
    silence_counts_from: datetime | None
    marked: frozenset[int] = frozenset()


def detect_lost_servers(now: datetime | None = None) -> int:
    """One pass of node-loss detection (module docstring). Returns how many servers it acted on (marked
    offline, or had launches given up)."""
    now = now or timezone.now()
    judgement = _judge(now)
    if not judgement.acts:
        return len(judgement.marked)
    acted = set(judgement.marked)
    offline = Server.objects.filter(state=ServerState.OFFLINE)
    for server in silent(offline, now, fencing.requeue_after_s, since=judgement.silence_counts_from):
        if _release_launches(server=server, now=now, since=judgement.silence_counts_from):
            acted.add(server.pk)
    return len(acted)


def silence_start(server: Server, since: datetime | None) -> datetime:
    """When ``server``'s silence counts from: its last heartbeat, or the last grace's start if later."""
    last = server.last_heartbeat_at
    assert last is not None
    return max(last, since) if since is not None else last


def silent(
    servers: QuerySet[Server], now: datetime, limit_s: Callable[[float], float], *, since: datetime | None
) -> list[Server]:
    """The servers silent for more than ``limit_s(their interval)`` at ``now``, silence counting from
    ``silence_start``."""
    shortest = servers.order_by("heartbeat_interval_s").values_list("heartbeat_interval_s", flat=True).first()
    if shortest is None:
        return []
    cutoff = now - timedelta(seconds=limit_s(shortest))
    if since is not None and since >= cutoff:
        return []  # nobody has been silent that long since the grace began
    # The shortest interval gives the widest net for the index; each server is then judged by its own interval.
    candidates = servers.filter(last_heartbeat_at__lt=cutoff)
    found = []
    for server in candidates.only("pk", "hostname", "state", "heartbeat_interval_s", "last_heartbeat_at"):
        if silence_start(server, since) + timedelta(seconds=limit_s(server.heartbeat_interval_s)) < now:
            found.append(server)
    return found


def live_servers() -> QuerySet[Server]:
    """The servers a disruption is counted among: not retired, and heard from at least once."""
    return Server.objects.exclude(state=ServerState.RETIRED).filter(last_heartbeat_at__isnull=False)


def disrupted(silent_count: int, live_count: int) -> bool:
    """The one rule of a disruption: more than the share of live servers, and at least the minimum, silent."""
    return (
        silent_count >= settings.FLEET_DISRUPTION_MIN_SERVERS
        and silent_count > float(settings.FLEET_DISRUPTION_SHARE) * live_count
    )


def _locked_watch() -> NodeLossWatch:
    # get_or_create survives a concurrent first pass (it reads again after the other's insert won).
    NodeLossWatch.objects.get_or_create(pk=1)
    return NodeLossWatch.objects.select_for_update().get(pk=1)


@transaction.atomic
def _judge(now: datetime) -> Judgement:
    watch = _locked_watch()
    if watch.last_pass_at is not None and now <= watch.last_pass_at:
        # Another beat's pass judged this moment (we waited for its lock): its verdict stands; nothing to add.
        return Judgement(acts=False, silence_counts_from=watch.silence_counts_from)
    grace_s = float(settings.FLEET_STARTUP_GRACE_S)
    gap_s = GAP_PERIODS * float(settings.FLEET_HEARTBEAT_INTERVAL_S)
    if watch.last_pass_at is None or (now - watch.last_pass_at).total_seconds() > gap_s:
        why = (
            "the detector's first pass"
            if watch.last_pass_at is None
            else f"no pass for {(now - watch.last_pass_at).total_seconds():.0f} s (the detector, its beat or "
            "worker, or the database was away)"
        )
        watch.silence_counts_from = now
        watch.grace_until = now + timedelta(seconds=grace_s)
        watch.grace_reason = why
        log.warning("node loss: grace of %g s after %s; silence counts from now", grace_s, why)

    live = live_servers()
    quiet = silent(live, now, fencing.offline_after_s, since=watch.silence_counts_from)
    total = live.count()
    held = disrupted(len(quiet), total)
    _record_disruption(watch, held=held, quiet=quiet, total=total, now=now)

    marked: list[ServerEvent] = []
    if not held and not watch.in_grace(now):
        for server in quiet:
            if server.state != ServerState.OFFLINE:
                event = _mark_offline(server=server, now=now, since=watch.silence_counts_from)
                if event is not None:
                    marked.append(event)
    # All this pass marked, in one publication: one digest for operators, however many servers went.
    domain_events.publish("server", marked)

    watch.last_pass_at = now
    watch.silent_servers = len(quiet)
    watch.live_servers = total
    watch.save()
    return Judgement(
        acts=not held and not watch.in_grace(now),
        silence_counts_from=watch.silence_counts_from,
        marked=frozenset(e.server_id for e in marked),
    )


def _record_disruption(watch: NodeLossWatch, *, held: bool, quiet: list[Server], total: int, now: datetime) -> None:
    """Open, follow or close the incident; under the watch's lock, so at most one is ever open."""
    current = NodeLossDisruption.objects.filter(ended_at__isnull=True).order_by("started_at").first()
    if held and current is None:
        incident = NodeLossDisruption.objects.create(
            started_at=now,
            silent_servers=len(quiet),
            live_servers=total,
            most_silent=len(quiet),
            hostnames=sorted(s.hostname for s in quiet),
        )
        log.warning("node loss held: %d of %d live servers silent together", len(quiet), total)
        domain_events.publish(DISRUPTION_EVENT, [incident])
    elif held and current is not None and len(quiet) > current.most_silent:
        NodeLossDisruption.objects.filter(pk=current.pk).update(most_silent=len(quiet))
    elif not held and current is not None:
        NodeLossDisruption.objects.filter(pk=current.pk).update(ended_at=now)
        current.ended_at = now
        # Stragglers get the grace to come back before any is called lost; their silence still counts.
        watch.grace_until = now + timedelta(seconds=float(settings.FLEET_STARTUP_GRACE_S))
        watch.grace_reason = "the end of a disruption"
        log.warning("node loss released: %d of %d live servers silent", len(quiet), total)
        domain_events.publish(DISRUPTION_EVENT, [current])


def _mark_offline(*, server: Server, now: datetime, since: datetime | None) -> ServerEvent | None:
    last = server.last_heartbeat_at
    assert last is not None
    silent_for = (now - silence_start(server, since)).total_seconds()
    # Conditional on the last heartbeat we judged: one that arrived meanwhile keeps the server online.
    if (
        Server.objects.filter(pk=server.pk, state=server.state, last_heartbeat_at=last).update(
            state=ServerState.OFFLINE, state_before_offline=server.state
        )
        != 1
    ):
        return None
    interval = server.heartbeat_interval_s
    start = silence_start(server, since)
    reason = (
        f"no heartbeat for {silent_for:.0f} s (limit {settings.FLEET_OFFLINE_AFTER_INTERVALS} x {interval:g} s)"
        if start == last
        else f"no heartbeat for {silent_for:.0f} s since the detector's grace began (last at {last.isoformat()})"
    )
    requeue_after = fencing.requeue_after_s(interval)
    release_after = fencing.release_after_s(interval, replaceable=False)
    event = server_event(
        server=server,
        kind=EventKind.STATE,
        actor=NODE_LOSS_ACTOR,
        from_state=server.state,
        to_state=ServerState.OFFLINE,
        at=now,
        reason=f"{reason}; its replaceable launches are requeued once it has been silent for {requeue_after:g} s, "
        f"the others given up after {release_after:g} s",
        data={
            "hostname": server.hostname,
            "last_heartbeat_at": last.isoformat(),
            "silent_since": start.isoformat(),
            "requeue_at": (start + timedelta(seconds=requeue_after)).isoformat(),
            "release_at": (start + timedelta(seconds=release_after)).isoformat(),
        },
    )
    event.save()
    return event


@transaction.atomic
def _release_launches(*, server: Server, now: datetime, since: datetime | None) -> bool:
    """Hand an offline server's launches whose time has come to dispatch as lost; True when any were."""
    # Under the server's row lock, which a heartbeat takes first too: a heartbeat that arrived meanwhile has
    # brought the server back, and its agent's own reports (fenced or running) settle its launches instead.
    locked = (
        Server.objects.select_for_update()
        .filter(pk=server.pk, state=ServerState.OFFLINE, last_heartbeat_at=server.last_heartbeat_at)
        .first()
    )
    if locked is None:
        return False
    silent_s = (now - silence_start(locked, since)).total_seconds()
    return desired.server_lost(locked, now, silent_s) > 0


@dataclass(frozen=True)
class Hold:
    """Why node-loss handling is held now, for /readyz and /metrics; ``reason`` empty when it is not."""

    reason: str  # "" | "grace" | "disruption"
    since: datetime | None = None
    until: datetime | None = None
    detail: str = ""
    silent_servers: int = 0
    live_servers: int = 0
    last_pass_at: datetime | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "held": bool(self.reason),
            "silent_servers": self.silent_servers,
            "live_servers": self.live_servers,
            "last_pass_at": self.last_pass_at.isoformat() if self.last_pass_at else None,
        }
        if self.reason:
            out["reason"] = self.reason
            out["detail"] = self.detail
            out["since"] = self.since.isoformat() if self.since else None
            if self.until is not None:
                out["until"] = self.until.isoformat()
        return out


def current_hold(now: datetime | None = None) -> Hold:
    """What the detector's last pass left: a disruption open, a grace running, or nothing held. Two queries."""
    now = now or timezone.now()
    watch = NodeLossWatch.objects.filter(pk=1).first()
    silent_servers = watch.silent_servers if watch else 0
    live_servers = watch.live_servers if watch else 0
    last_pass_at = watch.last_pass_at if watch else None
    incident = NodeLossDisruption.objects.filter(ended_at__isnull=True).order_by("started_at").first()
    if incident is not None:
        return Hold(
            reason="disruption",
            since=incident.started_at,
            detail=f"{incident.silent_servers} of {incident.live_servers} live servers went silent together; "
            "no server is marked offline and no work is interrupted or requeued until most are heard again",
            silent_servers=silent_servers,
            live_servers=live_servers,
            last_pass_at=last_pass_at,
        )
    if watch is not None and watch.grace_until is not None and watch.in_grace(now):
        return Hold(
            reason="grace",
            since=watch.grace_until - timedelta(seconds=float(settings.FLEET_STARTUP_GRACE_S)),
            until=watch.grace_until,
            detail=f"grace after {watch.grace_reason}",
            silent_servers=silent_servers,
            live_servers=live_servers,
            last_pass_at=last_pass_at,
        )
    return Hold(reason="", silent_servers=silent_servers, live_servers=live_servers, last_pass_at=last_pass_at)
