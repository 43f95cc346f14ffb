"""Reads: what a caller may see, what is free, when it will be, and who holds what over time."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import BooleanField, Count, Exists, ExpressionWrapper, F, OuterRef, Q, QuerySet
from django.utils.dateparse import parse_datetime

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


EARLIEST_FIRST_STAGE = timedelta(days=1)


@dataclass
class _Fleet:
    """What one search query tells about the candidate GPUs: per server its GPUs (id, matching), and per
    GPU the stretches in which a window may start (epoch seconds; none: busy throughout)."""

    hostnames: dict[int, str]
    servers: dict[int, list[tuple[int, bool]]]
    starts: dict[int, list[tuple[float, float]]]
    seen: set[int]
    exact: dict[float, Any]  # allocation end (epoch) -> the stored value, to start at that instant exactly


def _gap_rows(spec: GpuSpec, *, now: datetime, last_start: datetime, duration: timedelta) -> list[tuple[Any, ...]]:
    """One query: every candidate GPU with its server, and the allocations that bound a gap long enough
    for the window (and each GPU's last one), with the neighbours worked out by LAG/LEAD in the database.

    The allocations are restricted to the horizon through the active-period index, and the timestamps are
    turned into epoch seconds only for the rows that come back: a small part of them for a long window."""
    gpus_sql, gpus_params = (
        placeable_gpus(spec)
        .annotate(m=ExpressionWrapper(_matches_q(spec), output_field=BooleanField()))
        .order_by()
        .values(c_gpu=F("id"), c_server=F("server_id"), c_host=F("server__hostname"), c_match=F("m"))
        .query.sql_with_params()
    )
    ops = connection.ops
    horizon_end = ops.adapt_datetimefield_value(last_start + duration)
    start = ops.adapt_datetimefield_value(now)
    t0, d = now.timestamp(), duration.total_seconds()
    if connection.vendor == "postgresql":

        def epoch(col: str) -> str:
            return f"EXTRACT(EPOCH FROM {col})::float8"

        def text(col: str) -> str:
            return f"{col}::text"

        greatest = "GREATEST"
    else:

        def epoch(col: str) -> str:
            return f"((julianday({col}) - 2440587.5) * 86400.0)"

        def text(col: str) -> str:
            return col

        greatest = "MAX"
    # The instants come back as text too: parsing tens of thousands of timestamps costs more than the
    # search, and only the one the answer starts at is ever parsed.
    sql = f"""
        SELECT x.gpu_id, x.server_id, x.hostname, x.m, {epoch("x.a")}, {epoch("x.b")}, {epoch("x.prev_b")},
               x.next_a IS NULL, {text("x.b")}, {text("x.prev_b")}
        FROM (
            SELECT g.c_gpu AS gpu_id, g.c_server AS server_id, g.c_host AS hostname, g.c_match AS m,
                   al.starts_at AS a, al.ends_at AS b,
                   LAG(al.ends_at) OVER w AS prev_b, LEAD(al.starts_at) OVER w AS next_a
            FROM ({gpus_sql}) g
            LEFT JOIN reservations_allocation al
              ON al.gpu_id = g.c_gpu AND al.active AND al.starts_at < %s AND al.ends_at > %s
            WINDOW w AS (PARTITION BY g.c_gpu ORDER BY al.starts_at)
        ) x
        WHERE x.a IS NULL OR x.next_a IS NULL
           OR {epoch("x.a")} >= {greatest}(COALESCE({epoch("x.prev_b")}, %s), %s) + %s
    """  # noqa: S608 - the only interpolated SQL is the ORM's own and fixed expressions; values are parameters
    with connection.cursor() as cursor:
        cursor.execute(sql, [*gpus_params, horizon_end, start, t0, t0, d])
        return cursor.fetchall()


def _fleet(rows: list[tuple[Any, ...]], *, now: datetime, last_start: datetime, duration: timedelta) -> _Fleet:
    d = duration.total_seconds()
    t0, t_last = now.timestamp(), last_start.timestamp()
    fleet = _Fleet({}, defaultdict(list), defaultdict(list), set(), {})
    servers, hostnames, starts, seen, exact = fleet.servers, fleet.hostnames, fleet.starts, fleet.seen, fleet.exact
    for gpu_id, server_id, hostname, m, a, b, prev_b, last, raw_b, raw_prev_b in rows:
        if gpu_id not in seen:
            seen.add(gpu_id)
            servers[server_id].append((gpu_id, bool(m)))
            hostnames[server_id] = hostname
            if a is None:
                starts[gpu_id] = [(t0, t_last)]  # no allocation in the horizon: free throughout
                continue
        if prev_b is None or prev_b < t0:
            gap_start = t0
        else:
            gap_start = prev_b
            exact[prev_b] = raw_prev_b
        if a - d >= gap_start and gap_start <= t_last:
            starts[gpu_id].append((gap_start, min(a - d, t_last)))
        if last:
            tail = b if b > t0 else t0
            if tail <= t_last:
                starts[gpu_id].append((tail, t_last))
                exact[b] = raw_b
    return fleet


def _starts_possible(fleet: _Fleet, gpu_id: int) -> list[tuple[float, float]]:
    return fleet.starts.get(gpu_id, [])


def _earliest_start(spec: GpuSpec, fleet: _Fleet, *, t0: float, t_last: float) -> float | None:
    """The first instant in ``[t0, t_last]`` at which the spec fits, as epoch seconds, or None: per GPU the
    stretches in which a window could start, and a sweep per server for the first instant enough overlap."""

    def starts(gid: int) -> list[tuple[float, float]]:
        return _starts_possible(fleet, gid)

    servers = fleet.servers
    if spec.whole_servers is not None:
        full: list[tuple[float, float]] = []
        for gpus in servers.values():
            if all(m for _, m in gpus):
                full.extend(coverage([iv for gid, _ in gpus for iv in starts(gid)], len(gpus)))
        stretches = coverage(full, spec.whole_servers)
        return stretches[0][0] if stretches else None
    count = spec.gpu_count or 1
    largest = max(sum(1 for _, m in gpus if m) for gpus in servers.values())
    if count > largest:
        stretches = coverage([iv for gpus in servers.values() for gid, m in gpus if m for iv in starts(gid)], count)
        return stretches[0][0] if stretches else None
    best: float | None = None
    for gpus in servers.values():
        matching = [gid for gid, m in gpus if m]
        if len(matching) < count:
            continue
        stretches = coverage([iv for gid in matching for iv in starts(gid)], count)
        if stretches and (best is None or stretches[0][0] < best):
            best = stretches[0][0]
    return best


def _counts_at(fleet: _Fleet, t: float, *, t0: float, t_last: float) -> list[_ServerCount]:
    """What _server_counts() reads from the database, worked out from the search's own rows at ``t``."""
    out = []
    for sid, gpus in fleet.servers.items():
        matching = [gid for gid, m in gpus if m]
        free = sum(1 for gid in matching if any(a <= t <= b for a, b in _starts_possible(fleet, gid)))
        out.append(_ServerCount(sid, fleet.hostnames[sid], len(gpus), len(matching), free))
    return out


def _exact_start(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = parse_datetime(str(value))
    assert parsed is not None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def earliest_window(
    spec: GpuSpec, *, duration: timedelta, within: timedelta, now: datetime
) -> tuple[Window, list[int]] | None:
    """The earliest ``[t, t + duration)`` inside ``[now, now + within]`` that the placement rule can fill.

    First the cheap case, "now". Otherwise one query returns every candidate GPU with the allocations that
    bound its long-enough gaps (first for
    the first day, then, if nothing fits there, for the whole horizon); per GPU the stretches in which a
    window could start; a sweep per server for the first instant at which enough overlap. The free counts
    at that instant come from the same rows, and the placement reads the topology of the shortlisted
    servers only, re-checking in SQL that their GPUs are free, so booking the answer gets those GPUs.
    """
    horizon_end = now + within
    if horizon_end - duration < now:
        return None
    # The cheap case first: "now", which is what a booking made now would get.
    proposal = place(
        candidate_servers(spec, Window(now, now + duration)), gpu_count=spec.gpu_count, whole_servers=spec.whole_servers
    )
    if proposal is not None:
        return Window(now, now + duration), proposal
    last = now + within - duration
    t0 = now.timestamp()
    # Most answers lie close to now: search the first day before reading the whole horizon's allocations.
    for stage_last in sorted({min(now + EARLIEST_FIRST_STAGE, last), last}):
        rows = _gap_rows(spec, now=now, last_start=stage_last, duration=duration)
        if not rows:
            return None
        fleet = _fleet(rows, now=now, last_start=stage_last, duration=duration)
        t_last = stage_last.timestamp()
        best = _earliest_start(spec, fleet, t0=t0, t_last=t_last)
        if best is not None:
            break
    else:
        return None
    # ``best`` is now or the end of some allocation; take that instant exactly rather than a float's rounding.
    start = now if best == t0 or fleet.exact.get(best) is None else _exact_start(fleet.exact[best])
    window = Window(start, start + duration)
    counts = _counts_at(fleet, best, t0=t0, t_last=t_last)
    servers = _build(spec, window, _shortlist(spec, counts, SHORTLIST))
    proposal = place(servers, gpu_count=spec.gpu_count, whole_servers=spec.whole_servers)
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
