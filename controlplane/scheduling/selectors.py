from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from controlplane.accounts.selectors import projects_visible_to
from controlplane.reservations.capacity import EARLIEST_WITHIN
from controlplane.reservations.windows import earliest_window
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import QueuedRequest
from controlplane.scheduling.services import spec_of


def requests_visible_to(user: Any) -> QuerySet[QueuedRequest]:
    """The requests of the projects ``user`` belongs to (every request for an operator)."""
    return QueuedRequest.objects.filter(project__in=projects_visible_to(user))


def position(request: QueuedRequest) -> int | None:
    """1-based place in the queue among queued requests of its class and above, in the pass's order."""
    if request.state != RequestState.QUEUED:
        return None
    rank = request.priority_class.rank
    ahead = QueuedRequest.objects.filter(state=RequestState.QUEUED).filter(
        Q(priority_class__rank__gt=rank)
        | Q(priority_class__rank=rank, created_at__lt=request.created_at)
        | Q(priority_class__rank=rank, created_at=request.created_at, id__lt=request.pk)
    )
    return ahead.count() + 1


def estimated_start(request: QueuedRequest, *, now: datetime | None = None) -> datetime | None:
    """The earliest window of its length the booked calendar leaves free (the queue ahead is not counted)."""
    if request.state != RequestState.QUEUED:
        return None
    now = now or timezone.now()
    duration = timedelta(seconds=request.duration_seconds)
    found = earliest_window(spec_of(request), duration=duration, within=EARLIEST_WITHIN + duration, now=now)
    return None if found is None else found[0].starts_at
