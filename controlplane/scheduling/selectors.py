from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from controlplane.accounts.choices import BOOKING_ROLES
from controlplane.accounts.selectors import is_operator, projects_visible_to
from controlplane.inventory.models import GpuModel
from controlplane.reservations import capacity
from controlplane.reservations.capacity import EARLIEST_WITHIN
from controlplane.reservations.windows import earliest_window
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.fairshare import FairShare, fair_shares
from controlplane.scheduling.models import PriorityClass, QueuedRequest
from controlplane.scheduling.order import Entry, asked_words, ordered_queue
from controlplane.scheduling.services import spec_of


def requests_visible_to(user: Any) -> QuerySet[QueuedRequest]:
    """The requests of the projects ``user`` belongs to (every request for an operator)."""
    return QueuedRequest.objects.filter(project__in=projects_visible_to(user))


def priority_classes() -> QuerySet[PriorityClass]:
    """Every class, the most urgent first (the order the pass serves them)."""
    return PriorityClass.objects.order_by("-rank", "name")


def classes_allowed_to(user: Any) -> set[int] | None:
    """The ids of the restricted classes ``user`` may submit in for at least one project (owner or member: a
    viewer cannot submit at all), in one query over the grants; None for an operator, who may use any."""
    if is_operator(user):
        return None
    if not user or not user.is_authenticated:
        return set()
    grants = PriorityClass.allowed_policies.through.objects.filter(
        quotapolicy__project__memberships__user=user, quotapolicy__project__memberships__role__in=BOOKING_ROLES
    )
    return set(grants.values_list("priorityclass_id", flat=True))


def _place(request: QueuedRequest, queue: list[Entry]) -> int | None:
    return next((i for i, e in enumerate(queue) if e.id == request.pk), None)


def position(request: QueuedRequest, *, queue: list[Entry] | None = None, now: datetime | None = None) -> int | None:
    """1-based place in the queue, in the pass's order (class, fair share, first come); None unless queued."""
    if request.state != RequestState.QUEUED:
        return None
    queue = queue if queue is not None else ordered_queue(now=now or timezone.now())
    place = _place(request, queue)
    return None if place is None else place + 1


def _same_gpus(a: Any, b: Any) -> bool:
    """Asking for the same GPUs in the same unit (GPUs, or whole servers)."""
    same_kind = (a.whole_servers is None) == (b.whole_servers is None)
    return bool(same_kind and a.gpu_model_id == b.gpu_model_id and a.min_memory_mib == b.min_memory_mib)


def estimated_start(
    request: QueuedRequest, *, queue: list[Entry] | None = None, now: datetime | None = None
) -> datetime | None:
    """When it may start, approximately: the earliest window the booked calendar leaves it, plus the time the
    queued requests ahead of it asking for the same GPUs would take to drain from then, their GPU-seconds (or
    whole-server-seconds) spread over the matching fleet, as if they packed perfectly. Backfill may start it
    sooner; a later booking or a request that moves ahead of it, later."""
    if request.state != RequestState.QUEUED:
        return None
    now = now or timezone.now()
    spec = spec_of(request)
    duration = timedelta(seconds=request.duration_seconds)
    found = earliest_window(spec, duration=duration, within=EARLIEST_WITHIN + duration, now=now)
    if found is None:
        return None
    queue = queue if queue is not None else ordered_queue(now=now)
    place = _place(request, queue) or 0
    ahead = [e for e in queue[:place] if _same_gpus(e.spec, spec)]
    if not ahead:
        return found[0].starts_at
    fleet = max(capacity.fleet_count(spec).usable, 1)  # GPUs, or whole servers
    unit_seconds = sum((e.spec.whole_servers or e.spec.gpu_count or 1) * e.duration.total_seconds() for e in ahead)
    return found[0].starts_at + timedelta(seconds=unit_seconds / fleet)


def project_fair_share(project_id: int, *, now: datetime | None = None) -> FairShare:
    return fair_shares({project_id}, now=now or timezone.now())[project_id]


def operator_queue(*, now: datetime | None = None) -> list[dict[str, Any]]:
    """The whole queue across projects for operators: the queued requests in the pass's order, then the held
    ones (oldest first), each with the reason the last pass gave (a fixed number of queries, whatever the
    length of the queue)."""
    now = now or timezone.now()
    queue = ordered_queue(now=now)
    order = {e.id: i for i, e in enumerate(queue)}
    factors = {e.id: e.fair_share.factor for e in queue}
    rows = list(
        QueuedRequest.objects.filter(state__in=[RequestState.QUEUED, RequestState.HELD])
        .select_related("project", "priority_class", "blocked_by")
        .order_by("created_at", "id")
    )
    rows.sort(key=lambda r: (r.pk not in order, order.get(r.pk, 0)))
    names = dict(GpuModel.objects.values_list("id", "name"))
    return [
        {
            "position": order[r.pk] + 1 if r.pk in order else None,
            "id": r.public_id,
            "project": r.project.slug,
            "name": r.name,
            "priority_class": r.priority_class.name,
            "state": r.state,
            "spec": asked_words(spec_of(r), model_names=names),
            "duration_seconds": r.duration_seconds,
            "fair_share_factor": factors.get(r.pk),
            "reason": r.reason,
            "blocked_by": r.blocked_by.public_id if r.blocked_by else None,
            "blocked_until": r.blocked_until,
            "created_at": r.created_at,
        }
        for r in rows
    ]
