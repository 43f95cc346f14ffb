"""Hourly telemetry rollups: per GPU per hour, attributed to the reservation that held the GPU.

An hour is always recomputed whole from its minutes (delete, then insert), so running the rollup twice, or
over an hour that is still filling, gives the same rows. A watermark keeps where the final hours end; the
hour the watermark points at is redone on every run until it is complete. Its row lock serialises runs.

Attribution: held time is exact (allocation periods cut at the hour's edges); a telemetry minute goes to the
allocation covering most of it, so a hand-over between reservations inside a minute gives that minute to one.
A GPU cut into MIG slices reports one reading for all of them (the agent samples GPUs, not MIG devices): when
the allocation covering most of a minute is a slice, the minute goes to every slice covering it, each with its
share of the energy and power (memory slices / 8) and the parent's utilization, memory and profiling readings
as they are; the share no slice holds goes to the GPU's unheld row, so the GPU's energy adds up.
Energy of a minute: the driver's energy counter difference to the previous minute where both have it (exact,
and a counter reset - a negative difference - falls back); else the mean power times the minute.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.accounting.models import GpuUsageHour, RollupWatermark
from controlplane.accounting.services import allocation_held
from controlplane.accounting.timeutil import HOUR, hour_floor, overlap_s
from controlplane.fleet.models import GpuTelemetryMinute
from controlplane.inventory.models import Gpu
from controlplane.reservations.models import Allocation

WATERMARK = "gpu-usage-hour"
MINUTE = timedelta(minutes=1)


def idle_threshold() -> float:
    return float(getattr(settings, "ACCOUNTING_IDLE_UTIL_PERCENT", 5.0))


@dataclass
class _Held:
    reservation_id: int
    project_id: int
    user_id: int | None
    start: datetime
    end: datetime
    share: float = 1.0  # of the GPU: 1, or a MIG slice's memory slices / 8


# The minute rows' profiling columns (fleet.GpuTelemetryMinute), by prefix.
_PROF = ("sm_active", "tensor_active", "dram_active")


@dataclass
class _Acc:
    held_s: float = 0.0
    idle_s: float = 0.0
    minutes: int = 0
    util_minutes: int = 0
    util_sum: float = 0.0
    util_max: float | None = None
    fb_max: float | None = None
    power_minutes: int = 0
    power_sum: float = 0.0
    energy_j: float = 0.0
    from_counter: bool = False
    held: _Held | None = None
    # DCGM profiling fields: (minutes with a reading, sum of their means), by minute-row prefix.
    prof: dict[str, list[float]] = field(default_factory=lambda: {p: [0, 0.0] for p in _PROF})


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def _minute_energy_j(row: GpuTelemetryMinute, previous: GpuTelemetryMinute | None) -> tuple[float, bool]:
    if row.energy_last_mj is not None and previous is not None and previous.energy_last_mj is not None:
        delta = row.energy_last_mj - previous.energy_last_mj
        if delta >= 0:
            return delta / 1000.0, True
    power = row.power_avg_w
    if power is not None:
        return power * 60.0, False
    if row.energy_first_mj is not None and row.energy_last_mj is not None and row.energy_last_mj >= row.energy_first_mj:
        return (row.energy_last_mj - row.energy_first_mj) / 1000.0, True
    return 0.0, False


def _holds(start: datetime, end: datetime) -> dict[int, list[_Held]]:
    out: dict[int, list[_Held]] = defaultdict(list)
    rows = (
        Allocation.objects.filter(starts_at__lt=end, ends_at__gt=start)
        .select_related("reservation")
        .order_by("gpu_id", "starts_at")
    )
    for a in rows:
        held = allocation_held(a)
        if held is None or held[1] <= start or held[0] >= end:
            continue
        out[a.gpu_id].append(
            _Held(
                a.reservation_id,
                a.reservation.project_id,
                a.reservation.created_by_id,
                held[0],
                held[1],
                float(a.slice_fraction),
            )
        )
    return out


def rollup_hour(*, hour: datetime, upto: datetime) -> int:
    """Recompute one hour's rows from its minutes before ``upto``; returns how many rows it wrote."""
    end = min(hour + HOUR, upto)
    holds = _holds(hour, end)
    minutes = list(
        GpuTelemetryMinute.objects.filter(minute__gte=hour - MINUTE, minute__lt=end).order_by("gpu_id", "minute")
    )
    accs: dict[tuple[int, int | None], _Acc] = {}

    def acc_for(gpu_id: int, held: _Held | None) -> _Acc:
        key = (gpu_id, held.reservation_id if held else None)
        if key not in accs:
            accs[key] = _Acc(held=held)
        return accs[key]

    for gpu_id, spans in holds.items():
        for held in spans:
            acc_for(gpu_id, held).held_s += overlap_s(held.start, held.end, hour, end)

    previous: GpuTelemetryMinute | None = None
    threshold = idle_threshold()
    for row in minutes:
        prev = (
            previous
            if previous is not None and previous.gpu_id == row.gpu_id and previous.minute == row.minute - MINUTE
            else None
        )
        previous = row
        if row.minute < hour:
            continue  # only read as the previous minute of the hour's first
        m_end = row.minute + MINUTE
        best, best_s = None, 0.0
        covering: list[tuple[_Held, float]] = []
        for held in holds.get(row.gpu_id, ()):
            seconds = overlap_s(held.start, held.end, row.minute, m_end)
            if seconds > 0:
                covering.append((held, seconds))
            if seconds > best_s:
                best, best_s = held, seconds
        parts: list[tuple[_Held | None, float, float]] = [(best, best_s, 1.0)]
        if best is not None and best.share < 1:
            # MIG slices: each covering slice takes its share; what none holds stays the GPU's, unheld.
            # A reservation's slices of one GPU are one row: their shares add up, the minute counts once.
            mine: dict[int, tuple[_Held, float, float]] = {}
            for held, seconds in covering:
                if held.share < 1:
                    _, was_s, was_share = mine.get(held.reservation_id, (held, 0.0, 0.0))
                    mine[held.reservation_id] = (held, max(was_s, seconds), was_share + held.share)
            left = 1.0 - sum(share for _, _, share in mine.values())
            parts = [*mine.values(), *([(None, 0.0, left)] if left > 1e-9 else [])]
        joules, counter = _minute_energy_j(row, prev)
        for holder, seconds, share in parts:
            acc = acc_for(row.gpu_id, holder)
            acc.minutes += 1
            util = row.util_avg
            if util is not None:
                acc.util_minutes += 1
                acc.util_sum += util
                if holder is not None and util < threshold:
                    acc.idle_s += seconds
            acc.util_max = _max(acc.util_max, row.util_max)
            acc.fb_max = _max(acc.fb_max, row.fb_used_max_mib)
            if row.power_avg_w is not None:
                acc.power_minutes += 1
                acc.power_sum += row.power_avg_w * share
            for prefix in _PROF:
                mean = getattr(row, f"{prefix}_avg")
                if mean is not None:
                    acc.prof[prefix][0] += 1
                    acc.prof[prefix][1] += mean
            acc.energy_j += joules * share
            acc.from_counter = acc.from_counter or counter

    models = dict(Gpu.objects.filter(pk__in={gpu_id for gpu_id, _ in accs}).values_list("pk", "model_id"))
    rows = []
    for (gpu_id, _), acc in sorted(accs.items(), key=lambda item: (item[0][0], item[0][1] or 0)):
        acc_held = acc.held
        rows.append(
            GpuUsageHour(
                gpu_id=gpu_id,
                hour=hour,
                gpu_model_id=models[gpu_id],
                project_id=acc_held.project_id if acc_held else None,
                reservation_id=acc_held.reservation_id if acc_held else None,
                user_id=acc_held.user_id if acc_held else None,
                minutes=acc.minutes,
                util_minutes=acc.util_minutes,
                util_mean=acc.util_sum / acc.util_minutes if acc.util_minutes else None,
                util_max=acc.util_max,
                fb_used_max_mib=acc.fb_max,
                power_mean_w=acc.power_sum / acc.power_minutes if acc.power_minutes else None,
                energy_wh=acc.energy_j / 3600.0,
                energy_from_counter=acc.from_counter,
                held_s=acc.held_s,
                idle_s=acc.idle_s,
                **{f"{p}_mean": acc.prof[p][1] / acc.prof[p][0] if acc.prof[p][0] else None for p in _PROF},
            )
        )
    GpuUsageHour.objects.filter(hour=hour).delete()
    GpuUsageHour.objects.bulk_create(rows, batch_size=2000)
    return len(rows)


@transaction.atomic
def rollup_pending(*, now: datetime | None = None, max_hours: int = 24) -> int:
    """Roll up the hours from the watermark to the last complete minute; returns how many hours it did.

    Minutes arrive a heartbeat late, so the cut lags ``ACCOUNTING_ROLLUP_LAG_S`` behind now.
    """
    now = now or timezone.now()
    lag = timedelta(seconds=float(getattr(settings, "ACCOUNTING_ROLLUP_LAG_S", 120)))
    upto = (now - lag).replace(second=0, microsecond=0)
    mark, _ = RollupWatermark.objects.get_or_create(name=WATERMARK)
    mark = RollupWatermark.objects.select_for_update().get(pk=mark.pk)
    start = mark.position
    if start is None:
        first = GpuTelemetryMinute.objects.order_by("minute").values_list("minute", flat=True).first()
        first_alloc = Allocation.objects.order_by("starts_at").values_list("starts_at", flat=True).first()
        candidates = [t for t in (first, first_alloc) if t is not None]
        if not candidates:
            return 0
        start = mark.position = hour_floor(min(candidates))
    done = 0
    hour = start
    while hour < upto and done < max_hours:
        rollup_hour(hour=hour, upto=upto)
        done += 1
        if hour + HOUR <= upto:
            mark.position = hour + HOUR  # complete: never redone
        hour += HOUR
    mark.updated_at = now
    mark.save(update_fields=["position", "updated_at"])
    return done
