"""Who holds a GPU, now or later: the reservations behind the fleet's console (its GPUs' holders, a drain's
preview). Reservations own allocations, so these reads live here, not in the inventory below."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from controlplane.inventory.models import Server
from controlplane.reservations.choices import HOLDING_STATES
from controlplane.reservations.models import Allocation


def _holding(gpu_ids: Iterable[int] | None = None, server: Server | None = None, *, now: datetime) -> QuerySet[Any]:
    qs = Allocation.objects.filter(active=True, ends_at__gt=now, reservation__state__in=list(HOLDING_STATES))
    if gpu_ids is not None:
        qs = qs.filter(gpu_id__in=list(gpu_ids))
    if server is not None:
        qs = qs.filter(gpu__server=server)
    return qs.select_related("reservation__project", "gpu").order_by("starts_at", "gpu__index")


def _reservation_facts(allocation: Any) -> dict[str, Any]:
    r = allocation.reservation
    return {
        "reservation": r.public_id,
        "name": r.name,
        "project": r.project.slug,
        "project_name": r.project.name,
        "state": r.state,
        "starts_at": r.starts_at,
        "ends_at": r.ends_at,
    }


def gpus_in_use(*, gpu_ids: Iterable[int] | None = None, now: datetime | None = None) -> dict[int, dict[str, Any]]:
    """GPU id -> the reservation (and its project, the tenant) holding it at ``now``, in one query; operators
    see it on the fleet page."""
    now = now or timezone.now()
    out: dict[int, dict[str, Any]] = {}
    for allocation in _holding(gpu_ids, now=now).filter(starts_at__lte=now):
        out.setdefault(allocation.gpu_id, _reservation_facts(allocation))
    return out


def reservations_on_server(*, server: Server, now: datetime | None = None) -> list[dict[str, Any]]:
    """The reservations holding GPUs of ``server`` now or later (what a drain would leave in place), each with
    the indexes of its GPUs there, earliest first."""
    now = now or timezone.now()
    by_reservation: dict[int, dict[str, Any]] = {}
    for allocation in _holding(server=server, now=now):
        entry = by_reservation.get(allocation.reservation_id)
        if entry is None:
            entry = by_reservation[allocation.reservation_id] = {
                **_reservation_facts(allocation),
                "running": allocation.reservation.starts_at <= now,
                "gpus": [],
            }
        entry["gpus"].append(allocation.gpu.index)
    return list(by_reservation.values())


def gpus_holding(*, gpu_ids: Iterable[int], now: datetime | None = None) -> list[dict[str, Any]]:
    """The reservations holding any of these GPUs now or later, earliest first (what must end, or be moved,
    before the GPU can change underneath them)."""
    return [_reservation_facts(a) for a in _holding(gpu_ids, now=now or timezone.now())]


def member_gpu_hours(
    *, project_id: int, user_id: int, start: datetime, end: datetime, exclude_reservation_id: int | None = None
) -> Decimal:
    """GPU-hours the member's reservations in the project hold in [start, end): each allocation from its start
    to its end, or to its release when it was given back earlier (a cancelled booking holds nothing). The
    ledger's per-member cap reads it through ``ledger.budgets.member_gpu_hours``."""
    periods = Allocation.objects.filter(
        reservation__project_id=project_id,
        reservation__created_by_id=user_id,
        starts_at__lt=end,
        ends_at__gt=start,
    ).values_list("starts_at", "ends_at", "released_at")
    if exclude_reservation_id is not None:
        periods = periods.exclude(reservation_id=exclude_reservation_id)
    seconds = 0.0
    for begins, ends, released in periods:
        if released is not None:
            ends = min(ends, released)
        seconds += max(0.0, (min(ends, end) - max(begins, start)).total_seconds())
    return (Decimal(seconds) / 3600).quantize(Decimal("0.01"))


def reservations_asking_secret(project_id: int, name: str) -> list[str]:
    """The reservations of the project, not yet ended, whose container asks for the secret ``name`` (their ids)."""
    from controlplane.reservations.choices import FINAL_STATES
    from controlplane.reservations.models import Reservation

    live = (
        Reservation.objects.filter(project_id=project_id)
        .exclude(state__in=FINAL_STATES)
        .values_list("public_id", "secrets")
    )
    return [f"reservation {public_id}" for public_id, secrets in live if any(s.get("name") == name for s in secrets)]
