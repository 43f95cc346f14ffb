"""Why a booking found no GPUs: too few in the whole fleet, too few usable now, or all busy in the window.

A ``no_capacity`` refusal says which, with the fleet's count of matching GPUs (or whole servers), and, when
they are all merely busy, the earliest window of the same length that fits (windows.earliest_window, the
search behind ``/availability/earliest/``), looked for in the week after the asked start.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, F, Q
from rest_framework import serializers

from controlplane.core.errors import Conflict
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Gpu, GpuModel, Server
from controlplane.reservations.selectors import gpu_matches, spec_q, usable_whole_q
from controlplane.reservations.specs import GpuSpec, Window
from controlplane.reservations.windows import earliest_window

EARLIEST_WITHIN = timedelta(days=7)
_AT = serializers.DateTimeField()


@dataclass(frozen=True)
class FleetCount:
    """Matching GPUs (or, for whole servers, servers whose every GPU matches) in the fleet: all that are
    present, and those of them that are healthy on a ready server."""

    total: int
    usable: int
    in_mig: int = 0  # of ``total``, GPUs in MIG mode: booked by their slices only


def fleet_count(spec: GpuSpec) -> FleetCount:
    if spec.whole_servers is None:
        counts = Gpu.objects.filter(spec_q(spec), present=True).aggregate(
            total=Count("id"),
            usable=Count("id", filter=gpu_matches(spec) & Q(server__state=ServerState.READY)),
            in_mig=Count("id", filter=~usable_whole_q()),
        )
        return FleetCount(counts["total"], counts["usable"], counts["in_mig"])
    present = Q(gpus__present=True)
    servers = Server.objects.annotate(
        gpus_present=Count("gpus", filter=present),
        matching=Count("gpus", filter=present & spec_q(spec, "gpus__")),
        healthy=Count("gpus", filter=present & gpu_matches(spec, "gpus__")),
    ).filter(gpus_present__gt=0, matching=F("gpus_present"))
    return FleetCount(servers.count(), servers.filter(state=ServerState.READY, healthy=F("gpus_present")).count())


def _what(spec: GpuSpec) -> tuple[str, str]:
    """What is counted, in the singular and the plural: "H100-80GB GPU", "whole servers of H100-80GB GPUs"."""
    if spec.gpu_model_id is not None:
        name = GpuModel.objects.filter(pk=spec.gpu_model_id).values_list("name", flat=True).first()
        one, many = f"{name} GPU", f"{name} GPUs"
    else:
        one, many = (f"GPU{s} with at least {spec.min_memory_mib} MiB" for s in ("", "s"))
    if spec.whole_servers is not None:
        return f"whole server of {many}", f"whole servers of {many}"
    return one, many


def _count(n: int, what: tuple[str, str]) -> str:
    return f"{n} {what[0] if n == 1 else what[1]}"


def _earliest(spec: GpuSpec, window: Window, *, now: datetime) -> Window | None:
    duration = window.ends_at - window.starts_at
    found = earliest_window(spec, duration=duration, within=EARLIEST_WITHIN + duration, now=max(now, window.starts_at))
    return None if found is None else found[0]


def no_capacity(spec: GpuSpec, window: Window, *, now: datetime, yields_at: datetime | None = None) -> Conflict:
    """The refusal for a booking that placement could not fill, saying why. ``yields_at``: preemptible
    reservations hold enough of the GPUs, and could yield them from then (their notice is longer than the
    time to the window's start)."""
    asked = spec.whole_servers if spec.whole_servers is not None else spec.gpu_count or 1
    count, what = fleet_count(spec), _what(spec)
    field = "spec.whole_servers" if spec.whole_servers is not None else "spec.gpu_count"
    fleet = {"matching": count.total, "usable": count.usable}
    if count.total < asked:
        message = (
            f"The fleet has {_count(count.total, what)} ({count.usable} healthy on ready servers): fewer than "
            f"the {asked} asked for, so no window can fit."
        )
        return _conflict(message + _in_mig(count), field, fleet, None)
    if count.usable < asked:
        message = (
            f"The fleet has {_count(count.total, what)}, but only {count.usable} healthy on ready servers now: "
            f"fewer than the {asked} asked for."
        )
        return _conflict(message + _in_mig(count), field, fleet, None)
    earliest = _earliest(spec, window, now=now)
    message = (
        f"Not enough {what[1]} are free for the whole window: {asked} asked for, and bookings hold the rest of "
        f"the fleet's {count.total} ({count.usable} healthy on ready servers)."
    ) + _in_mig(count)
    if earliest is None:
        message += f" None is free for a window of this length in the {EARLIEST_WITHIN.days} days after its start."
    else:
        start = _AT.to_representation(earliest.starts_at)
        message += f" The earliest window of this length that fits starts at {start}."
    if yields_at is not None:
        message += (
            " Preemptible reservations hold enough of them, and yield them with notice: a window starting at "
            f"{_AT.to_representation(yields_at)} or later can take them."
        )
    conflict = _conflict(message, "window", fleet, earliest)
    if yields_at is not None:
        conflict.extra["preemptible_yield_at"] = _AT.to_representation(yields_at)
    return conflict


def _in_mig(count: FleetCount) -> str:
    if not count.in_mig:
        return ""
    return (
        f" {count.in_mig} of them {'is' if count.in_mig == 1 else 'are'} in MIG mode, booked by slices only "
        "(spec.mig_profile, or spec.slices with a minimum memory)."
    )


def _conflict(message: str, field: str, fleet: dict[str, int], earliest: Window | None) -> Conflict:
    window = None
    if earliest is not None:
        window = {"start": _AT.to_representation(earliest.starts_at), "end": _AT.to_representation(earliest.ends_at)}
    return Conflict(
        message, code="no_capacity", fields={field: [message]}, extra={"fleet": fleet, "earliest_window": window}
    )
