"""Reads of the inventory that other apps build on."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu, Server


def placeable_gpus() -> QuerySet[Gpu]:
    """GPUs a reservation may be placed on: healthy, present, on a ready server."""
    return Gpu.objects.filter(health=GpuHealth.HEALTHY, present=True, server__state=ServerState.READY)


def servers_visible_to_tenants() -> QuerySet[Server]:
    """Tenants see the live fleet (for availability), not servers that left it."""
    return Server.objects.exclude(state=ServerState.RETIRED)
