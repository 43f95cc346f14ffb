"""Reads: what a caller may see, what is free, when it will be, and who holds what over time."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Exists, F, OuterRef, Q, QuerySet

from controlplane.accounts.models import Membership, Project
from controlplane.accounts.selectors import is_operator, projects_visible_to
from controlplane.core import rows
from controlplane.inventory.choices import EventKind, GpuHealth, ServerState
from controlplane.inventory.models import Gpu, GpuModel, Server, ServerEvent
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.placement import GpuSlot, ServerCandidate, place
from controlplane.reservations.specs import GpuSpec, Window


def reservations_visible_to(user: Any) -> QuerySet[Reservation]:
    return Reservation.objects.filter(project__in=projects_visible_to(user))


def spec_q(spec: GpuSpec, prefix: str = "") -> Q:
    """A GPU of the spec's model, or with at least its memory, whatever its health (``prefix``: the path to
    the GPU from another model, e.g. ``"gpus__"`` from a server)."""
    if spec.gpu_model_id is not None:
        return Q(**{f"{prefix}model_id": spec.gpu_model_id})
    return Q(**{f"{prefix}memory_mib__gte": spec.min_memory_mib})


def usable_whole_q(prefix: str = "") -> Q:
    """A GPU that can be used whole: not in MIG mode. CUDA sees a GPU whose MIG mode is on only through its
    MIG devices, so such a GPU is booked by its slices (reservations/mig.py), never whole. A GPU that cannot
    do MIG (``mig`` null), has it off, or whose report names no mode is usable whole."""
    return ~Q(**{f"{prefix}mig__current": True}) | Q(**{f"{prefix}mig__current__isnull": True})


def gpu_matches(spec: GpuSpec, prefix: str = "") -> Q:
    """The one definition of a GPU that matches a booking's spec: healthy, usable whole (MIG mode off), and
    of its model or memory.

    Placement, the earliest-window search and capacity all use it; the hand-written candidate reads below
    compile it to SQL (``_match_sql``) rather than spelling it again. The capacity summary's triggers
    (migrations 0004 and 0007) count the GPUs it can match, per server and model."""
    return spec_q(spec, prefix) & Q(**{f"{prefix}health": GpuHealth.HEALTHY}) & usable_whole_q(prefix)


def placeable_gpus(spec: GpuSpec) -> QuerySet[Gpu]:
    """GPUs a booking may use: present on a ready server, healthy and matching the spec.

    For whole servers, all present GPUs of ready servers come back (the caller checks each server is whole).
    """
    qs = Gpu.objects.filter(server__state=ServerState.READY, present=True)
    if spec.whole_servers is None:
        qs = qs.filter(gpu_matches(spec))
    return qs


def overlapping(qs: QuerySet[Allocation], starts_at: datetime, ends_at: datetime) -> QuerySet[Allocation]:
    """Active allocations whose ``[starts_at, ends_at)`` meets the given half-open window."""
    return qs.filter(active=True, starts_at__lt=ends_at, ends_at__gt=starts_at)


def _busy_exists(starts_at: datetime, ends_at: datetime) -> Exists:
    return Exists(overlapping(Allocation.objects.filter(gpu_id=OuterRef("pk")), starts_at, ends_at))


@dataclass(frozen=True)
class _ServerCount:
    id: int
    hostname: str
    present: int  # GPUs present on the server
    matching: int  # of those, healthy and matching the spec
    free: int  # of those, free for the whole window


# The candidate reads are written as SQL: they run on every booking, and building them through the ORM cost
# several times what the database spends answering them. The GPU table is named, not aliased, so that the
# matching predicate compiled from ``gpu_matches`` (which names its columns by table) drops straight in.
_GPU = Gpu._meta.db_table
_SERVER = Server._meta.db_table
_ALLOCATION = Allocation._meta.db_table
_G = f'"{_GPU}"'
# Over the GPU row: an active allocation meets the window (parameters: its end, its start).
_BUSY_SQL = (
    f"EXISTS (SELECT 1 FROM {_ALLOCATION} a WHERE a.gpu_id = {_G}.id AND a.active "  # noqa: S608 - names from metadata
    "AND a.starts_at < %s AND a.ends_at > %s)"
)


def _match_sql(spec: GpuSpec) -> tuple[str, list[Any]]:
    """``gpu_matches(spec)`` as SQL over the GPU table, compiled by Django from the one definition."""
    query = Gpu.objects.filter(gpu_matches(spec)).query
    sql, params = query.where.as_sql(query.get_compiler(connection=connection), connection)
    return f"({sql})", list(params)


_WHOLE_SQL: dict[str, tuple[str, list[Any]]] = {}


def usable_whole_sql() -> tuple[str, list[Any]]:
    """``usable_whole_q()`` as SQL over the GPU table, compiled once per database backend: the booking's
    re-read under its locks (``services._reread``) checks it as placement did."""
    if connection.vendor not in _WHOLE_SQL:
        query = Gpu.objects.filter(usable_whole_q()).query
        sql, params = query.where.as_sql(query.get_compiler(connection=connection), connection)
        _WHOLE_SQL[connection.vendor] = (f"({sql})", list(params))
    return _WHOLE_SQL[connection.vendor]


def _window_params(window: Window) -> list[Any]:
    """The bounds for ``_BUSY_SQL``, as the database stores them (SQLite keeps instants as text)."""
    adapt = connection.ops.adapt_datetimefield_value
    return [adapt(window.ends_at), adapt(window.starts_at)]


def _server_counts(spec: GpuSpec, window: Window) -> list[_ServerCount]:
    """One aggregate query: per ready server, how many GPUs match and how many of those are free."""
    match, match_params = _match_sql(spec)
    # A GPU count only looks at matching GPUs (placeable_gpus); whole servers at every present one.
    only_matching = f" AND {match}" if spec.whole_servers is None else ""
    sql = (
        f"SELECT {_G}.server_id, s.hostname, COUNT(*), SUM(CASE WHEN {match} THEN 1 ELSE 0 END), "  # noqa: S608 - fixed SQL; values are parameters
        f"SUM(CASE WHEN {match} AND NOT {_BUSY_SQL} THEN 1 ELSE 0 END) "
        f"FROM {_G} INNER JOIN {_SERVER} s ON s.id = {_G}.server_id "
        f"WHERE {_G}.present AND s.state = %s{only_matching} GROUP BY {_G}.server_id, s.hostname"
    )
    params = [*match_params, *match_params, *_window_params(window), ServerState.READY.value]
    if only_matching:
        params += match_params
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    return [_ServerCount(sid, host, present, matching, free) for sid, host, present, matching, free in found]


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
    match, match_params = _match_sql(spec)
    ids = [c.id for c in servers]
    sql = (
        f'SELECT {_G}.id, {_G}.server_id, {_G}."index", {_G}.numa_node, {_G}.nvlink_peers, {_G}.uuid '  # noqa: S608 - fixed SQL; values are parameters
        # The servers come back in the given order below; only the GPUs' order within one is the query's.
        f"FROM {_G} WHERE {_G}.present AND {_G}.server_id IN ({', '.join(['%s'] * len(ids))}) AND {match} "
        f'AND NOT {_BUSY_SQL} ORDER BY {_G}.server_id, {_G}."index"'
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*ids, *match_params, *_window_params(window)])
        found = cursor.fetchall()
    by_server: dict[int, list[tuple[int, int, int | None, list[str], str]]] = defaultdict(list)
    for gid, sid, index, numa, peers, uuid in found:
        # Both backends hand JSON back as text here (Django loads it in JSONField.from_db_value).
        by_server[sid].append((gid, index, numa, (json.loads(peers) if isinstance(peers, str) else peers) or [], uuid))
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
    if shortlist is not None:
        fitting = _fitting_from_summary(spec, window, shortlist)
        if fitting is not None:
            return _build(spec, window, fitting)
    return _build(spec, window, _shortlist(spec, _server_counts(spec, window), shortlist))


# Over the active allocations that meet the window, through the GiST index on their periods, which holds
# their server and GPU ids (migrations 0004, 0007): the busy GPUs per server, read from that index alone.
_SUMMARY_SQL = f"""
    WITH busy AS (
        SELECT a.server_id, COUNT(DISTINCT a.gpu_id) AS n
        FROM {_ALLOCATION} a
        WHERE a.active AND tstzrange(a.starts_at, a.ends_at, '[)') && tstzrange(%s, %s, '[)')
        GROUP BY a.server_id
    ),
    held AS (
        -- Every summary row of each busy server: its GPU rows of any model and state (gpus), and the
        -- present, healthy ones of the spec's model usable whole, MIG mode off (healthy, null unless the
        -- server is ready and has some).
        SELECT b.server_id, b.n, MAX(c.hostname) AS hostname, SUM(c.gpus) AS gpus,
               MAX(c.healthy) FILTER (WHERE c.model_id = %s AND c.ready) AS healthy
        FROM busy b INNER JOIN reservations_server_capacity c ON c.server_id = b.server_id
        GROUP BY b.server_id, b.n
    ),
    counted AS (
        SELECT h.server_id, h.hostname, h.healthy, h.healthy - CASE
            -- Every GPU on the server is present, healthy, whole and of the model: each busy one matches.
            WHEN h.gpus = h.healthy THEN h.n
            -- Otherwise its matching GPUs are read, and those that are busy counted.
            ELSE (SELECT COUNT(*) FROM {_G} WHERE {_G}.server_id = h.server_id AND {_G}.present AND {{match}}
                  AND EXISTS (SELECT 1 FROM {_ALLOCATION} a WHERE a.gpu_id = {_G}.id AND a.active
                              AND a.starts_at < %s AND a.ends_at > %s))
        END AS free
        FROM held h WHERE h.healthy IS NOT NULL
    ),
    fit AS (
        SELECT server_id, hostname, healthy, free FROM counted WHERE free >= %s
        UNION ALL
        (SELECT c.server_id, c.hostname, c.healthy, c.healthy FROM reservations_server_capacity c
         WHERE c.ready AND c.model_id = %s AND c.healthy >= %s
           AND c.server_id NOT IN (SELECT server_id FROM busy)
         ORDER BY c.healthy, c.hostname LIMIT %s)
    )
    -- The hostnames compare as Python compares them (the column's collation is "C").
    (SELECT server_id, hostname, healthy, free, NULL::integer FROM fit ORDER BY free, hostname LIMIT %s)
    UNION ALL
    -- Last: the most matching GPUs on one server, to tell whether the count fits one at all.
    SELECT NULL, NULL, NULL, NULL, MAX(healthy) FROM reservations_server_capacity
    WHERE ready AND model_id = %s
"""  # noqa: S608 - names from metadata and the compiled predicate; values are parameters


def _fitting_from_summary(spec: GpuSpec, window: Window, limit: int) -> list[_ServerCount] | None:
    """PostgreSQL, a count of GPUs of one model: ``_shortlist(spec, _server_counts(spec, window), limit)``
    read without looking at every server. None when this read does not apply; the caller reads the GPUs.

    A server holding no allocation in the window has all its matching GPUs free, which the summary of
    capacity per server and model counts (migration 0004); so the best-fitting of those are the first few
    in the summary's (count, hostname) order, and only the servers with an allocation in the window, found
    from the allocations' side, have their free GPUs counted. Each allocation names its GPU's server
    (migration 0007), so those are counted per server from the allocations alone where the summary shows
    every GPU row of the server present, healthy and of the model (then each busy GPU matches); a server
    with any other GPU has its matching GPUs read instead. The shortlist's order, (free - count,
    hostname), then picks from both exactly as it would from every server."""
    if connection.vendor != "postgresql" or spec.gpu_model_id is None or spec.whole_servers is not None:
        return None
    count = spec.gpu_count or 1
    match, match_params = _match_sql(spec)
    start, end = _window_params(window)[::-1]
    model = spec.gpu_model_id
    params = [start, end, model, *match_params, end, start, count, model, count, limit, limit, model]
    with connection.cursor() as cursor:
        cursor.execute(_SUMMARY_SQL.format(match=match), params)
        found = cursor.fetchall()
    largest = next((row[4] for row in found if row[0] is None), None) or 0
    if count > largest:
        return None  # several servers' GPUs together, or none at all: the general read decides
    counts = [_ServerCount(sid, host, n, n, free) for sid, host, n, free, _ in found if sid is not None]
    return sorted(counts, key=lambda c: (c.free - count, c.hostname))[:limit]


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


def booking_proposal(spec: GpuSpec, window: Window) -> list[int] | None:
    """The GPUs a booking of ``spec`` over ``window`` made now would get: the very reads and rule booking runs
    first (``candidate_servers`` with its shortlist, then ``place``), without locking or writing anything."""
    return place(candidate_servers(spec, window), gpu_count=spec.gpu_count, whole_servers=spec.whole_servers)


@dataclass(frozen=True)
class Unavailable:
    reason: str  # draining, maintenance, offline, commissioning, unhealthy
    detail: str  # the operator's reason for the server's state, or the GPU's health reasons


def unavailability(gpus: list[Gpu]) -> dict[int, Unavailable]:
    """Why each of ``gpus`` (loaded with their server) cannot be booked now; GPUs that can are left out.

    A server that is not ready makes every GPU on it unavailable, with the reason its last state change gave;
    otherwise an unhealthy GPU is, with its health reasons. Booking looks at the same facts (``placeable_gpus``).
    """
    not_ready = {g.server_id for g in gpus if g.server.state != ServerState.READY}
    why: dict[int, str] = {}
    if not_ready:
        for server_id, reason in (
            ServerEvent.objects.filter(server_id__in=not_ready, kind=EventKind.STATE)
            .order_by("server_id", "-at", "-id")
            .values_list("server_id", "reason")
        ):
            why.setdefault(server_id, reason)
    out: dict[int, Unavailable] = {}
    for gpu in gpus:
        if gpu.server_id in not_ready:
            out[gpu.pk] = Unavailable(gpu.server.state, why.get(gpu.server_id, ""))
        elif gpu.health != GpuHealth.HEALTHY:
            reasons = gpu.health_reasons if isinstance(gpu.health_reasons, list) else []
            out[gpu.pk] = Unavailable("unhealthy", "; ".join(str(r) for r in reasons))
    return out


@dataclass(frozen=True)
class Segment:
    gpu_id: int
    starts_at: datetime
    ends_at: datetime
    reservation_id: int
    project_id: int
    active: bool
    yielding: bool = False  # held by a preemptible reservation: a non-preemptible booking may take it


def timeline(*, gpus: QuerySet[Gpu], starts_at: datetime, ends_at: datetime) -> dict[int, list[Segment]]:
    """Per GPU, who held it over ``[starts_at, ends_at)``: active allocations, and past ones up to release."""
    qs = (
        Allocation.objects.filter(gpu__in=gpus, starts_at__lt=ends_at, ends_at__gt=starts_at)
        .filter(Q(active=True) | Q(released_at__gt=F("starts_at")))
        .values_list(
            "gpu_id",
            "starts_at",
            "ends_at",
            "released_at",
            "active",
            "reservation_id",
            "reservation__project_id",
            "reservation__preemptible",
        )
        .order_by("gpu_id", "starts_at")
    )
    out: dict[int, list[Segment]] = defaultdict(list)
    for gpu_id, a, b, released_at, active, reservation_id, project_id, preemptible in qs:
        end = b if active or released_at is None else min(b, released_at)
        out[gpu_id].append(Segment(gpu_id, a, end, reservation_id, project_id, active, preemptible))
    return out


@dataclass(frozen=True)
class BookingTarget:
    project: Project
    role: str | None  # the caller's role in the project; None for an operator who is not a member
    gpu_model: GpuModel | None  # the GPU model of that exact name (id and name); None when none was named or found


def booking_target(user: Any, *, slug: str, gpu_model: str | None) -> BookingTarget | None:
    """The project a booking names, as the caller sees it, with the caller's role and the GPU model named:
    one read for what the booking's request needs before it is placed. None when the caller cannot see
    the project (not a member, and not an operator) or it does not exist."""
    sql = (
        f"SELECT p.id, p.name, p.slug, (SELECT m.role FROM {Membership._meta.db_table} m "  # noqa: S608 - names from metadata
        "WHERE m.project_id = p.id AND m.user_id = %s), "
        f"(SELECT gm.id FROM {GpuModel._meta.db_table} gm WHERE gm.name = %s) "
        f"FROM {Project._meta.db_table} p WHERE p.slug = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [user.pk, gpu_model, slug])
        row = cursor.fetchone()
    if row is None:
        return None
    pk, name, found_slug, role, model_id = row
    if role is None and not is_operator(user):
        return None
    project = rows.loaded(Project, {"id": pk, "name": name, "slug": found_slug})
    model = None if model_id is None else rows.loaded(GpuModel, {"id": model_id, "name": gpu_model})
    return BookingTarget(project, role, model)
