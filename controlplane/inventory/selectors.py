"""Reads of the inventory that other apps build on."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet
from django.utils import timezone

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu, GpuModelMigProfile, Server


def placeable_gpus() -> QuerySet[Gpu]:
    """GPUs a reservation may be placed on: healthy, present, on a ready server."""
    return Gpu.objects.filter(health=GpuHealth.HEALTHY, present=True, server__state=ServerState.READY)


def mig_weight_overrides() -> QuerySet[GpuModelMigProfile]:
    """The catalog's MIG profiles whose weight an operator set: all that pricing a slice needs to read
    (``models.mig_weight_override``); a profile without an override weighs its memory share."""
    return GpuModelMigProfile.objects.filter(billing_weight__isnull=False)


def servers_visible_to_tenants() -> QuerySet[Server]:
    """Tenants see the live fleet (for availability), not servers that left it."""
    return Server.objects.exclude(state=ServerState.RETIRED)


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
