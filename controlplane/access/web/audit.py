"""Every opening through the web proxy is an event on its reservation, as SSH sessions are (docs/proxy.md,
"Audit"): a link redeemed for an app (``web_app``) or a terminal (``web_terminal``): who, which app, the
browser's address and when. A link is good once: the event recording its redemption is also the record that it
was used, written under the reservation's row lock, so two requests racing with one link get one session."""

from __future__ import annotations

import secrets
from datetime import datetime

from django.db import transaction

from controlplane.access.web.grants import Grant
from controlplane.access.web.links import Claims
from controlplane.reservations.models import Reservation, ReservationEvent

APP_EVENT = "web_app"
TERMINAL_EVENT = "web_terminal"


def redeem(claims: Claims, grant: Grant, *, source: str, now: datetime) -> str | None:
    """Record the link's use and answer a new session id; None when the link was used already."""
    kind = TERMINAL_EVENT if claims.port is None else APP_EVENT
    with transaction.atomic():
        reservation = Reservation.objects.select_for_update().only("pk", "state").get(pk=grant.reservation_pk)
        used = ReservationEvent.objects.filter(reservation=reservation, data__kind=kind, data__link=claims.nonce)
        if used.exists():
            return None
        session = secrets.token_hex(8)
        what = "the web terminal" if claims.port is None else f"the app {claims.port}"
        ReservationEvent.objects.create(
            reservation=reservation,
            from_state=reservation.state,
            to_state=reservation.state,
            actor_label=f"user:{grant.user}"[:150],
            reason=f"{grant.user} opened {what} in the browser from {source}",
            data={
                "kind": kind,
                "user": grant.user,
                "port": claims.port,
                "server": claims.server,
                "source": source,
                "session_id": session,
                "link": claims.nonce,
            },
            at=now,
        )
    return session
