"""Writes to the ledger. Every write happens under the project's row lock and keeps the balance >= 0."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.core import rows
from controlplane.core.errors import Conflict, QuotaExceeded, ValidationFailed
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import CREDIT_PLACES, LedgerEntry, QuotaPolicy
from controlplane.ledger.selectors import ZERO, outstanding_hold, project_balance

_PROJECT = Project._meta.db_table


def credits(value: Decimal | float | int) -> Decimal:
    """Round up to the ledger's precision: a fraction of a credit is never given away by rounding."""
    return Decimal(value).quantize(CREDIT_PLACES, rounding=ROUND_CEILING)


def actor_label_for(actor: Any) -> str:
    if actor is None:
        return "system"
    return f"user:{actor.get_username()}"


def lock_project(*, project_id: int) -> None:
    """The per-project lock: bookings, extensions and ledger writes of one project go one at a time.

    Two concurrent bookings could otherwise both read the same balance and both pass the quota check.
    Raises Project.DoesNotExist for an unknown project. (SQLite has no row locks; its BEGIN IMMEDIATE
    already runs every writing transaction one at a time.)
    """
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {_PROJECT} WHERE id = %s{lock}", [project_id])  # noqa: S608 - name from metadata
        if cursor.fetchone() is None:
            raise Project.DoesNotExist(f"No project {project_id}.")


def _append(
    *,
    project_id: int,
    kind: EntryKind,
    amount: Decimal,
    reason: str,
    actor: Any = None,
    actor_label: str | None = None,
    reservation_id: int | None = None,
    period_key: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
    checked: bool = False,
) -> LedgerEntry:
    # Callers hold lock_project(), so the balance read here cannot change before the insert. ``checked``:
    # the caller read the balance under that same lock (check_quota) and it cannot have moved since.
    if amount < 0 and not checked:
        available = project_balance(project_id=project_id)
        if available + amount < 0:
            raise QuotaExceeded(
                f"The project has {available} credits left and this needs {-amount}.",
                extra={"quota": "credits", "needed": str(-amount), "available": str(available)},
            )
    entry = LedgerEntry(
        project_id=project_id,
        kind=kind,
        amount=amount,
        reason=reason,
        actor=actor if getattr(actor, "pk", None) else None,
        actor_label=actor_label or actor_label_for(actor),
        reservation_id=reservation_id,
        period_key=period_key,
        data=data or {},
        created_at=at or timezone.now(),
    )
    rows.insert([entry])
    return entry


def _positive(amount: Decimal, field: str = "amount") -> Decimal:
    if amount <= 0:
        raise ValidationFailed(f"{field}: must be greater than zero.", fields={field: ["Must be greater than zero."]})
    return credits(amount)


def _reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise ValidationFailed(
            "reason: an operator's change needs a reason.", fields={"reason": ["This field is required."]}
        )
    return reason


@transaction.atomic
def ledger_grant(*, project: Project, amount: Decimal, actor: Any, reason: str) -> LedgerEntry:
    """An operator grants credits to a project."""
    lock_project(project_id=project.pk)
    return _append(
        project_id=project.pk, kind=EntryKind.GRANT, amount=_positive(amount), reason=_reason(reason), actor=actor
    )


@transaction.atomic
def ledger_adjust(*, project: Project, amount: Decimal, actor: Any, reason: str) -> LedgerEntry:
    """An operator's correction, either sign; a negative one cannot take the balance below zero."""
    if amount == 0:
        raise ValidationFailed("amount: an adjustment cannot be zero.", fields={"amount": ["Must not be zero."]})
    lock_project(project_id=project.pk)
    return _append(
        project_id=project.pk, kind=EntryKind.ADJUST, amount=credits(amount), reason=_reason(reason), actor=actor
    )


@transaction.atomic
def ledger_refund(*, project: Project, reservation: Any, amount: Decimal, actor: Any, reason: str) -> LedgerEntry:
    """An operator gives back credits a reservation was charged (an outage, a faulty GPU)."""
    if reservation.project_id != project.pk:
        raise ValidationFailed(
            "reservation: belongs to another project.",
            fields={"reservation": ["The reservation belongs to another project."]},
        )
    amount = _positive(amount)
    lock_project(project_id=project.pk)
    charged = -sum((e.amount for e in LedgerEntry.objects.filter(reservation=reservation, kind=EntryKind.CHARGE)), ZERO)
    refunded = sum((e.amount for e in LedgerEntry.objects.filter(reservation=reservation, kind=EntryKind.REFUND)), ZERO)
    if amount > charged - refunded:
        raise ValidationFailed(
            f"amount: the reservation was charged {charged} and refunded {refunded}; at most "
            f"{charged - refunded} can be refunded.",
            fields={"amount": [f"At most {charged - refunded} can be refunded."]},
        )
    return _append(
        project_id=project.pk,
        kind=EntryKind.REFUND,
        amount=amount,
        reason=_reason(reason),
        actor=actor,
        reservation_id=reservation.pk,
    )


def period_key_for(when: datetime) -> str:
    return when.strftime("%Y-%m")


@transaction.atomic
def ledger_grant_period(*, project: Project, when: datetime | None = None) -> LedgerEntry | None:
    """Grant the policy's credits for the period holding ``when``, once; None when already granted or nothing to grant.

    A unique constraint on (project, period key) makes a second run, even a concurrent one, a no-op.
    """
    lock_project(project_id=project.pk)
    policy = QuotaPolicy.objects.filter(project=project).first()
    if policy is None or policy.credits_per_period <= 0:
        return None
    key = period_key_for(when or timezone.now())
    if LedgerEntry.objects.filter(project=project, kind=EntryKind.GRANT, period_key=key).exists():
        return None
    try:
        with transaction.atomic():
            return _append(
                project_id=project.pk,
                kind=EntryKind.GRANT,
                amount=policy.credits_per_period,
                reason=f"credits for {key}",
                actor_label="system:period-grant",
                period_key=key,
            )
    except IntegrityError:
        return None


@transaction.atomic
def quota_policy_set(
    *,
    project: Project,
    actor: Any,
    credits_per_period: Decimal | None = None,
    max_concurrent_gpus: int | None = None,
    max_reservation_hours: Decimal | None = None,
    fields: set[str] | None = None,
) -> QuotaPolicy:
    """Create or change a project's policy. ``fields`` names what to change (all three when None)."""
    lock_project(project_id=project.pk)
    policy, _ = QuotaPolicy.objects.get_or_create(project=project)
    values = {
        "credits_per_period": credits_per_period,
        "max_concurrent_gpus": max_concurrent_gpus,
        "max_reservation_hours": max_reservation_hours,
    }
    for name in fields if fields is not None else set(values):
        if name == "credits_per_period" and values[name] is None:
            continue
        setattr(policy, name, values[name])
    policy.updated_at = timezone.now()
    policy.updated_by = actor
    policy.full_clean()
    policy.save()
    return policy


_QUOTA_STATE_SQL = (
    f"SELECT (SELECT max_concurrent_gpus FROM {QuotaPolicy._meta.db_table} WHERE project_id = %s), "  # noqa: S608 - names from metadata
    f"(SELECT max_reservation_hours FROM {QuotaPolicy._meta.db_table} WHERE project_id = %s), "
    f"(SELECT SUM(amount) FROM {LedgerEntry._meta.db_table} WHERE project_id = %s)"
)


@dataclass(frozen=True)
class QuotaNeed:
    """What one booking (or extension) asks of the quota."""

    credits: Decimal
    # The project's GPUs in use at the busiest moment of the window, this one included. A callable is only
    # called when the project has a concurrency cap: counting reads every overlapping allocation.
    peak_concurrent_gpus: int | Callable[[], int]
    hours: Decimal  # the reservation's whole length after the change


def _quota_state(project_id: int) -> tuple[int | None, Decimal | None, Decimal]:
    """The caps of the project's policy (None: no cap) and its balance, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(_QUOTA_STATE_SQL, [project_id, project_id, project_id])
        max_gpus, max_hours, total = cursor.fetchone()
    hours_places = QuotaPolicy._meta.get_field("max_reservation_hours").decimal_places  # type: ignore[union-attr]
    balance = rows.decimal(total, CREDIT_PLACES) if total is not None else ZERO.quantize(CREDIT_PLACES)
    assert balance is not None
    return max_gpus, rows.decimal(max_hours, Decimal(1).scaleb(-hours_places)), balance


def check_quota(*, project_id: int, need: QuotaNeed) -> None:
    """Refuse with QuotaExceeded naming the quota, what is needed and what is left. Caller holds lock_project()."""
    max_gpus, max_hours, available = _quota_state(project_id)
    if max_hours is not None and need.hours > max_hours:
        raise QuotaExceeded(
            f"A reservation may last at most {max_hours} hours; this one lasts {need.hours}.",
            extra={"quota": "max_reservation_hours", "needed": str(need.hours), "available": str(max_hours)},
        )
    if max_gpus is not None:
        peak = need.peak_concurrent_gpus() if callable(need.peak_concurrent_gpus) else need.peak_concurrent_gpus
        if peak > max_gpus:
            raise QuotaExceeded(
                f"The project may hold at most {max_gpus} GPUs at once; this window would need {peak}.",
                extra={"quota": "max_concurrent_gpus", "needed": peak, "available": max_gpus},
            )
    if need.credits > available:
        raise QuotaExceeded(
            f"The project has {available} credits left and this needs {need.credits}.",
            extra={"quota": "credits", "needed": str(need.credits), "available": str(available)},
        )


def ledger_hold(
    *,
    project_id: int,
    reservation_id: int,
    amount: Decimal,
    actor: Any,
    reason: str,
    data: dict[str, Any] | None = None,
    checked: bool = False,
) -> LedgerEntry | None:
    """Hold credits for a booked window. Caller holds lock_project() and runs inside its transaction;
    ``checked`` when it passed check_quota() for this amount under that lock."""
    amount = credits(amount)
    if amount == 0:
        return None
    return _append(
        project_id=project_id,
        kind=EntryKind.HOLD,
        amount=-amount,
        reason=reason,
        actor=actor,
        reservation_id=reservation_id,
        data=data,
        checked=checked,
    )


def ledger_settle(
    *,
    project_id: int,
    reservation_id: int,
    used: Decimal,
    actor: Any = None,
    actor_label: str | None = None,
    reason: str,
) -> tuple[LedgerEntry | None, LedgerEntry | None]:
    """Replace a reservation's hold by a charge for what it used, releasing the rest.

    The hold is released in full and the charge taken after it, so the ledger shows both facts. A charge
    above what the project can pay (a container that ran past its window) is capped at the balance and the
    shortfall recorded in the entry's data: the balance never goes below zero.
    Caller holds lock_project().
    """
    held = outstanding_hold(reservation_id=reservation_id)
    release = None
    if held > 0:
        release = _append(
            project_id=project_id,
            kind=EntryKind.RELEASE,
            amount=held,
            reason=reason,
            actor=actor,
            actor_label=actor_label,
            reservation_id=reservation_id,
        )
    used = credits(used) if used > 0 else ZERO
    if used == 0:
        return release, None
    available = project_balance(project_id=project_id)
    charged = min(used, available)
    data = {"used": str(used)}
    if charged < used:
        data["uncharged"] = str(used - charged)
    if charged == 0:
        # Nothing left to take; keep a zero charge so the shortfall is on the record.
        charged = ZERO
    charge = _append(
        project_id=project_id,
        kind=EntryKind.CHARGE,
        amount=-charged,
        reason=reason,
        actor=actor,
        actor_label=actor_label,
        reservation_id=reservation_id,
        data=data,
    )
    return release, charge


def assert_not_settled(*, reservation_id: int) -> None:
    if LedgerEntry.objects.filter(reservation_id=reservation_id, kind=EntryKind.CHARGE).exists():
        raise Conflict("The reservation has already been settled.")
