"""Budgets: a project's spending cap per period, its alerts at 80, 95 and 100 %, and per-member GPU-hour caps.

Spending in a period is what the project has committed: the charges written in the period plus the credits
held now for booked windows (they will be charged or given back). A booking counts as soon as it is held, so
a cap is met before the work runs, not a month later; a settlement swaps a hold for a charge and moves the
figure only by what it charges beyond the hold.

Everything here runs under the project's lock (``services.lock_project``), in the booking's or the charge's
transaction: two bookings cannot both pass the cap, and a threshold's crossing is found by one of them only.
The unique constraint on ``BudgetAlert`` is the last word on "exactly once".

Alerts are rows here; telling people about them belongs to the notifications app, above this one, which
registers a listener (``register_alert_listener``) in its ``AppConfig.ready()``. Listeners are called after
the transaction commits, once per new alert: a refused or rolled-back booking alerts nobody.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from controlplane.core.errors import QuotaExceeded
from controlplane.core.hooks import RequiredHook
from controlplane.ledger.choices import BUDGET_THRESHOLDS, BudgetAction, EntryKind
from controlplane.ledger.models import CREDIT_PLACES, BudgetAlert, LedgerEntry, MemberCap, QuotaPolicy
from controlplane.ledger.selectors import sum_sql, summed

logger = logging.getLogger(__name__)

_ENTRY = LedgerEntry._meta.db_table

AlertListener = Callable[[BudgetAlert], None]
_listeners: list[AlertListener] = []


def register_alert_listener(listener: AlertListener) -> None:
    """Call ``listener(alert)`` after commit for each threshold crossing recorded (the notifications app)."""
    if listener not in _listeners:
        _listeners.append(listener)


def unregister_alert_listener(listener: AlertListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def _notify(alert: BudgetAlert) -> None:
    for listener in list(_listeners):
        try:
            listener(alert)
        except Exception:  # a listener's failure must not undo or hide the alert, nor stop the next listener
            logger.exception("budget alert listener %r failed for alert %s", listener, alert.pk)


# -- Periods ---------------------------------------------------------------------------------------------------


def period_bounds(when: datetime) -> tuple[datetime, datetime]:
    """The UTC month holding ``when``: [start, end)."""
    start = when.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def period_key(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m")


# -- Reads -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caps:
    """The budget caps that apply to one booking, read with the quota's other caps (one query)."""

    budget: Decimal | None = None
    action: str = BudgetAction.REFUSE
    member_gpu_hours: Decimal | None = None


def caps_sql() -> str:
    """Select-list columns of the project's budget, its action and the member's GPU-hour cap; parameters:
    project id, project id, project id, member id (None: no row)."""
    policy, cap = QuotaPolicy._meta.db_table, MemberCap._meta.db_table
    return (
        f"(SELECT budget_credits FROM {policy} WHERE project_id = %s), "  # noqa: S608 - names from metadata
        f"(SELECT budget_action FROM {policy} WHERE project_id = %s), "
        f"(SELECT gpu_hours_per_period FROM {cap} WHERE project_id = %s AND user_id = %s)"
    )


def caps_from(budget: Any, action: Any, member_hours: Any) -> Caps:
    return Caps(
        budget=None if budget is None else Decimal(str(budget)).quantize(CREDIT_PLACES),
        action=action or BudgetAction.REFUSE,
        member_gpu_hours=None if member_hours is None else Decimal(str(member_hours)).quantize(Decimal("0.01")),
    )


def spent(*, project_id: int, when: datetime) -> Decimal:
    """Credits committed in the period holding ``when``: its charges plus what is held now. One query."""
    start, end = period_bounds(when)
    charges = sum_sql("CASE WHEN kind = %s AND created_at >= %s AND created_at < %s THEN amount END")
    held = sum_sql("CASE WHEN kind IN (%s, %s) THEN amount END")
    sql = f"SELECT {charges}, {held} FROM {_ENTRY} WHERE project_id = %s"  # noqa: S608 - names from metadata
    with connection.cursor() as cursor:
        cursor.execute(
            sql, [EntryKind.CHARGE.value, start, end, EntryKind.HOLD.value, EntryKind.RELEASE.value, project_id]
        )
        charged, held_sum = cursor.fetchone()
    return -(summed(charged) + summed(held_sum)) + Decimal(0).quantize(CREDIT_PLACES)


# What a member's reservations hold is the reservations app's to read (it sits above the ledger): it fills
# this hook in its AppConfig.ready(). (project_id, user_id, start, end, exclude_reservation_id) -> GPU-hours.
member_gpu_hours: RequiredHook[..., Decimal] = RequiredHook(
    "ledger.member_gpu_hours", provider="controlplane.reservations"
)


# -- The booking's check and the alerts ------------------------------------------------------------------------


def check(
    *,
    project_id: int,
    caps: Caps,
    credits: Decimal,
    member_id: int | None,
    window: tuple[datetime, datetime] | None,
    gpus: int,
    probe: bool,
    booking_id: int | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Refuse (QuotaExceeded) a booking past the member's GPU-hour cap, or past the budget when its action is
    ``refuse``; return the warnings of a booking past it when the action is ``warn``. Unless ``probe`` (a check
    with no hold after it), record the thresholds this booking crosses. Caller holds lock_project() and writes
    the hold for ``credits`` in the same transaction. Reads nothing when the project has neither cap."""
    now = now or timezone.now()
    if caps.member_gpu_hours is not None and member_id is not None and window is not None and gpus:
        _check_member(
            project_id=project_id,
            cap=caps.member_gpu_hours,
            member_id=member_id,
            window=window,
            gpus=gpus,
            booking_id=booking_id,
        )
    if caps.budget is None:
        return []
    before = spent(project_id=project_id, when=now)
    after = before + credits
    warnings: list[dict[str, Any]] = []
    if after > caps.budget and credits > 0:
        detail: dict[str, object] = {
            "quota": "budget",
            "needed": str(credits),
            "available": str(max(Decimal(0), caps.budget - before).quantize(CREDIT_PLACES)),
            "budget": str(caps.budget),
            "spent": str(before),
            "period": period_key(now),
        }
        message = (
            f"The project's budget for {period_key(now)} is {caps.budget} credits; {before} are spent or held "
            f"and this needs {credits}."
        )
        if caps.action == BudgetAction.REFUSE:
            raise QuotaExceeded(message, code="budget_exceeded", extra=detail)
        warnings.append({"code": "budget_exceeded", "message": message + " Booked anyway: the budget warns.", **detail})
    if not probe:
        record_crossings(project_id=project_id, budget=caps.budget, before=before, after=after, at=now)
    return warnings


def _check_member(
    *,
    project_id: int,
    cap: Decimal,
    member_id: int,
    window: tuple[datetime, datetime],
    gpus: int,
    booking_id: int | None,
) -> None:
    from django.contrib.auth import get_user_model

    begins, ends = window
    cursor_at = begins
    while cursor_at < ends:
        start, end = period_bounds(cursor_at)
        inside = max(0.0, (min(ends, end) - max(begins, start)).total_seconds())
        need = (Decimal(inside) * gpus / 3600).quantize(Decimal("0.01"))
        used = member_gpu_hours(
            project_id=project_id, user_id=member_id, start=start, end=end, exclude_reservation_id=booking_id
        )
        if used + need > cap:
            user = get_user_model().objects.filter(pk=member_id).values_list("username", flat=True).first()
            raise QuotaExceeded(
                f"{user} may book at most {cap} GPU-hours in this project in {period_key(start)}; they have "
                f"{used} and this needs {need}.",
                code="member_cap_exceeded",
                extra={
                    "quota": "member_gpu_hours",
                    "member": user,
                    "needed": str(need),
                    "available": str(max(Decimal(0), cap - used)),
                    "period": period_key(start),
                },
            )
        cursor_at = end


def record_crossings(
    *,
    project_id: int,
    budget: Decimal,
    before: Decimal,
    after: Decimal,
    at: datetime,
    reservation_id: int | None = None,
) -> list[BudgetAlert]:
    """Record each threshold that spending passes on its way from ``before`` to ``after`` and that the period
    has no alert for yet. Caller holds lock_project()."""
    key = period_key(at)
    crossed = [t for t in BUDGET_THRESHOLDS if after * 100 >= budget * t and before * 100 < budget * t]
    if not crossed:
        return []
    have = set(
        BudgetAlert.objects.filter(project_id=project_id, period_key=key, threshold__in=crossed).values_list(
            "threshold", flat=True
        )
    )
    made = []
    for threshold in crossed:
        if threshold in have:
            continue
        alert = BudgetAlert(
            project_id=project_id,
            period_key=key,
            threshold=threshold,
            spent=after,
            budget=budget,
            reservation_id=reservation_id,
            at=at,
        )
        try:
            with transaction.atomic():
                alert.save()
        except IntegrityError:  # the lock makes this unreachable; the constraint keeps it true regardless
            continue
        made.append(alert)
        transaction.on_commit(lambda alert=alert: _notify(alert))  # type: ignore[misc]
    return made


def after_charge(*, project_id: int, amount: Decimal, reservation_id: int | None, at: datetime) -> None:
    """A charge of ``amount`` (> 0) was just written: record the thresholds it took spending past. A charge
    swaps a hold for itself first, so only what it takes beyond the hold released with it can cross one; the
    figure before is read back from the figure after. Reads one row when the project has no budget."""
    if amount <= 0:
        return
    budget = (
        QuotaPolicy.objects.filter(project_id=project_id, budget_credits__isnull=False)
        .values_list("budget_credits", flat=True)
        .first()
    )
    if budget is None:
        return
    after = spent(project_id=project_id, when=at)
    record_crossings(
        project_id=project_id, budget=budget, before=after - amount, after=after, at=at, reservation_id=reservation_id
    )


def status(*, project_id: int, now: datetime | None = None) -> dict[str, Any]:
    """The budget of the period holding ``now``: cap, action, spent or held, share and the period's alerts."""
    from controlplane.accounts.models import Project

    now = now or timezone.now()
    policy = QuotaPolicy.objects.filter(project_id=project_id).first()
    budget = policy.budget_credits if policy else None
    used = spent(project_id=project_id, when=now)
    key = period_key(now)
    return {
        "project": Project.objects.values_list("slug", flat=True).get(pk=project_id),
        "period": key,
        "budget": budget,
        "action": policy.budget_action if policy else BudgetAction.REFUSE,
        "spent": used,
        "share": float(used / budget) if budget else None,
        "alerts": list(
            BudgetAlert.objects.filter(project_id=project_id, period_key=key)
            .select_related("project", "reservation")
            .order_by("threshold")
        ),
    }
