"""From what happened to an Event row: the domain-event listener, and the emit functions features call.

``on_domain_events`` runs inside the publisher's transaction (controlplane/core/domain_events.py): it only
writes the outbox rows and asks for a fan-out after the commit. Which reservation event is which notification:

- booked: pending -> scheduled (a booking, a queued request started, a requeue's follow-up);
- starting: -> starting; running: -> running (the connect information is read at fan-out);
- extended: an event without a state change that carries ``old_ends_at``;
- image failed: an event without a state change whose ``image`` says a pull ahead of the window failed;
- failed, interrupted: -> failed, -> interrupted; requeued: the note carrying ``follow_up``;
- GPU fault: a GPU's health going unhealthy while an active allocation holds it now;
- servers lost: the servers one node-loss pass marked offline, as one digest; server back: a heartbeat bringing
  an offline server back; disruption (and its end): node-loss handling held because most servers went silent
  together, once per incident; join token used: an enrollment.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.inventory.choices import EventKind, GpuHealth, ServerState
from controlplane.notifications.choices import EventType
from controlplane.notifications.models import Event
from controlplane.reservations.choices import ReservationState

log = logging.getLogger(__name__)


def _reservation_type(event: Any) -> EventType | None:
    data = event.data or {}
    to, frm = event.to_state, event.from_state
    if to == frm:
        if "old_ends_at" in data:
            return EventType.EXTENDED
        if "follow_up" in data:
            return EventType.REQUEUED
        if (data.get("image") or {}).get("state") == "failed":
            return EventType.IMAGE_FAILED
        return None
    if to == ReservationState.SCHEDULED and frm == ReservationState.PENDING:
        return EventType.BOOKED
    return {
        ReservationState.STARTING: EventType.STARTING,
        ReservationState.RUNNING: EventType.RUNNING,
        ReservationState.FAILED: EventType.FAILED,
        ReservationState.INTERRUPTED: EventType.INTERRUPTED,
    }.get(to)


def _reservation_events(events: Sequence[Any]) -> list[Event]:
    rows = []
    for event in events:
        kind = _reservation_type(event)
        if kind is None:
            continue
        reservation = event.reservation
        payload: dict[str, Any] = {"reason": event.reason, "from_state": event.from_state, "to_state": event.to_state}
        if kind == EventType.EXTENDED:
            payload.update(old_ends_at=event.data["old_ends_at"], ends_at=event.data["ends_at"])
        if kind == EventType.REQUEUED:
            payload["follow_up"] = event.data["follow_up"]
        if kind == EventType.IMAGE_FAILED:
            image = event.data["image"]
            payload.update(image=image.get("image"), server=image.get("server"), error=image.get("error", ""))
        rows.append(
            Event(
                type=kind,
                project_id=reservation.project_id,
                reservation=reservation,
                payload=payload,
                occurred_at=event.at,
            )
        )
    return rows


def _gpu_faults(events: Sequence[Any]) -> list[Event]:
    from controlplane.reservations.models import Allocation

    faults = [
        e
        for e in events
        if e.kind == EventKind.GPU_HEALTH and e.to_state == GpuHealth.UNHEALTHY and e.from_state != GpuHealth.UNHEALTHY
    ]
    if not faults:
        return []
    by_gpu = {e.gpu_id: e for e in faults if e.gpu_id is not None}
    now = faults[0].at
    holders = Allocation.objects.filter(
        gpu_id__in=list(by_gpu), active=True, starts_at__lte=now, ends_at__gt=now
    ).select_related("reservation", "gpu")
    rows = []
    for allocation in holders:
        e = by_gpu[allocation.gpu_id]
        rows.append(
            Event(
                type=EventType.GPU_FAULT,
                project_id=allocation.reservation.project_id,
                reservation=allocation.reservation,
                server_id=e.server_id,
                payload={
                    "gpu": allocation.gpu.uuid,
                    "gpu_index": allocation.gpu.index,
                    "reasons": list((e.data or {}).get("reasons", [])),
                    "reason": e.reason,
                },
                occurred_at=e.at,
            )
        )
    return rows


def _servers_lost(events: Sequence[Any]) -> list[Event]:
    """One digest for every server a node-loss pass marked offline (it publishes them together): an incident
    that takes ten servers is one email, listing them, not ten."""
    offline = [e for e in events if e.kind == EventKind.STATE and e.to_state == ServerState.OFFLINE]
    if not offline:
        return []
    servers = [
        {
            "hostname": (e.data or {}).get("hostname") or _hostname(e.server_id),
            "reason": e.reason,
            "from_state": e.from_state,
            **{k: v for k, v in (e.data or {}).items() if k != "hostname"},
        }
        for e in offline
    ]
    return [
        Event(
            type=EventType.SERVER_LOST,
            # A digest of one is about that server (its page, its name in the title); of more, about the fleet.
            server_id=offline[0].server_id if len(offline) == 1 else None,
            payload={"count": len(servers), "servers": servers, "reason": offline[0].reason},
            occurred_at=offline[0].at,
        )
    ]


def _servers_back(events: Sequence[Any]) -> list[Event]:
    """A heartbeat brought an offline server back (the ingest's state event out of offline)."""
    return [
        Event(
            type=EventType.SERVER_BACK,
            server_id=e.server_id,
            payload={"reason": e.reason, "to_state": e.to_state, **(e.data or {})},
            occurred_at=e.at,
        )
        for e in events
        if e.kind == EventKind.STATE
        and e.from_state == ServerState.OFFLINE
        and e.to_state not in (ServerState.OFFLINE, ServerState.RETIRED)
    ]


def _hostname(server_id: int) -> str:
    from controlplane.inventory.models import Server

    return str(Server.objects.filter(pk=server_id).values_list("hostname", flat=True).first() or "")


def _disruptions(incidents: Sequence[Any]) -> list[Event]:
    """Node loss held, and released: one event each per incident (the unique key makes a second pass's
    publication of the same incident a no-op)."""
    rows = []
    for incident in incidents:
        ended = incident.ended_at is not None
        rows.append(
            Event(
                type=EventType.DISRUPTION_ENDED if ended else EventType.DISRUPTION,
                payload={
                    "started_at": incident.started_at.isoformat(),
                    "ended_at": incident.ended_at.isoformat() if ended else None,
                    "silent_servers": incident.silent_servers,
                    "live_servers": incident.live_servers,
                    "most_silent": incident.most_silent,
                    "hostnames": list(incident.hostnames or []),
                },
                occurred_at=incident.ended_at if ended else incident.started_at,
                dedup_key=f"disruption:{incident.pk}",
            )
        )
    return rows


def on_domain_events(kind: str, objects: Sequence[Any]) -> None:
    """The domain-event listener: the outbox rows for what deserves a notification, in the same transaction."""
    rows: list[Event] = []
    if kind == "reservation":
        rows = _reservation_events(objects)
    elif kind == "server":
        rows = _gpu_faults(objects) + _servers_lost(objects) + _servers_back(objects)
    elif kind == "node_loss_disruption":
        for row in _disruptions(objects):
            _once(row)
        return
    elif kind == "join_token_used":
        rows = [
            Event(
                type=EventType.JOIN_TOKEN_USED,
                server_id=token.server_id,
                payload={"join_token": token.lookup, "note": token.note, "hostname": token.server.hostname},
                occurred_at=token.used_at or timezone.now(),
            )
            for token in objects
        ]
    if rows:
        record(rows)


def record(rows: list[Event]) -> list[Event]:
    """Write outbox rows in the caller's transaction; their fan-out is asked for once it commits."""
    for row in rows:
        row.save()
    ids = [row.pk for row in rows]
    transaction.on_commit(lambda: _enqueue_fan_out(ids))
    return rows


def _enqueue_fan_out(event_ids: list[int]) -> None:
    from controlplane.dispatch.services import publish_once
    from controlplane.notifications.tasks import fan_out

    for n, event_id in enumerate(event_ids):
        try:
            publish_once(fan_out, args=[event_id])
        except Exception as exc:
            # The beat's reconciler fans out whatever was left (tasks.reconcile).
            log.warning(
                "could not enqueue the fan-out of event %s (%s) nor of %d more", event_id, exc, len(event_ids) - n - 1
            )
            return


# -- Emit functions for features that are not built yet -----------------------------------------------------------
# Each writes one event in the caller's transaction. The feature that detects the condition calls it; nothing in
# this codebase fakes one.


@transaction.atomic
def emit_preempted(*, reservation: Any, by: str, notice_s: float, reason: str, at: datetime | None = None) -> Event:
    """Preemption (docs/scheduling.md): ``reservation`` is being preempted by ``by`` (a reservation or request
    id) after ``notice_s`` seconds of notice."""
    return record(
        [
            Event(
                type=EventType.PREEMPTED,
                project_id=reservation.project_id,
                reservation=reservation,
                payload={"by": by, "notice_s": notice_s, "reason": reason},
                occurred_at=at or timezone.now(),
            )
        ]
    )[0]


def emit_idle_warning(
    *, reservation: Any, idle_minutes: float, threshold_percent: float, at: datetime | None = None
) -> Event | None:
    """An idle-GPU detector: ``reservation``'s GPUs were under ``threshold_percent`` utilization for
    ``idle_minutes``. Once per reservation and idle stretch start (``at``); None when already raised."""
    at = at or timezone.now()
    return _once(
        Event(
            type=EventType.IDLE_WARNING,
            project_id=reservation.project_id,
            reservation=reservation,
            payload={"idle_minutes": idle_minutes, "threshold_percent": threshold_percent},
            occurred_at=at,
            dedup_key=f"{reservation.pk}:{at.isoformat()}",
        )
    )


def emit_budget_threshold(
    *, project: Any, period: str, threshold_percent: int, used: str, budget: str, at: datetime | None = None
) -> Event | None:
    """The ledger's budget check: ``project`` used ``threshold_percent`` of its ``budget`` for ``period``
    (e.g. "2026-12"). Once per project, period and threshold; None when already raised."""
    return _once(
        Event(
            type=EventType.BUDGET_THRESHOLD,
            project_id=project.pk,
            payload={"period": period, "threshold_percent": threshold_percent, "used": used, "budget": budget},
            occurred_at=at or timezone.now(),
            dedup_key=f"{project.pk}:{period}:{threshold_percent}",
        )
    )


def _once(row: Event) -> Event | None:
    try:
        with transaction.atomic():
            return record([row])[0]
    except IntegrityError:
        return None


def on_reservation_yielded(reservation: Any, by: Any, at: datetime) -> None:
    """The reservations app's yield hook: a window cut short by a winner (``by``) is a preemption. A cut with
    no winner (an operator's, or idle reclamation's) is told by its own event."""
    if by is None:
        return
    from controlplane.reservations.models import Reservation

    current = Reservation.objects.get(pk=reservation.pk)  # the cut's terms, as this transaction wrote them
    emit_preempted(
        reservation=current,
        by=f"reservation {by.public_id}",
        notice_s=float(current.yield_notice_seconds or 0),
        reason=current.yield_reason,
        at=at,
    )


def on_budget_alert(alert: Any) -> None:
    """The ledger's budget listener (called after the alert commits): a threshold crossed, once per period."""
    emit_budget_threshold(
        project=alert.project,
        period=alert.period_key,
        threshold_percent=int(alert.threshold),
        used=str(alert.spent),
        budget=str(alert.budget),
        at=alert.at,
    )


def on_idle_warning(reclamation: Any) -> None:
    """Idle reclamation's listener (after the warning commits): the people are told, once per warning."""
    emit_idle_warning(
        reservation=reclamation.reservation,
        idle_minutes=float(reclamation.idle_minutes),
        threshold_percent=float(reclamation.threshold_percent),
        at=reclamation.warned_at,
    )
