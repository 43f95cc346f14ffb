"""Reads: what a caller may see, what is free, when it will be, and who holds what over time."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet

from controlplane.accounts.selectors import projects_visible_to
from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.placement import GpuSlot, ServerCandidate, place
from controlplane.reservations.specs import GpuSpec, Window


def reservations_visible_to(user: Any) -> QuerySet[Reservation]:
    return Reservation.objects.filter(project__in=projects_visible_to(user))


def _spec_q(spec: GpuSpec, prefix: str = "") -> Q:
    if spec.gpu_model_id is not None:
        return Q(**{f"{prefix}model_id": spec.gpu_model_id})
    return Q(**{f"{prefix}memory_mib__gte": spec.min_memory_mib})


def placeable_gpus(spec: GpuSpec) -> QuerySet[Gpu]:
    """GPUs a booking may use: present on a ready server, healthy and matching the spec.

    For whole servers, all present GPUs of ready servers come back (the caller checks each server is whole).
    """
    qs = Gpu.objects.filter(server__state=ServerState.READY, present=True)
    if spec.whole_servers is None:
        qs = qs.filter(_spec_q(spec), health=GpuHealth.HEALTHY)
    return qs


def overlapping(qs: QuerySet[Allocation], starts_at: datetime, ends_at: datetime) -> QuerySet[Allocation]:
    """Active allocations whose ``[starts_at, ends_at)`` meets the given half-open window."""
    return qs.filter(active=True, starts_at__lt=ends_at, ends_at__gt=starts_at)


def _matches_q(spec: GpuSpec) -> Q:
    return _spec_q(spec) & Q(health=GpuHealth.HEALTHY)


def _busy_exists(starts_at: datetime, ends_at: datetime) -> Exists:
    return Exists(overlapping(Allocation.objects.filter(gpu_id=OuterRef("pk")), starts_at, ends_at))


@dataclass(frozen=True)
class _ServerCount:
    id: int
    hostname: str
    present: int  # GPUs present on the server
    matching: int  # of those, healthy and matching the spec
    free: int  # of those, free for the whole window


def _server_counts(spec: GpuSpec, window: Window) -> list[_ServerCount]:
    """One aggregate query: per ready server, how many GPUs match and how many of those are free."""
    matches = _matches_q(spec)
    rows = (
        placeable_gpus(spec)
        .values("server_id", "server__hostname")
        .annotate(
            present=Count("id"),
            matching=Count("id", filter=matches),
            free=Count("id", filter=matches & ~Q(_busy_exists(window.starts_at, window.ends_at))),
        )
        .order_by()
    )
    return [_ServerCount(r["server_id"], r["server__hostname"], r["present"], r["matching"], r["free"]) for r in rows]


def _shortlist(spec: GpuSpec, counts: list[_ServerCount], limit: int | None) -> list[_ServerCount]:
    """The servers placement needs to see: for a count that fits one server, the best-fitting few."""
    if spec.whole_servers is not None:
        return [c for c in counts if c.free == c.present > 0]
    count = spec.gpu_count or 1
    largest = max((c.matching for c in counts), default=0)
    if limit is None or count > largest:
        return [c for c in counts if c.free > 0]
    fitting = sorted((c for c in counts if c.free >= count), key=lambda c: (c.free - count, c.hostname))
    return fitting[:limit]


def _build(spec: GpuSpec, window: Window, servers: list[_ServerCount]) -> list[ServerCandidate]:
    """The shortlisted servers with the topology of their free matching GPUs (one query)."""
    if not servers:
        return []
    rows = (
        Gpu.objects.filter(server_id__in=[c.id for c in servers], present=True)
        .filter(_matches_q(spec))
        .exclude(_busy_exists(window.starts_at, window.ends_at))
        .values_list("id", "server_id", "index", "numa_node", "nvlink_peers", "uuid")
    )
    by_server: dict[int, list[tuple[int, int, int | None, list[str], str]]] = defaultdict(list)
    for gid, sid, index, numa, peers, uuid in rows:
        by_server[sid].append((gid, index, numa, peers or [], uuid))
    out = []
    for c in servers:
        gpus = by_server.get(c.id, [])
        ids_by_uuid = {uuid: gid for gid, _, _, _, uuid in gpus}
        free = tuple(
            GpuSlot(gid, index, numa, frozenset(ids_by_uuid[p] for p in peers if p in ids_by_uuid))
            for gid, index, numa, peers, _ in gpus
        )
        out.append(ServerCandidate(c.id, c.hostname, c.matching, free, whole=len(free) == c.present))
    return out


# Placement looks at the topology (NUMA, NVLink) of this many best-fitting servers only, so a booking reads
# a few dozen GPU rows in full rather than the whole fleet.
SHORTLIST = 16


def candidate_servers(spec: GpuSpec, window: Window, *, shortlist: int | None = SHORTLIST) -> list[ServerCandidate]:
    """Servers with matching GPUs free for the whole window: two queries whatever the fleet size.

    With ``shortlist`` (the default), a GPU count that fits one server sees only the best-fitting servers,
    which is all the placement rule picks from; ``None`` returns every server with a free matching GPU.
    """
    return _build(spec, window, _shortlist(spec, _server_counts(spec, window), shortlist))


@dataclass(frozen=True)
class FreeSummary:
    free_gpus: int
    servers: list[ServerCandidate]
    proposal: list[int] | None  # the GPUs a booking made now would get


def free_for(spec: GpuSpec, window: Window) -> FreeSummary:
    servers = [s for s in candidate_servers(spec, window, shortlist=None) if s.free]
    return FreeSummary(
        sum(len(s.free) for s in servers),
        servers,
        place(servers, gpu_count=spec.gpu_count, whole_servers=spec.whole_servers),
    )


@dataclass(frozen=True)
class Segment:
    gpu_id: int
    starts_at: datetime
    ends_at: datetime
    reservation_id: int
    project_id: int
    active: bool


def timeline(*, gpus: QuerySet[Gpu], starts_at: datetime, ends_at: datetime) -> dict[int, list[Segment]]:
    """Per GPU, who held it over ``[starts_at, ends_at)``: active allocations, and past ones up to release."""
    qs = (
        Allocation.objects.filter(gpu__in=gpus, starts_at__lt=ends_at, ends_at__gt=starts_at)
        .filter(Q(active=True) | Q(released_at__gt=F("starts_at")))
        .values_list(
            "gpu_id", "starts_at", "ends_at", "released_at", "active", "reservation_id", "reservation__project_id"
        )
        .order_by("gpu_id", "starts_at")
    )
    out: dict[int, list[Segment]] = defaultdict(list)
    for gpu_id, a, b, released_at, active, reservation_id, project_id in qs:
        end = b if active or released_at is None else min(b, released_at)
        out[gpu_id].append(Segment(gpu_id, a, end, reservation_id, project_id, active))
    return out
