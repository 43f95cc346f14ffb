"""Reads: what a caller may see, what is free, when it will be, and who holds what over time."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import BooleanField, Count, Exists, ExpressionWrapper, F, FloatField, Max, OuterRef, Q, QuerySet
from django.db.models.expressions import RawSQL, Value
from django.db.models.expressions import Window as Window_
from django.db.models.functions import Coalesce, Greatest, Lag, Lead

from controlplane.accounts.selectors import projects_visible_to
from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.placement import GpuSlot, ServerCandidate, coverage, place
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


def _epoch(field: str) -> RawSQL:
    """Seconds since the epoch as a float, computed by the database: parsing 100,000 timestamps in Python
    costs more than the whole search."""
    column = f'"reservations_allocation"."{field}"'
    if connection.vendor == "postgresql":
        return RawSQL(f"EXTRACT(EPOCH FROM {column})::float8", [])  # noqa: S611 - no user input
    return RawSQL(f"(julianday({column}) - 2440587.5) * 86400.0", [])  # noqa: S611


EARLIEST_FIRST_STAGE = timedelta(days=1)


def _earliest_start(
    spec: GpuSpec,
    servers: dict[int, list[tuple[int, bool]]],
    *,
    now: datetime,
    last_start: datetime,
    duration: timedelta,
) -> float | None:
    """The first instant in ``[now, last_start]`` at which the spec fits, as epoch seconds, or None."""
    if last_start < now:
        return None
    d = duration.total_seconds()
    t0, t_last = now.timestamp(), last_start.timestamp()
    # The database works out each allocation's neighbours and returns only the rows that bound a gap long
    # enough for the window (and each GPU's last one): on a busy fleet and a long window, a small part of
    # the allocations. A GPU with no row has no allocation in the horizon at all.
    per_gpu = Window_(expression=Lag("b"), partition_by=[F("gpu_id")], order_by=F("starts_at").asc())
    rows = (
        overlapping(Allocation.objects.filter(gpu__in=placeable_gpus(spec)), now, last_start + duration)
        .annotate(a=_epoch("starts_at"), b=_epoch("ends_at"))
        .annotate(
            prev_b=per_gpu,
            next_a=Window_(expression=Lead("a"), partition_by=[F("gpu_id")], order_by=F("starts_at").asc()),
        )
        .filter(
            Q(next_a__isnull=True)
            | Q(a__gte=Greatest(Coalesce(F("prev_b"), Value(t0)), Value(t0), output_field=FloatField()) + d)
        )
        .order_by()  # the model's default ordering would sort every row again, after the window
        .values_list("gpu_id", "a", "b", "prev_b", "next_a")
    )
    feasible: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for gpu_id, a, b, prev_b, next_a in rows:
        gap_start = t0 if prev_b is None else max(prev_b, t0)
        if a - d >= gap_start and gap_start <= t_last:
            feasible[gpu_id].append((gap_start, min(a - d, t_last)))
        if next_a is None and max(b, t0) <= t_last:
            feasible[gpu_id].append((max(b, t0), t_last))
    seen = {gpu_id for gpu_id, *_ in rows}

    def starts_possible(gpu_id: int) -> list[tuple[float, float]]:
        if gpu_id not in seen:
            return [(t0, t_last)]
        return feasible.get(gpu_id, [])

    if spec.whole_servers is not None:
        full: list[tuple[float, float]] = []
        for gpus in servers.values():
            if all(m for _, m in gpus):
                full.extend(coverage([iv for gid, _ in gpus for iv in starts_possible(gid)], len(gpus)))
        stretches = coverage(full, spec.whole_servers)
        return stretches[0][0] if stretches else None
    count = spec.gpu_count or 1
    largest = max(sum(1 for _, m in gpus if m) for gpus in servers.values())
    if count > largest:
        stretches = coverage(
            [iv for gpus in servers.values() for gid, m in gpus if m for iv in starts_possible(gid)], count
        )
        return stretches[0][0] if stretches else None
    best: float | None = None
    for gpus in servers.values():
        matching = [gid for gid, m in gpus if m]
        if len(matching) < count:
            continue
        stretches = coverage([iv for gid in matching for iv in starts_possible(gid)], count)
        if stretches and (best is None or stretches[0][0] < best):
            best = stretches[0][0]
    return best


def earliest_window(
    spec: GpuSpec, *, duration: timedelta, within: timedelta, now: datetime
) -> tuple[Window, list[int]] | None:
    """The earliest ``[t, t + duration)`` inside ``[now, now + within]`` that the placement rule can fill.

    First the cheap case, "now". Otherwise one query for the allocations of the candidate GPUs in the first
    day, then (if nothing fits) in the whole horizon, as epoch seconds; per GPU, the stretches in which a
    window could start (each free gap shortened by the duration); and a sweep per server for the first
    instant at which enough overlap. The answer goes through the same placement as a booking, so booking it
    right away gets those GPUs.
    """
    horizon_end = now + within
    if horizon_end - duration < now:
        return None
    proposal = place(
        candidate_servers(spec, Window(now, now + duration)), gpu_count=spec.gpu_count, whole_servers=spec.whole_servers
    )
    if proposal is not None:
        return Window(now, now + duration), proposal

    servers: dict[int, list[tuple[int, bool]]] = defaultdict(list)
    for gid, sid, healthy_match in (
        placeable_gpus(spec)
        .annotate(m=ExpressionWrapper(_matches_q(spec), output_field=BooleanField()))
        .values_list("id", "server_id", "m")
    ):
        servers[sid].append((gid, bool(healthy_match)))
    if not servers:
        return None
    # Most answers lie close to now: search the first day before reading the whole horizon's allocations.
    best: float | None = None
    last = now + within - duration
    for stage_last in sorted({min(now + EARLIEST_FIRST_STAGE, last), last}):
        best = _earliest_start(spec, servers, now=now, last_start=stage_last, duration=duration)
        if best is not None:
            break
    if best is None:
        return None
    # ``best`` is the end of some allocation; take that instant exactly rather than a float's rounding of it.
    exact = datetime.fromtimestamp(best, tz=UTC)
    start = (
        (
            Allocation.objects.filter(
                gpu__in=placeable_gpus(spec),
                active=True,
                ends_at__gte=exact - timedelta(milliseconds=5),
                ends_at__lte=exact + timedelta(milliseconds=5),
            ).aggregate(m=Max("ends_at"))["m"]
        )
        or exact
    )
    window = Window(start, start + duration)
    proposal = place(candidate_servers(spec, window), gpu_count=spec.gpu_count, whole_servers=spec.whole_servers)
    if proposal is None:  # an allocation landed meanwhile; the caller may ask again
        return None
    return window, proposal


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
