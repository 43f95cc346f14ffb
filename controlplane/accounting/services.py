"""Writes of the accounting app: usage records of finished reservations, and monthly statements.

A reservation's usage is recorded once, when it is final (the ledger has settled it in the same transaction
that made it final). The credits of its records are its ledger charge split by usage time and billing weight,
to the ten-thousandth of a credit, with the rounding remainder placed by the largest-remainder rule: the
slices of a reservation always add up to its charge exactly, so any report adds up to the ledger.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Sum
from django.utils import timezone

from controlplane.accounting.models import MONEY_PLACES, UsageRecord, UsageSlice
from controlplane.accounting.timeutil import split_by_hour
from controlplane.dispatch.models import Launch
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.reservations import costs
from controlplane.reservations.choices import FINAL_STATES
from controlplane.reservations.models import Allocation, Reservation, ReservationEvent

log = logging.getLogger(__name__)

ZERO = Decimal("0")
Interval = tuple[datetime, datetime]


def allocation_held(allocation: Allocation) -> Interval | None:
    """The period a GPU was really held: cut by an early release or an interruption; None if never held."""
    end = allocation.ends_at
    if allocation.released_at is not None and allocation.released_at < end:
        end = allocation.released_at
    return (allocation.starts_at, end) if end > allocation.starts_at else None


def launch_intervals(*, reservation: Reservation, until: datetime) -> dict[str, list[Interval]]:
    """Per GPU UUID, the periods its container ran as the agent reported them, inside the window.

    A launch with no stop reported (its server was lost) counts up to ``until``, when it was given up.
    Time outside the window is not charged: a container stopping in its grace period is our doing.
    """
    out: dict[str, list[Interval]] = defaultdict(list)
    for launch in Launch.objects.filter(reservation=reservation, started_at__isnull=False).order_by("id"):
        assert launch.started_at is not None  # filtered on started_at__isnull=False
        start = max(launch.started_at, reservation.starts_at)
        end = min(launch.finished_at or until, reservation.ends_at)
        if end > start:
            for uuid in launch.gpu_uuids:
                out[uuid].append((start, end))
    return out


def measured_gpu_seconds(*, reservation: Reservation, now: datetime | None = None) -> dict[str, float]:
    """GPU-seconds per GPU UUID measured from the launches: what ``reservation_finish`` should be given."""
    intervals = launch_intervals(reservation=reservation, until=now or timezone.now())
    return {uuid: sum((b - a).total_seconds() for a, b in spans) for uuid, spans in intervals.items()}


def split_exact(total: Decimal, weights: list[float], *, places: Decimal = MONEY_PLACES) -> list[Decimal]:
    """Split ``total`` in proportion to ``weights`` so the parts, each to ``places``, add up to it exactly."""
    if not weights:
        return []
    weight_sum = sum(weights)
    if weight_sum <= 0:
        weights, weight_sum = [1.0] * len(weights), float(len(weights))
    units = int((total / places).to_integral_value())
    raw = [Decimal(units) * Decimal(repr(w)) / Decimal(repr(weight_sum)) for w in weights]
    floors = [int(r.to_integral_value(rounding=ROUND_FLOOR)) for r in raw]
    short = units - sum(floors)
    # Largest remainders first; ties go to the earlier part so the split is deterministic.
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - floors[i]), i))
    for i in order[:short]:
        floors[i] += 1
    return [Decimal(n) * places for n in floors]


@dataclass
class _GpuUsage:
    allocation: Allocation
    booked: dict[datetime, float] = field(default_factory=dict)
    used: dict[datetime, float] = field(default_factory=dict)
    started_at: datetime | None = None
    finished_at: datetime | None = None


def _seconds_from_event(data: Mapping[str, Any], allocation: Allocation) -> float | None:
    by_gpu = data.get("gpu_seconds")
    if not isinstance(by_gpu, Mapping):
        return None
    # A MIG slice is measured under its MIG uuid (what its launch names), a whole GPU under its own.
    for key in (allocation.device_uuid, str(allocation.gpu_id)):
        if key in by_gpu:
            return max(0.0, float(by_gpu[key]))
    return 0.0 if data.get("measured") else None


def _hours_of(spans: Iterable[Interval]) -> dict[datetime, float]:
    out: dict[datetime, float] = defaultdict(float)
    for start, end in spans:
        for hour, seconds in split_by_hour(start, end):
            out[hour] += seconds
    return dict(out)


def _usage_per_gpu(
    reservation: Reservation, allocations: list[Allocation], final: ReservationEvent | None
) -> list[_GpuUsage]:
    until = final.at if final else reservation.updated_at
    ran = launch_intervals(reservation=reservation, until=until)
    data = final.data if final else {}
    usages = []
    for allocation in allocations:
        usage = _GpuUsage(allocation=allocation)
        held = allocation_held(allocation)
        if held:
            usage.booked = _hours_of([held])
        spans = ran.get(allocation.device_uuid, [])
        target = _seconds_from_event(data, allocation)
        if not spans and target and held:
            # Charged without a measurement (booked time up to the end): it ran, as far as we know, from the start.
            end = min(held[1], held[0] + timedelta(seconds=target))
            spans = [(held[0], max(end, held[0]))]
        used = _hours_of(spans)
        measured_total = sum(used.values())
        if target is not None and measured_total > 0 and abs(target - measured_total) > 1e-6:
            # The ledger was settled on ``target``; the launches give its shape over the hours.
            used = {hour: seconds * target / measured_total for hour, seconds in used.items()}
        usage.used = used
        if spans:
            usage.started_at = min(a for a, _ in spans)
            usage.finished_at = max(b for _, b in spans)
        usages.append(usage)
    return usages


@transaction.atomic
def usage_record_reservation(*, reservation: Reservation) -> list[UsageRecord]:
    """Write the usage records (and hourly slices) of a final reservation; idempotent.

    Returns the records, new or already there; an empty list when the reservation is not final yet.
    """
    current = Reservation.objects.select_for_update().select_related("project").get(pk=reservation.pk)
    existing = list(UsageRecord.objects.filter(reservation=current))
    if existing or current.state not in FINAL_STATES:
        return existing
    allocations = list(current.allocations.select_related("gpu__model", "mig_device").order_by("gpu_id", "slice_start"))
    if not allocations:
        return []
    costs.load_weights(allocations)
    final = (
        ReservationEvent.objects.filter(reservation=current, to_state__in=list(FINAL_STATES))
        .order_by("-at", "-id")
        .first()
    )
    charges = LedgerEntry.objects.filter(reservation=current, kind=EntryKind.CHARGE)
    charged = -(charges.aggregate(total=Sum("amount"))["total"] or ZERO)
    usages = _usage_per_gpu(current, allocations, final)

    # One flat list of (usage, hour) parts, weighted by credits-worth of usage time.
    parts: list[tuple[_GpuUsage, datetime]] = []
    weights: list[float] = []
    for usage in usages:
        weight = float(costs.weight(usage.allocation))  # a slice: its share of the GPU's weight
        for hour in sorted(set(usage.booked) | set(usage.used)):
            parts.append((usage, hour))
            weights.append(weight * usage.used.get(hour, 0.0))
    if charged > 0 and sum(weights) <= 0:
        # Charged with nothing measured at all: attribute by booked time instead.
        weights = [float(costs.weight(u.allocation)) * u.booked.get(h, 0.0) for u, h in parts]
    shares = split_exact(charged, weights) if parts else []

    records: dict[int, UsageRecord] = {}
    # Per GPU and hour: MIG slices of one GPU in one reservation add up in its one record and its hours.
    slices: dict[tuple[int, datetime], UsageSlice] = {}
    counted: set[int] = set()  # the usages already added to their GPU's record
    for (usage, hour), share in zip(parts, shares, strict=True):
        gpu = usage.allocation.gpu
        model = gpu.model
        used_s = usage.used.get(hour, 0.0)
        if model.billing_weight > 0:
            cost = share / model.billing_weight * model.price_per_gpu_hour
        else:
            cost = model.price_per_gpu_hour * Decimal(repr(used_s)) / Decimal(3600)
        cost = cost.quantize(MONEY_PLACES, rounding=ROUND_HALF_EVEN)
        record = records.get(gpu.pk)
        if record is None:
            held = allocation_held(usage.allocation) or (usage.allocation.starts_at, usage.allocation.starts_at)
            record = records[gpu.pk] = UsageRecord(
                reservation=current,
                gpu=gpu,
                project_id=current.project_id,
                user_id=current.created_by_id,
                gpu_model=model,
                booked_start=held[0],
                booked_end=held[1],
                started_at=usage.started_at,
                finished_at=usage.finished_at,
                measured=bool(final and final.data.get("measured", True)),
                booked_s=sum(usage.booked.values()),
                gpu_seconds=sum(usage.used.values()),
                credits=ZERO,
                cost=ZERO,
                currency=model.currency,
            )
            counted.add(id(usage))
        elif id(usage) not in counted:
            counted.add(id(usage))
            record.booked_s += sum(usage.booked.values())
            record.gpu_seconds += sum(usage.used.values())
        record.credits += share
        record.cost += cost
        merged = slices.get((gpu.pk, hour))
        if merged is not None:
            merged.booked_s += usage.booked.get(hour, 0.0)
            merged.used_s += used_s
            merged.credits += share
            merged.cost += cost
            continue
        slices[(gpu.pk, hour)] = UsageSlice(
            record=record,
            hour=hour,
            project_id=current.project_id,
            reservation=current,
            user_id=current.created_by_id,
            gpu_model=model,
            booked_s=usage.booked.get(hour, 0.0),
            used_s=used_s,
            credits=share,
            cost=cost,
            currency=model.currency,
        )
    for usage in usages:  # a GPU never held and never run still gets its (empty) record
        gpu = usage.allocation.gpu
        if gpu.pk not in records:
            records[gpu.pk] = UsageRecord(
                reservation=current,
                gpu=gpu,
                project_id=current.project_id,
                user_id=current.created_by_id,
                gpu_model=gpu.model,
                booked_start=usage.allocation.starts_at,
                booked_end=usage.allocation.starts_at,
                measured=True,
                currency=gpu.model.currency,
            )
    try:
        with transaction.atomic():
            created = UsageRecord.objects.bulk_create(list(records.values()))
            for s in slices.values():
                s.record_id = s.record.pk
            UsageSlice.objects.bulk_create(list(slices.values()), batch_size=2000)
    except IntegrityError:
        # Another worker recorded it between our check and insert (the row lock makes this rare).
        return list(UsageRecord.objects.filter(reservation=current))
    return created


def usage_record_pending(*, limit: int = 50) -> int:
    """The reconciler: record final reservations that have no usage records yet, one at a time."""
    has_records = UsageRecord.objects.filter(reservation=OuterRef("pk"))
    pending = (
        Reservation.objects.filter(state__in=list(FINAL_STATES), allocations__isnull=False)
        .filter(~Exists(has_records))
        .distinct()
        .order_by("updated_at", "id")[:limit]
    )
    done = 0
    for reservation in pending:
        try:
            if usage_record_reservation(reservation=reservation):
                done += 1
        except Exception:  # one bad reservation must not stop the others; it is retried on the next pass
            log.exception("could not record the usage of reservation %s", reservation.pk)
    return done
