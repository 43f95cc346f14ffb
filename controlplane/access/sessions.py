"""SSH sessions as events on their reservations (DESIGN: every session is an event: who, key, source, times).

The agent's gateway reports each session twice, as it opens and as it closes, in heartbeat events of kind
"session". An agent resends events until a heartbeat is answered, so a phase already recorded is skipped.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

from django.db.models import Q

from controlplane.access.web.portalkeys import is_portal_session
from controlplane.dispatch.models import Launch
from controlplane.inventory.models import Server
from controlplane.reservations.models import Reservation, ReservationEvent
from nodeagent.schema import AgentEvent, SessionInfo

log = logging.getLogger(__name__)

EVENT_KIND = "ssh_session"


def session_sentence(session: SessionInfo, server: str, *, portal: bool = False) -> str:
    what = ", ".join(session.kinds) if session.kinds else "session"
    if portal:  # the web proxy's, logged in with the user's portal key (docs/proxy.md, "Audit")
        who = f"{session.user} through the web proxy ({session.source}) on {server}"
        name = "Web session"
    else:
        who = f"{session.user} ({session.fingerprint}) from {session.source} on {server}"
        name = "SSH session"
    if session.phase == "open":
        return f"{name} {session.session_id} opened by {who}"
    reason = f": {session.reason}" if session.reason else ""
    return f"{name} {session.session_id} ({what}) of {who} closed{reason}"


def sessions_reported(server: Server, events: Sequence[AgentEvent], now: datetime) -> None:
    """Record each session phase once, on the reservation it reached, if that reservation ran on ``server``."""
    wanted = {(e.reservation, e.session.session_id, e.session.phase): e for e in events if e.session and e.reservation}
    if not wanted:
        return
    public_ids = {reservation for reservation, _, _ in wanted}
    # Only reservations with a launch on this server: an agent speaks for its own node alone (invariant 6).
    reservations = {
        str(r.public_id): r
        for r in Reservation.objects.filter(
            public_id__in=[p for p in public_ids if _is_uuid(p)],
            pk__in=Launch.objects.filter(server=server).values("reservation_id"),
        )
    }
    if not reservations:
        return
    seen_filter = Q()
    for reservation_id, session_id, phase in wanted:
        if reservation_id in reservations:
            seen_filter |= Q(data__session_id=session_id, data__phase=phase)
    seen = set(
        ReservationEvent.objects.filter(
            Q(reservation__in=reservations.values(), data__kind=EVENT_KIND) & seen_filter
        ).values_list("data__session_id", "data__phase")
    )
    rows = []
    for (reservation_id, session_id, phase), event in wanted.items():
        reservation = reservations.get(reservation_id)
        session = event.session
        if reservation is None or session is None or (session_id, phase) in seen:
            continue
        portal = is_portal_session(session.user, session.fingerprint)
        rows.append(
            ReservationEvent(
                reservation=reservation,
                from_state=reservation.state,
                to_state=reservation.state,
                actor_label=f"user:{session.user}"[:150],
                reason=session_sentence(session, server.hostname, portal=portal),
                data={
                    "kind": EVENT_KIND,
                    "server": server.hostname,
                    **({"via": "portal"} if portal else {}),
                    **session.model_dump(mode="json"),
                },
                at=session.ended_at if phase == "close" and session.ended_at else session.started_at,
            )
        )
    if rows:
        ReservationEvent.objects.bulk_create(rows)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
