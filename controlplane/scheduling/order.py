"""The queue's order and a blocked request's shadow time (docs/scheduling.md, "The pass").

The order: class rank, highest first; within a class the fair-share factor, highest first; then first come,
first served. A request whose GPUs are busy has a *shadow time*: the earliest start the calendar of booked
windows leaves it (the search behind ``estimated_start`` and ``/availability/earliest/``). EASY backfill lets
a request behind it start now only when its booking ends by then, so it cannot delay it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from controlplane.inventory.models import GpuModel
from controlplane.reservations.capacity import EARLIEST_WITHIN
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.selectors import placeable_gpus
from controlplane.reservations.specs import GpuSpec
from controlplane.reservations.windows import earliest_window
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.fairshare import FairShare, fair_shares
from controlplane.scheduling.models import QueuedRequest


@dataclass(frozen=True)
class Entry:
    """What the pass needs of one queued request, read for the whole queue in one query."""

    id: int
    public_id: Any
    project_id: int
    rank: int
    created_at: datetime
    duration: timedelta
    spec: GpuSpec
    fair_share: FairShare
    reason: str  # as the last pass left it: a pass writes a reason only when it changes

    def sort_key(self) -> tuple[Any, ...]:
        return (-self.rank, -self.fair_share.factor, self.created_at, self.id)


def ordered_queue(*, now: datetime) -> list[Entry]:
    """The queued requests (not the held ones) in the order the pass serves them: three queries in all."""
    rows = list(
        QueuedRequest.objects.filter(state=RequestState.QUEUED)
        .order_by()
        .values_list(
            "id", "public_id", "project_id", "priority_class__rank", "created_at", "duration_seconds", "spec", "reason"
        )
    )
    shares = fair_shares({r[2] for r in rows}, now=now) if rows else {}
    entries = [
        Entry(rid, pub, pid, rank, created, timedelta(seconds=seconds), GpuSpec(**spec), shares[pid], reason)
        for rid, pub, pid, rank, created, seconds, spec, reason in rows
    ]
    return sorted(entries, key=Entry.sort_key)


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def asked_words(spec: GpuSpec, *, model_names: dict[int, str] | None = None) -> str:
    """What it waits for, in words: "4 x H100-80GB", "2 whole servers of H100-80GB"."""
    if spec.gpu_model_id is not None and model_names is not None:
        what = model_names.get(spec.gpu_model_id, "GPU")
    elif spec.gpu_model_id is not None:
        what = GpuModel.objects.filter(pk=spec.gpu_model_id).values_list("name", flat=True).first() or "GPU"
    else:
        what = f"GPU with at least {spec.min_memory_mib} MiB"
    if spec.whole_servers is not None:
        return f"{spec.whole_servers} whole server{'s' if spec.whole_servers != 1 else ''} of {what}"
    return f"{spec.gpu_count or 1} x {what}"


@dataclass(frozen=True)
class Shadow:
    """The earliest start left to a blocked request, and the reservation whose end frees the GPUs then."""

    at: datetime
    blocker: Reservation | None
    beyond_horizon: bool  # no window in the searched week: ``at`` is the last start searched, a lower bound

    def reason(self, spec: GpuSpec) -> str:
        words = f"waiting for {asked_words(spec)}"
        if self.beyond_horizon:
            return f"{words}; no window free before {iso(self.at)}"
        if self.blocker is None:
            return f"{words}; free from {iso(self.at)}"
        return f"{words}; blocked by reservation {self.blocker.public_id} until {iso(self.at)}"


def shadow(spec: GpuSpec, *, duration: timedelta, now: datetime) -> Shadow:
    """The shadow time of a request whose GPUs are not free now (two or three queries).

    Beyond the searched horizon the earliest start is unknown but later than its last start: that instant is
    a safe shadow, as a booking that ends by then cannot meet any window the request could still get."""
    found = earliest_window(spec, duration=duration, within=EARLIEST_WITHIN + duration, now=now)
    if found is None:
        return Shadow(now + EARLIEST_WITHIN, None, True)
    at = found[0].starts_at
    blocker = (
        Allocation.objects.filter(active=True, ends_at=at, gpu__in=placeable_gpus(spec))
        .select_related("reservation")
        .order_by("reservation_id")
        .first()
    )
    return Shadow(at, blocker.reservation if blocker else None, False)
