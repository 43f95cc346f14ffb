"""Booking MIG slices (docs/fractional.md, "Booking slices"): which devices a slice booking may take, the
packing rule that chooses among them, and their allocation.

A slice is one ``MigDevice`` under its parent GPU; its allocation names the parent (``gpu``), the device and
the device's memory-slice span. The exclusion constraint (migration 0006) keeps a whole GPU and its slices,
and two slices sharing memory slices, from overlapping in time; this module only chooses well and re-checks
under the GPUs' locks, as whole-GPU placement does (``services._place_and_allocate``, which calls
``place_and_allocate`` here for a spec with a ``mig_profile`` and does nothing else for it).

The packing rule, a pure function (``pick_slices``) so it can be tested exhaustively:

* **Fill GPUs that are cut already.** A device on a GPU that has the fewest memory slices free in the
  window goes first (a GPU with slices booked before one with none), then the lowest GPU index, then the
  lowest start: untouched GPUs stay untouched for the next large slice, and the large profiles of a GPU
  that is cut already are the last to be taken.
* **One server for a count.** When one server can hold every slice asked for, the one left with the fewest
  free memory slices (best fit) wins, then the hostname; only when none can are they spread, by the same
  order over the fleet.

``STRATEGY`` names the rule booking uses: ``"packed"`` (the above), or ``"first_fit"``, the first free devices
in fleet order (hostname, GPU index, start) whatever is cut already: the baseline bench/fractional.py
measures packing against.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from django.db import IntegrityError, connection, transaction
from django.db.models import Q, QuerySet

from controlplane.core import rows
from controlplane.core.errors import Conflict
from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu, MigDevice
from controlplane.reservations.models import GPU_MEMORY_SLICES, Allocation, Reservation
from controlplane.reservations.selectors import overlapping
from controlplane.reservations.specs import GpuSpec, Window

PLACEMENT_ATTEMPTS = 3

Packing = Literal["packed", "first_fit"]
STRATEGY: Packing = "packed"


@dataclass(frozen=True)
class SliceSlot:
    """A free MIG device of the asked profile, with what packing looks at."""

    id: int  # the MigDevice
    gpu_id: int
    gpu_index: int
    server_id: int
    hostname: str
    start: int  # its first memory slice
    gpu_free: int  # memory slices of its GPU free for the whole window


def pick_slices(free: Sequence[SliceSlot], count: int, *, strategy: Packing = "packed") -> list[int] | None:
    """MigDevice ids for ``count`` slices by the rule above, or None when there are not that many free."""
    if count < 1:
        raise ValueError("count must be at least 1")
    if len(free) < count:
        return None
    if strategy == "first_fit":
        return [slot.id for slot in sorted(free, key=lambda s: (s.hostname, s.gpu_index, s.start, s.id))[:count]]

    def order(slot: SliceSlot) -> tuple[int, int, int, str, int]:
        return (slot.gpu_free, slot.gpu_index, slot.start, slot.hostname, slot.id)

    by_server: dict[int, list[SliceSlot]] = defaultdict(list)
    for slot in free:
        by_server[slot.server_id].append(slot)
    fitting = [slots for slots in by_server.values() if len(slots) >= count]
    if fitting:

        def left(slots: list[SliceSlot]) -> tuple[int, str]:
            free_slices = sum({s.gpu_id: s.gpu_free for s in slots}.values())
            return (free_slices, slots[0].hostname)

        best = min(fitting, key=left)
        return [slot.id for slot in sorted(best, key=order)[:count]]
    return [slot.id for slot in sorted(free, key=order)[:count]]


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _held(
    gpu_ids: Sequence[int], window: Window, exclude_reservation_id: int | None = None
) -> dict[int, list[tuple[int, int]]]:
    """Per GPU, the memory-slice spans its active allocations hold at some point of the window."""
    qs = overlapping(Allocation.objects.filter(gpu_id__in=list(gpu_ids)), window.starts_at, window.ends_at)
    if exclude_reservation_id is not None:
        qs = qs.exclude(reservation_id=exclude_reservation_id)
    held: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for gpu_id, start, end in qs.values_list("gpu_id", "slice_start", "slice_end"):
        held[gpu_id].append((start, end))
    return held


def _bookable() -> QuerySet[MigDevice]:
    """The one definition of a usable slice: a device its agent still reports (not gone), on a GPU that is
    present, healthy and in MIG mode on a ready server, with a known span. Placement, the earliest-window
    search, the free read and slices by memory all start from it."""
    return MigDevice.objects.present().filter(
        gpu__present=True,
        gpu__health=GpuHealth.HEALTHY,
        gpu__server__state=ServerState.READY,
        gpu__mig__current=True,
        placement_start__isnull=False,
        memory_slices__gte=1,
    )


def _devices(spec: GpuSpec, *, ids: Sequence[int] | None = None) -> list[MigDevice]:
    """The devices of the profile on GPUs a booking may use (``_bookable``)."""
    qs = _bookable().select_related("gpu__server")
    if ids is not None:
        qs = qs.filter(pk__in=list(ids))
    else:
        qs = qs.filter(profile=spec.mig_profile)
    return list(qs)


def _span(device: MigDevice) -> tuple[int, int]:
    start = int(device.placement_start or 0)
    return start, min(GPU_MEMORY_SLICES, start + int(device.memory_slices or 0))


def free_slices(spec: GpuSpec, window: Window) -> list[SliceSlot]:
    """The devices of ``spec.mig_profile`` free for the whole window, with their GPUs' free memory slices."""
    devices = _devices(spec)
    return _slots(devices, _held(sorted({d.gpu_id for d in devices}), window))


def _slots(devices: Sequence[MigDevice], held: dict[int, list[tuple[int, int]]]) -> list[SliceSlot]:
    """Of ``devices``, those whose span none of their GPU's ``held`` spans covers, as packing sees them."""
    out: list[SliceSlot] = []
    for device in devices:
        spans = held.get(device.gpu_id, [])
        if any(_overlaps(_span(device), span) for span in spans):
            continue
        taken = {i for a, b in spans for i in range(a, b)}
        out.append(
            SliceSlot(
                id=device.pk,
                gpu_id=device.gpu_id,
                gpu_index=device.gpu.index,
                server_id=device.gpu.server_id,
                hostname=device.gpu.server.hostname,
                start=_span(device)[0],
                gpu_free=GPU_MEMORY_SLICES - len(taken),
            )
        )
    return out


def _share_lock(gpu_ids: Sequence[int]) -> None:
    """The parent GPUs' rows locked against change until commit, as whole-GPU bookings lock theirs
    (``services._share_lock_gpus``, which says why FOR SHARE); SQLite runs bookings one at a time."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM inventory_gpu WHERE id = ANY(%s) ORDER BY id FOR SHARE", [sorted(gpu_ids)])


def no_capacity(spec: GpuSpec) -> Conflict:
    count = spec.gpu_count or 1
    what = f"{count} MIG slice{'s' if count != 1 else ''} of profile {spec.mig_profile}"
    return Conflict(
        f"No {what} free for the whole window: MIG devices of that profile are on GPUs in MIG mode on ready "
        f"servers (GET /api/v1/gpus shows each GPU's mig_devices).",
        code="no_capacity",
        fields={"spec.mig_profile": [f"Not enough free MIG devices of profile {spec.mig_profile}."]},
    )


def place_and_allocate(
    reservation: Reservation, *, spec: GpuSpec, window: Window
) -> tuple[list[Gpu], list[Allocation]]:
    """Choose slices, lock their GPUs, re-check them and insert the allocations (one per slice, the parent
    GPU per allocation in the same order); place again when another booking took one meanwhile."""
    exclude: set[int] = set()
    count = spec.gpu_count or 1
    for _attempt in range(PLACEMENT_ATTEMPTS + 1):
        free = [slot for slot in free_slices(spec, window) if slot.id not in exclude]
        chosen = pick_slices(free, count, strategy=STRATEGY)
        if chosen is None:
            raise no_capacity(spec)
        slots = {slot.id: slot for slot in free}
        gpu_ids = sorted({slots[i].gpu_id for i in chosen})
        _share_lock(gpu_ids)
        # Re-read under the lock, in a new statement: a booking that committed since our read is visible now.
        devices = {d.pk: d for d in _devices(spec, ids=chosen)}
        held = _held(gpu_ids, window)
        gone = {
            i
            for i in chosen
            if i not in devices or any(_overlaps(_span(devices[i]), s) for s in held.get(devices[i].gpu_id, []))
        }
        if gone:
            exclude |= gone
            continue
        parents = Gpu.objects.select_related("server", "model").in_bulk(gpu_ids)
        ordered = sorted((devices[i] for i in chosen), key=lambda d: (parents[d.gpu_id].index, _span(d)[0]))
        allocations = [
            Allocation(
                reservation=reservation,
                gpu=parents[d.gpu_id],
                server_id=parents[d.gpu_id].server_id,
                mig_device=d,
                slice_start=_span(d)[0],
                slice_end=_span(d)[1],
                starts_at=window.starts_at,
                ends_at=window.ends_at,
            )
            for d in ordered
        ]
        try:
            with transaction.atomic():
                rows.insert(allocations)
        except IntegrityError:
            # The exclusion constraint: an uncommitted booking at our re-read holds one of these spans.
            exclude |= set(chosen)
            continue
        return [a.gpu for a in allocations], allocations
    raise Conflict("Other bookings kept taking the chosen MIG devices; try again.", code="gpu_taken")


def span_q(allocations: Sequence[Allocation]) -> Q:
    """Allocations that share a GPU and a memory slice with any of ``allocations``."""
    q = Q(pk__in=[])
    for a in allocations:
        q |= Q(gpu_id=a.gpu_id, slice_start__lt=a.slice_end, slice_end__gt=a.slice_start)
    return q


# -- slices by memory (docs/fractional.md, "Slices by memory") --------------------------------------------


def slice_specs(spec: GpuSpec) -> list[GpuSpec]:
    """The slice bookings a spec may become, in the order the rule tries them: a ``mig_profile`` spec is
    itself; a slices-by-memory spec is one per profile on bookable devices with at least its memory, the
    smallest first (fewest memory slices, then compute slices, then memory, a media-extension ``+me``
    profile after its plain twin); any other spec none."""
    if spec.mig_profile is not None:
        return [spec]
    if not spec.slices or spec.min_memory_mib is None:
        return []
    found = (
        _bookable()
        .filter(memory_mib__gte=spec.min_memory_mib)
        .exclude(profile="")
        .values_list("profile", "memory_slices", "compute_slices", "memory_mib")
        .distinct()
    )
    size: dict[str, tuple[int, int, int, bool]] = {}
    for profile, memory_slices, compute_slices, memory_mib in found:
        key = (int(memory_slices or 0), int(compute_slices or 0), int(memory_mib or 0), profile.endswith("+me"))
        size[profile] = min(size.get(profile, key), key)
    ordered = sorted(size, key=lambda p: (size[p], p))
    return [replace(spec, mig_profile=p, min_memory_mib=None, slices=False) for p in ordered]


def first_fit(spec: GpuSpec, window: Window) -> tuple[GpuSpec, list[SliceSlot], list[int]] | None:
    """The first of ``slice_specs(spec)`` that has ``gpu_count`` slices free for the window: that profile's
    spec, its free slices and the ones packing picks. None when no profile has them."""
    for profile_spec in slice_specs(spec):
        free = free_slices(profile_spec, window)
        chosen = pick_slices(free, profile_spec.gpu_count or 1)
        if chosen is not None:
            return profile_spec, free, chosen
    return None


def place_by_memory(
    reservation: Reservation, *, spec: GpuSpec, window: Window
) -> tuple[list[Gpu], list[Allocation]] | None:
    """A slices-by-memory booking placed on the first profile of ``slice_specs`` that takes it, the
    reservation's row saying which (``mig_profile``, its memory dropped: what was booked); None when none
    does, and the caller places whole GPUs."""
    for profile_spec in slice_specs(spec):
        try:
            placed = place_and_allocate(reservation, spec=profile_spec, window=window)
        except Conflict as exc:
            if exc.code == "no_capacity":
                continue  # this profile is full for the window: the next larger one
            raise
        Reservation.objects.filter(pk=reservation.pk).update(mig_profile=profile_spec.mig_profile, min_memory_mib=None)
        reservation.mig_profile, reservation.min_memory_mib = profile_spec.mig_profile or "", None
        return placed
    return None


def earliest_slices(
    spec: GpuSpec, *, duration: timedelta, within: timedelta, now: datetime
) -> tuple[Window, list[int]] | None:
    """The earliest ``[t, t + duration)`` inside ``[now, now + within]`` in which ``gpu_count`` slices of
    ``spec.mig_profile`` are free, with the MigDevice ids packing picks then (``pick_slices``, as booking).

    A window that fits can move earlier until it starts at ``now`` or at the end of an allocation of one of
    these GPUs (moving earlier meets a new allocation only past its end), so those instants are all the
    starts there are to try, in order, against one read of the GPUs' allocations in the horizon."""
    last = now + within - duration
    if last < now:
        return None
    devices = _devices(spec)
    count = spec.gpu_count or 1
    if len(devices) < count:
        return None
    allocations = list(
        overlapping(Allocation.objects.filter(gpu_id__in={d.gpu_id for d in devices}), now, last + duration)
        .order_by()
        .values_list("gpu_id", "slice_start", "slice_end", "starts_at", "ends_at")
    )
    starts = sorted({now} | {end for *_, end in allocations if now < end <= last})
    for t in starts:
        end = t + duration
        held: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for gpu_id, slice_start, slice_end, a, b in allocations:
            if a < end and b > t:
                held[gpu_id].append((slice_start, slice_end))
        chosen = pick_slices(_slots(devices, held), count)
        if chosen is not None:
            return Window(t, end), chosen
    return None
