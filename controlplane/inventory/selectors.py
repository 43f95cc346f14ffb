"""Reads of the inventory that other apps build on."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu, Server


def placeable_gpus() -> QuerySet[Gpu]:
    """GPUs a reservation may be placed on: healthy, present, on a ready server."""
    return Gpu.objects.filter(health=GpuHealth.HEALTHY, present=True, server__state=ServerState.READY)


def servers_visible_to_tenants() -> QuerySet[Server]:
    """Tenants see the live fleet (for availability), not servers that left it."""
    return Server.objects.exclude(state=ServerState.RETIRED)


def _holding(gpu_ids: Iterable[int] | None = None, server: Server | None = None, *, now: datetime) -> QuerySet[Any]:
    # Reservations live in an app above the inventory: imported here, when asked.
    from controlplane.reservations.choices import HOLDING_STATES
    from controlplane.reservations.models import Allocation

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


# A power reading older than this is not "drawn now": the agent reports every few seconds.
POWER_FRESH_S = 60.0


def server_power(server: Server, gpus: list[Gpu], *, now: datetime | None = None) -> dict[str, object]:
    """The power a server draws now (its present GPUs' fresh ``DCGM_FI_DEV_POWER_USAGE`` readings) against its
    rated power: ``rated_power_w`` when the operator gave it, else the sum of its GPUs' TDPs (None when one
    of them is unknown: a partial sum would understate it). ``gpus`` as loaded with their models; no query."""
    now = now or timezone.now()
    present = [g for g in gpus if g.present]
    fresh = [
        float(g.telemetry["DCGM_FI_DEV_POWER_USAGE"])
        for g in present
        if g.telemetry_at is not None
        and (now - g.telemetry_at).total_seconds() <= POWER_FRESH_S
        and isinstance(g.telemetry.get("DCGM_FI_DEV_POWER_USAGE"), int | float)
    ]
    rated: int | None = server.rated_power_w
    if rated is None and present:
        watts = [g.model.rated_watts for g in present]
        rated = None if any(w is None for w in watts) else sum(w for w in watts if w is not None)
    drawn = round(sum(fresh), 1) if fresh else None
    return {
        "drawn_w": drawn,
        "rated_w": rated,
        "share": round(drawn / rated, 4) if drawn is not None and rated else None,
        "gpus_reporting": len(fresh),
    }
