"""What a reservation costs: its rate, what it has used so far, and what the ledger charged once it ended.

One rule for every figure: a GPU costs its model's billing weight (a MIG slice: its catalog profile's weight,
by default that weight times its share of the GPU's eight memory slices, ``weight``) times the reservation's
``credit_multiplier`` (its queue class's: 1.5 for high, 0.5 for preemptible; ``rate``) in credits per hour
it is held, from its allocation's start to its end, its release or now, whichever comes first.
``held_seconds`` and ``held_credits`` are that rule; the ledger settles with them too when nothing was measured
(``services._used_credits``), so what a running reservation shows is what it will be charged.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import DecimalField, OuterRef, Prefetch, Subquery, Sum, prefetch_related_objects
from django.db.models.functions import Coalesce
from django.utils import timezone

from controlplane.inventory.models import GPU_MEMORY_SLICES, mig_weight_override, slice_weight
from controlplane.inventory.selectors import mig_weight_overrides
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.ledger.services import credits
from controlplane.reservations.choices import FINAL_STATES
from controlplane.reservations.models import Reservation

SECONDS_PER_HOUR = Decimal(3600)
_GPU_HOURS = Decimal("0.0001")
_RATE = Decimal("0.0001")
MULTIPLIER = Decimal("0.001")  # the places Reservation.credit_multiplier keeps

# The annotation the list and detail querysets carry: the credits the ledger charged the reservation.
CHARGED = "credits_charged_total"


def with_charges(qs: Any) -> Any:
    """``qs`` annotated with what the ledger charged each reservation (a sum of its charge entries)."""
    charged = (
        LedgerEntry.objects.filter(reservation_id=OuterRef("pk"), kind=EntryKind.CHARGE)
        .order_by()
        .values("reservation_id")
        .annotate(total=Sum("amount"))
        .values("total")
    )
    field = DecimalField(max_digits=16, decimal_places=4)
    return qs.annotate(**{CHARGED: Coalesce(Subquery(charged, output_field=field), Decimal(0), output_field=field)})


def gpu_hours(seconds: float) -> Decimal:
    """Seconds as hours, to the precision the ledger computes credits at."""
    return (Decimal(str(seconds)) / SECONDS_PER_HOUR).quantize(Decimal("0.000001"))


def weight(allocation: Any) -> Decimal:
    """The billing weight an allocation is charged by: its GPU model's for a whole GPU; for a MIG slice, the
    catalog profile's override where an operator set one (``GpuModelMigProfile.billing_weight``), else the
    model's weight times the share of the GPU's memory slices it holds (``inventory.models.slice_weight``: a
    ``1g.10gb`` on an H100 is 1/8 of its weight).

    Memory slices rather than compute slices (of seven): memory is what a slice takes from the others, the
    eighth memory slice has no compute slice of its own, and only by memory do a GPU's slices add up to the
    whole, so a GPU cut into slices earns what it earns whole. Whole GPUs read nothing more; a slice reads its
    model's profiles once per model instance (prefetched where many are priced).
    """
    model = allocation.gpu.model
    memory_slices = allocation.slice_end - allocation.slice_start
    if allocation.mig_device_id is None:
        return Decimal(model.billing_weight) * Decimal(memory_slices) / GPU_MEMORY_SLICES
    override = mig_weight_override(model, allocation.mig_device.profile)
    return slice_weight(model.billing_weight, memory_slices, override)


def load_weights(allocations: Sequence[Any]) -> None:
    """Load what ``weight`` reads for slices, their MIG devices and their GPU models' overrides, in at most two
    reads for all of ``allocations`` (none when every one is a whole GPU, or is loaded already)."""
    slices = [a for a in allocations if a.mig_device_id is not None]
    if slices:
        prefetch_related_objects(
            slices, "mig_device", Prefetch("gpu__model__mig_profiles", queryset=mig_weight_overrides())
        )


def rate(weight: Decimal, reservation: Any) -> Decimal:
    """Credits per hour of one GPU of billing weight ``weight`` held by ``reservation``."""
    return Decimal(weight) * Decimal(reservation.credit_multiplier)


def held_seconds(allocation: Any, *, until: datetime) -> float:
    """How long an allocation's GPU has been held by ``until``: from its start to its end, its release or
    ``until``, whichever comes first (0 before its start)."""
    end = min(allocation.ends_at, allocation.released_at or allocation.ends_at, until)
    return max(0.0, (end - allocation.starts_at).total_seconds())


def held_credits(allocation: Any, *, until: datetime, reservation: Any) -> Decimal:
    """What holding the allocation's GPU has cost ``reservation`` by ``until``: its ``rate`` per hour held."""
    return rate(weight(allocation), reservation) * gpu_hours(held_seconds(allocation, until=until))


def _charged(reservation: Reservation) -> Decimal:
    if hasattr(reservation, CHARGED):
        total = getattr(reservation, CHARGED)
    else:
        total = LedgerEntry.objects.filter(reservation_id=reservation.pk, kind=EntryKind.CHARGE).aggregate(
            t=Sum("amount")
        )["t"]
    # Charges are negative entries; the charge is what left the balance.
    return -Decimal(total or 0)


def _fmt(value: Decimal) -> str:
    return format(value, "f")


def cost_for(reservation: Reservation, *, now: datetime | None = None) -> dict[str, Any]:
    """The ``cost`` object of a reservation's API answer (allocations with their GPU models loaded)."""
    now = now or timezone.now()
    total_rate = Decimal(0)
    used = Decimal(0)  # credits, unrounded
    gpu_seconds = 0.0
    longest = 0.0
    booked = Decimal(0)
    for a in reservation.allocations.all():
        per_hour = rate(weight(a), reservation)
        total_rate += per_hour
        seconds = held_seconds(a, until=now)
        gpu_seconds += seconds
        longest = max(longest, seconds)
        used += held_credits(a, until=now, reservation=reservation)
        booked += per_hour * gpu_hours((a.ends_at - a.starts_at).total_seconds())
    final = reservation.state in FINAL_STATES
    return {
        "credits_per_hour": _fmt(total_rate.quantize(_RATE)),
        "credit_multiplier": _fmt(Decimal(reservation.credit_multiplier).quantize(MULTIPLIER)),
        "booked_credits": _fmt(credits(booked)),
        "elapsed_seconds": int(longest),
        "gpu_hours": _fmt((Decimal(str(gpu_seconds)) / SECONDS_PER_HOUR).quantize(_GPU_HOURS)),
        "credits_so_far": _fmt(credits(used)),
        "credits_charged": _fmt(_charged(reservation)) if final else None,
    }
