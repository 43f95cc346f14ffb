"""Idle reclamation: a running reservation whose GPUs sat idle is warned, then cut short unless kept.

The rule (docs/efficiency.md, "Idle reclamation"), from the project's quota policy (``idle_util_percent``,
``idle_minutes``, ``idle_grace_minutes``; any null: off):

* **Idle**: over the last ``idle_minutes`` whole minutes (all inside the reservation's allocations), *every*
  GPU's mean utilization is under ``idle_util_percent``. Each GPU, not the mean across them: a job busy on one
  GPU of eight is working, and cutting it would be the worse mistake.
* **Known**: every GPU has utilization readings for at least ``COVERAGE`` (90 %) of those minutes. Unknown or
  sparse readings are never idle.
* **Warning**: ``reservation_yield`` cuts the window to end ``idle_grace_minutes`` from now with that much
  notice (the container gets the warning file and SIGUSR1 now, SIGTERM at the cut end, as any yield), an
  event records it, and the listeners of ``register_on_idle_warning`` are told once the warning commits.
* **Keep**: ``idle_keep`` restores the booked end through the extension path (refused when the freed GPUs were
  booked meanwhile) and marks the reclamation kept: it is not reclaimed again in this window.
* **Release and refund**: unkept, dispatch stops the container at the cut end and its finish charges what ran
  and releases the rest of the hold (the ledger's settle). ``idle_mark_reclaimed`` then records the GPU-hours
  reclaimed, with an event, for the reports.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from controlplane.accounting.choices import IdleState
from controlplane.accounting.models import IdleReclamation
from controlplane.core.errors import Conflict
from controlplane.fleet.models import GpuTelemetryMinute
from controlplane.ledger.models import QuotaPolicy
from controlplane.ledger.services import actor_label_for, lock_project
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Allocation, Reservation, ReservationEvent
from controlplane.reservations.services import reservation_withdraw_yield, reservation_yield

log = logging.getLogger(__name__)

# The share of the idle span each GPU must have utilization readings for: below it, the GPU's use is unknown.
COVERAGE = 0.9
MINUTE = timedelta(minutes=1)

# -- listeners ----------------------------------------------------------------------------------------------
# Apps above accounting (notifications) subscribe in their AppConfig.ready(); each is called with the
# IdleReclamation once the warning has committed, so a failing listener never undoes the warning.
IdleListener = Callable[[IdleReclamation], None]
_on_idle_warning: list[IdleListener] = []
_on_idle_kept: list[IdleListener] = []


def register_on_idle_warning(listener: IdleListener) -> None:
    if listener not in _on_idle_warning:
        _on_idle_warning.append(listener)


def register_on_idle_kept(listener: IdleListener) -> None:
    if listener not in _on_idle_kept:
        _on_idle_kept.append(listener)


def _tell(listeners: list[IdleListener], reclamation: IdleReclamation) -> None:
    def notify() -> None:
        for listener in list(listeners):
            try:
                listener(reclamation)
            except Exception:  # a listener's failure is its own; the reclamation stands
                log.exception("idle listener %r failed for reservation %s", listener, reclamation.reservation_id)

    transaction.on_commit(notify)


# -- finding idle reservations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdleFinding:
    reservation: Reservation
    policy: QuotaPolicy
    util_percent: float  # the highest GPU's mean over the span


def _floor_minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def idle_candidates(*, now: datetime) -> list[IdleFinding]:
    """Running reservations idle by their project's policy as of ``now``.

    One query for the candidates and their policies, one for their allocations, and one aggregate over the
    telemetry minutes per distinct ``idle_minutes`` among the policies (usually one): the cost is bounded by
    the running reservations' GPUs, not by the telemetry's history.
    """
    span_end = _floor_minute(now)
    reservations = list(
        Reservation.objects.filter(
            state=ReservationState.RUNNING,
            yield_notice_seconds__isnull=True,  # already being cut (a preemption, or warned)
            idle_reclamation__isnull=True,
            project__quota_policy__idle_util_percent__isnull=False,
            project__quota_policy__idle_minutes__isnull=False,
            project__quota_policy__idle_grace_minutes__isnull=False,
        ).select_related("project__quota_policy")
    )
    if not reservations:
        return []
    allocations: dict[int, list[Allocation]] = defaultdict(list)
    for allocation in Allocation.objects.filter(reservation__in=reservations, active=True):
        allocations[allocation.reservation_id].append(allocation)
    by_span: dict[int, list[Reservation]] = defaultdict(list)
    for reservation in reservations:
        policy = reservation.project.quota_policy
        assert policy.idle_minutes is not None and policy.idle_grace_minutes is not None
        span_start = span_end - policy.idle_minutes * MINUTE
        held = allocations.get(reservation.pk, [])
        # The whole span inside every allocation (the minute a booking began also holds the previous
        # holder's samples), and something left to reclaim after the grace.
        if (
            held
            and all(a.starts_at <= span_start for a in held)
            and reservation.ends_at > now + policy.idle_grace_minutes * MINUTE
        ):
            by_span[policy.idle_minutes].append(reservation)
    found: list[IdleFinding] = []
    for minutes, group in by_span.items():
        span_start = span_end - minutes * MINUTE
        gpu_ids = [a.gpu_id for r in group for a in allocations[r.pk]]
        rows = (
            GpuTelemetryMinute.objects.filter(gpu_id__in=gpu_ids, minute__gte=span_start, minute__lt=span_end)
            .values("gpu_id")
            .annotate(
                util=Sum("util_sum"), samples=Sum("util_samples"), covered=Count("id", filter=Q(util_samples__gt=0))
            )
        )
        stats = {row["gpu_id"]: row for row in rows}
        needed = math.ceil(COVERAGE * minutes)
        for reservation in group:
            policy = reservation.project.quota_policy
            means: list[float] = []
            for allocation in allocations[reservation.pk]:
                row = stats.get(allocation.gpu_id)
                if row is None or row["covered"] < needed or not row["samples"]:
                    break  # unknown is not idle
                means.append(row["util"] / row["samples"])
            else:
                highest = max(means)
                if Decimal(str(highest)) < Decimal(policy.idle_util_percent or 0):
                    found.append(IdleFinding(reservation=reservation, policy=policy, util_percent=highest))
    return found


# -- the steps ----------------------------------------------------------------------------------------------


def _event(reservation: Reservation, *, actor: Any, reason: str, at: datetime, data: dict[str, Any]) -> None:
    ReservationEvent.objects.create(
        reservation=reservation,
        from_state=reservation.state,
        to_state=reservation.state,
        actor=actor if getattr(actor, "pk", None) else None,
        actor_label=actor_label_for(actor),
        reason=reason,
        data=data,
        at=at,
    )


@transaction.atomic
def idle_warn(*, finding: IdleFinding, now: datetime) -> IdleReclamation | None:
    """Warn and cut one idle reservation; None when it was warned already or can no longer be cut."""
    policy = finding.policy
    assert policy.idle_util_percent is not None and policy.idle_minutes is not None
    assert policy.idle_grace_minutes is not None
    lock_project(project_id=finding.reservation.project_id)
    current = Reservation.objects.select_for_update().get(pk=finding.reservation.pk)
    if (
        current.state != ReservationState.RUNNING
        or current.yield_notice_seconds is not None
        or IdleReclamation.objects.filter(reservation=current).exists()
    ):
        return None  # another run (or a preemption) got there first
    grace_s = policy.idle_grace_minutes * 60
    cut = now + timedelta(seconds=grace_s)
    booked_end = current.ends_at
    threshold = Decimal(policy.idle_util_percent).normalize()
    reason = (
        f"idle: mean utilization {finding.util_percent:.1f}% < {threshold:f}% for {policy.idle_minutes} min; "
        f"keep it to stay"
    )
    try:
        with transaction.atomic():
            reservation_yield(
                reservation=current, end_at=cut, notice_seconds=grace_s, reason=reason, by=None, actor=None, now=now
            )
            reclamation = IdleReclamation.objects.create(
                reservation=current,
                project_id=current.project_id,
                warned_at=now,
                util_percent=finding.util_percent,
                threshold_percent=policy.idle_util_percent,
                idle_minutes=policy.idle_minutes,
                booked_ends_at=booked_end,
                cut_ends_at=cut,
                gpu_count=current.allocations.filter(active=True).count(),
            )
    except (Conflict, IntegrityError):
        return None
    current.refresh_from_db()
    _event(
        current,
        actor=None,
        reason=f"idle warning: {reason}",
        at=now,
        data={
            "idle": "warned",
            "util_percent": round(finding.util_percent, 2),
            "threshold_percent": str(threshold),
            "idle_minutes": policy.idle_minutes,
            "booked_ends_at": booked_end.isoformat(),
            "ends_at": cut.isoformat(),
        },
    )
    _tell(_on_idle_warning, reclamation)
    return reclamation


@transaction.atomic
def idle_keep(*, reservation: Reservation, actor: Any, now: datetime | None = None) -> Reservation:
    """ "Keep it": restore the end an idle warning cut, and never reclaim this window again.

    Conflict ``nothing_to_keep`` when no warning is pending (none, kept already, or the grace has passed);
    Conflict ``gpu_taken`` (from the extension) when someone booked the freed GPUs meanwhile; quota errors
    as any extension. Nothing is written on a refusal.
    """
    now = now or timezone.now()
    lock_project(project_id=reservation.project_id)
    reclamation = IdleReclamation.objects.select_for_update().filter(reservation_id=reservation.pk).first()
    if reclamation is None or reclamation.state != IdleState.WARNED:
        raise Conflict("This reservation has no idle warning to answer.", code="nothing_to_keep")
    if now >= reclamation.cut_ends_at:
        raise Conflict(
            f"The grace ended at {reclamation.cut_ends_at.isoformat()}; the GPUs were released.",
            code="nothing_to_keep",
        )
    kept = reservation_withdraw_yield(
        reservation=reservation,
        ends_at=reclamation.booked_ends_at,
        actor=actor,
        reason="kept after an idle warning",
        now=now,
    )
    updated = IdleReclamation.objects.filter(pk=reclamation.pk, state=IdleState.WARNED).update(
        state=IdleState.KEPT, kept_at=now, kept_by=actor if getattr(actor, "pk", None) else None
    )
    if updated != 1:  # under the project lock this cannot race; say so loudly if it ever does
        raise Conflict("The idle warning changed while it was being kept; try again.", code="nothing_to_keep")
    _event(
        kept,
        actor=actor,
        reason="idle warning answered: kept",
        at=now,
        data={"idle": "kept", "ends_at": reclamation.booked_ends_at.isoformat()},
    )
    reclamation.refresh_from_db()
    _tell(_on_idle_kept, reclamation)
    return kept


def idle_mark_reclaimed(*, now: datetime) -> int:
    """Record, one at a time, the warnings whose grace passed unkept: the GPUs were released at the cut end."""
    done = 0
    for pk in IdleReclamation.objects.filter(state=IdleState.WARNED, cut_ends_at__lte=now).values_list("pk", flat=True):
        with transaction.atomic():
            if (
                IdleReclamation.objects.filter(pk=pk, state=IdleState.WARNED).update(
                    state=IdleState.RECLAIMED, reclaimed_at=now
                )
                != 1
            ):
                continue  # kept or marked by another run meanwhile
            reclamation = IdleReclamation.objects.select_related("reservation").get(pk=pk)
            _event(
                reclamation.reservation,
                actor=None,
                reason=f"idle reclamation: {reclamation.reclaimed_gpu_hours:.2f} GPU-hours released",
                at=now,
                data={
                    "idle": "reclaimed",
                    "gpu_hours": round(reclamation.reclaimed_gpu_hours, 4),
                    "booked_ends_at": reclamation.booked_ends_at.isoformat(),
                    "ends_at": reclamation.cut_ends_at.isoformat(),
                },
            )
            done += 1
    return done


def idle_reclaim_pass(*, now: datetime | None = None) -> int:
    """The beat task's body: warn each idle reservation (one transaction each), then record the reclaimed.
    Idempotent: a reservation is warned at most once per window. Returns how many steps it took."""
    now = now or timezone.now()
    warned = 0
    for finding in idle_candidates(now=now):
        if idle_warn(finding=finding, now=now) is not None:
            warned += 1
    return warned + idle_mark_reclaimed(now=now)


# -- reports ------------------------------------------------------------------------------------------------


def reclaimed_gpu_hours(*, project_ids: list[int] | None, start: datetime, end: datetime) -> dict[int, float]:
    """GPU-hours reclaimed per project, for reclamations whose cut end lies in ``[start, end)``."""
    qs = IdleReclamation.objects.filter(state=IdleState.RECLAIMED, cut_ends_at__gte=start, cut_ends_at__lt=end)
    if project_ids is not None:
        qs = qs.filter(project_id__in=project_ids)
    totals: dict[int, float] = defaultdict(float)
    for reclamation in qs.only("project_id", "gpu_count", "booked_ends_at", "cut_ends_at"):
        totals[reclamation.project_id] += reclamation.reclaimed_gpu_hours
    return dict(totals)


def pending_warning(reservation: Reservation) -> IdleReclamation | None:
    """The idle warning a reservation's people may still answer with "keep it", if any."""
    return IdleReclamation.objects.filter(reservation=reservation, state=IdleState.WARNED).first()
