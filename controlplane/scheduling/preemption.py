"""The queue's side of preemption (docs/scheduling.md, "Preemption").

* A waiting request of a non-preemptible class whose GPUs are held by preemptible reservations is booked
  from the earliest instant their notice allows (``reservations.preemption.earliest_preempting_start``):
  the booking service itself cuts the fewest of them short, under its locks.
* A ``requeue: true`` request whose reservation was preempted goes back into the queue as a new request
  (same spec, container, duration and class; ``requeued_from`` names it), in the preempting transaction;
  both requests' events name the winner. The reservations app tells this one through
  ``reservations.hooks.register_on_yielded``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from controlplane.reservations.preemption import earliest_preempting_start
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import QueuedRequest

Book = Callable[..., None]


def start_by_preempting(request: QueuedRequest, *, now: datetime, book: Book) -> bool:
    """Book ``request`` over preemptible reservations' GPUs, from when their notice allows; False (nothing
    written) when its class is preemptible, or when cutting them would not make room. ``book`` is the
    pass's ``_book_and_mark``."""
    if request.priority_class.preemptible:
        return False  # a preemptible request only starts on GPUs nobody holds
    from controlplane.scheduling.services import spec_of

    duration = timedelta(seconds=request.duration_seconds)
    start = earliest_preempting_start(spec_of(request), duration, now=now)
    if start is None:
        return False
    from controlplane.core.errors import Conflict, QuotaExceeded, ValidationFailed
    from controlplane.scheduling.services import _Lost

    try:
        book(request, now=now, starts_at=start)
    except (Conflict, QuotaExceeded, ValidationFailed, _Lost):
        # Refused there too (the quota, GPUs taken meanwhile, another pass first): the pass treats the
        # request as it did the refusal from now, and the next pass looks again.
        return False
    return True


def on_reservation_yielded(reservation: Any, by: Any, at: datetime) -> None:
    """A queued request's reservation was cut short: record it on the request, and queue it again when it
    asked for ``requeue``."""
    from django.db import transaction

    from controlplane.scheduling.services import _event, trigger_pass

    request = (
        QueuedRequest.objects.select_related("priority_class", "project", "created_by")
        .filter(reservation_id=reservation.pk)
        .first()
    )
    if request is None:
        return
    now = at
    winner = f"reservation {by.public_id}" if by is not None else "an operator"
    if not request.requeue:
        _event(
            request,
            from_state=request.state,
            to_state=request.state,
            actor=None,
            reason=f"its reservation {reservation.public_id} was preempted by {winner}",
            at=now,
        )
        return
    again = QueuedRequest.objects.create(
        project=request.project,
        created_by=request.created_by,
        name=request.name,
        spec=request.spec,
        container=request.container,
        duration_seconds=request.duration_seconds,
        start_by=request.start_by,
        priority_class=request.priority_class,
        state=RequestState.QUEUED,
        requeue=True,
        requeued_from=request,
        created_at=now,
    )
    transaction.on_commit(trigger_pass)
    _event(
        request,
        from_state=request.state,
        to_state=request.state,
        actor=None,
        reason=f"its reservation {reservation.public_id} was preempted by {winner}; queued again as {again.public_id}",
        at=now,
    )
    _event(
        again,
        from_state="",
        to_state=RequestState.QUEUED,
        actor=None,
        reason=f"requeued from {request.public_id}: its reservation {reservation.public_id} was preempted by {winner}",
        at=now,
    )
