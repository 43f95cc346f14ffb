"""Builders for accounting tests: past reservations that really ran (launches), and minute telemetry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from controlplane.accounting.services import measured_gpu_seconds, usage_record_reservation
from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch
from controlplane.fleet.models import GpuTelemetryMinute
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from controlplane.reservations.services import reservation_create, reservation_finish
from controlplane.reservations.specs import Window
from tests.reservations.fleet import CONTAINER, spec


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def book(
    project: Any, model: Any, start: datetime, end: datetime, *, count: int = 1, actor: Any = None, name: str = "job"
) -> Reservation:
    """A booking made an hour before its window (so "now" is not in the way)."""
    return reservation_create(
        project=project,
        name=name,
        spec=spec(model, count=count),
        window=Window(start, end),
        container=CONTAINER,
        actor=actor,
        now=start - timedelta(hours=1),
    )


def ran(
    reservation: Reservation, started: datetime, finished: datetime | None, state: str = LaunchState.EXITED
) -> Launch:
    """The agent reported the reservation's container running from ``started`` to ``finished`` on its GPUs."""
    uuids = list(reservation.allocations.values_list("gpu__uuid", flat=True))
    server_id = reservation.allocations.values_list("gpu__server_id", flat=True).first()
    return Launch.objects.create(
        reservation=reservation,
        server_id=server_id,
        gpu_uuids=uuids,
        state=state,
        started_at=started,
        finished_at=finished,
    )


def finish(reservation: Reservation, *, ended_at: datetime, to: str = ReservationState.COMPLETED) -> Reservation:
    """What dispatch does: settle with the GPU-seconds measured from the launches, then record the usage."""
    reservation.refresh_from_db()
    reservation_finish(
        reservation=reservation,
        to=to,
        ended_at=ended_at,
        actor_label="system:test",
        reason="ended",
        used_gpu_seconds_by_gpu=measured_gpu_seconds(reservation=reservation, now=ended_at),
    )
    usage_record_reservation(reservation=reservation)
    reservation.refresh_from_db()
    return reservation


def charged(reservation_or_project: Any) -> Decimal:
    qs = LedgerEntry.objects.filter(kind=EntryKind.CHARGE)
    if isinstance(reservation_or_project, Reservation):
        qs = qs.filter(reservation=reservation_or_project)
    else:
        qs = qs.filter(project=reservation_or_project)
    return -sum((e.amount for e in qs), Decimal(0))


def telemetry(
    gpu_id: int,
    start: datetime,
    minutes: int,
    *,
    util: float | None = 50.0,
    power_w: float | None = 300.0,
    energy_counter: bool = False,
    fb_mib: float | None = 1000.0,
    profiling: tuple[float, float, float] | None = None,
) -> None:
    """Minute rows as the heartbeat ingest writes them, 60 samples each. ``profiling``: DCGM's SM active,
    tensor pipe active and DRAM active ratios on every sample (None: a GPU without GPM, as the ingest leaves it)."""
    rows = []
    for i in range(minutes):
        minute = start + timedelta(minutes=i)
        energy = (1_000_000.0 + (i + 1) * (power_w or 0) * 60_000.0) if energy_counter else None
        rows.append(
            GpuTelemetryMinute(
                gpu_id=gpu_id,
                minute=minute,
                samples=60,
                util_samples=60 if util is not None else 0,
                util_sum=(util or 0.0) * 60,
                util_max=util,
                fb_used_max_mib=fb_mib,
                power_samples=60 if power_w is not None else 0,
                power_sum_w=(power_w or 0.0) * 60,
                energy_first_mj=energy - power_w * 59_000.0 if energy is not None and power_w else energy,
                energy_last_mj=energy,
                **_profiling_columns(profiling),
            )
        )
    GpuTelemetryMinute.objects.bulk_create(rows)


def _profiling_columns(profiling: tuple[float, float, float] | None) -> dict[str, Any]:
    if profiling is None:
        return {}
    sm, tensor, dram = profiling
    return {
        "sm_active_samples": 60,
        "sm_active_sum": sm * 60,
        "tensor_active_samples": 60,
        "tensor_active_sum": tensor * 60,
        "dram_active_samples": 60,
        "dram_active_sum": dram * 60,
    }


def idle_warned(project: Any, model: Any, *, actor: Any = None, count: int = 1, warn: bool = True) -> Reservation:
    """A reservation of ``project`` running since half an hour ago, idle all along (simulated telemetry at 0 %),
    with a policy of 5 % for 30 minutes and a 15-minute grace: the reclaimer has just warned it (``warn``)."""
    from django.utils import timezone

    from controlplane.accounting.reclaim import idle_reclaim_pass
    from controlplane.ledger.services import quota_policy_set
    from controlplane.reservations.services import reservation_mark

    quota_policy_set(
        project=project,
        actor=None,
        idle_util_percent=Decimal("5"),
        idle_minutes=30,
        idle_grace_minutes=15,
        fields={"idle_util_percent", "idle_minutes", "idle_grace_minutes"},
    )
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    reservation = book(project, model, start, start + timedelta(hours=3), count=count, actor=actor, name="idle")
    reservation_mark(
        reservation=reservation,
        from_states=[ReservationState.SCHEDULED],
        to=ReservationState.RUNNING,
        actor_label="system:test",
        reason="started",
        at=start,
    )
    for gpu_id in reservation.allocations.values_list("gpu_id", flat=True):
        telemetry(gpu_id, start, 30, util=0.0)
    if warn:
        assert idle_reclaim_pass(now=start + timedelta(minutes=30)) >= 1
    reservation.refresh_from_db()
    return reservation
