"""The ORM version of the candidate query (``selectors.candidate_servers`` before it became hand-written SQL),
kept as the reference that the equivalence tests compare the SQL against."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, Q

from controlplane.inventory.models import Gpu
from controlplane.reservations.placement import GpuSlot, ServerCandidate
from controlplane.reservations.selectors import (
    SHORTLIST,
    _busy_exists,
    _ServerCount,
    _shortlist,
    gpu_matches,
    placeable_gpus,
)
from controlplane.reservations.specs import GpuSpec, Window


def server_counts(spec: GpuSpec, window: Window) -> list[_ServerCount]:
    matches = gpu_matches(spec)
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


def build(spec: GpuSpec, window: Window, servers: list[_ServerCount]) -> list[ServerCandidate]:
    if not servers:
        return []
    rows = (
        Gpu.objects.filter(server_id__in=[c.id for c in servers], present=True)
        .filter(gpu_matches(spec))
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


def candidate_servers(spec: GpuSpec, window: Window, *, shortlist: int | None = SHORTLIST) -> list[ServerCandidate]:
    return build(spec, window, _shortlist(spec, server_counts(spec, window), shortlist))
