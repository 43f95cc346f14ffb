"""The earliest-window search as it was before it moved into one query per stage: the reference the
faster search must agree with (tests/reservations/test_earliest_equivalence.py)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import BooleanField, ExpressionWrapper, F, FloatField, Max, Q
from django.db.models.expressions import RawSQL, Value
from django.db.models.expressions import Window as Window_
from django.db.models.functions import Coalesce, Greatest, Lag, Lead

from controlplane.reservations.models import Allocation
from controlplane.reservations.placement import coverage, place
from controlplane.reservations.selectors import candidate_servers, gpu_matches, overlapping, placeable_gpus
from controlplane.reservations.specs import GpuSpec, Window


def _epoch(field: str) -> RawSQL:
    """Seconds since the epoch as a float, computed by the database: parsing 100,000 timestamps in Python
    costs more than the whole search."""
    column = f'"reservations_allocation"."{field}"'
    if connection.vendor == "postgresql":
        return RawSQL(f"EXTRACT(EPOCH FROM {column})::float8", [])  # noqa: S611 - no user input
    # Whole seconds plus the fraction as stored: julianday() is off by up to some ten microseconds.
    return RawSQL(f"CAST(strftime('%%s', {column}) AS INTEGER) + CAST(substr({column}, 20) AS REAL)", [])  # noqa: S611


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


def reference_earliest_window(
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
        .annotate(m=ExpressionWrapper(gpu_matches(spec), output_field=BooleanField()))
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
