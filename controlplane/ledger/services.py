"""Writes to the ledger. Every write happens under the project's row lock, keeps the balance >= 0 and keeps
every total within CREDIT_LIMIT (``credit_room``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from controlplane.accounts.models import Membership, Project
from controlplane.core import rows
from controlplane.core.errors import Conflict, DomainError, QuotaExceeded, ValidationFailed
from controlplane.ledger import budgets
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import CREDIT_LIMIT, CREDIT_PLACES, LedgerEntry, MemberCap, QuotaPolicy
from controlplane.ledger.selectors import (
    ZERO,
    LedgerTotals,
    ledger_totals,
    outstanding_hold,
    totals_from,
    totals_sql,
)

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


# owned (balance + held) = grant + charge + refund + adjust: a hold or a release only moves credits between
# the balance and what is held.
_OWNED_KINDS = frozenset({EntryKind.GRANT, EntryKind.CHARGE, EntryKind.REFUND, EntryKind.ADJUST})
_TOTAL_NAMES = {
    EntryKind.GRANT: "grants",
    EntryKind.HOLD: "holds",
    EntryKind.CHARGE: "charges",
    EntryKind.RELEASE: "releases",
    EntryKind.REFUND: "refunds",
    EntryKind.ADJUST: "adjustments",
}


@dataclass(frozen=True)
class Room:
    """The largest entry a project's ledger can take now, and the total that sets it."""

    credits: Decimal
    total: str  # "grants", "holds", ... or "credits" (the balance plus what is held)


def credit_room(totals: LedgerTotals, *, kind: str, negative: bool) -> Room:
    """How large an entry of ``kind`` and that sign can be, so that every total the ledger shows stays within
    +-CREDIT_LIMIT: its kind's total, and the balance plus what is held (``owned``), which bounds both the
    balance and ``held`` since neither is below zero.

    Only a total the entry moves away from zero can refuse it: one already past the limit (written before
    there was one) still takes entries that bring it back.
    """
    sign = -1 if negative else 1
    room = Room(max(ZERO, CREDIT_LIMIT - sign * totals.by_kind[kind]), _TOTAL_NAMES[EntryKind(kind)])
    if kind in _OWNED_KINDS:
        owned = max(ZERO, CREDIT_LIMIT - sign * totals.owned)
        if owned < room.credits:
            room = Room(owned, "credits")
    return room


def _beyond_limit(kind: str, amount: Decimal, room: Room) -> DomainError:
    what = "balance plus held credits" if room.total == "credits" else room.total
    message = (
        f"This would take the project's {what} past {CREDIT_LIMIT} credits, the most its ledger records; "
        f"at most {room.credits} fits."
    )
    if kind == EntryKind.HOLD:
        # A booking or an extension: refused as a quota is, and the client sees which one.
        return QuotaExceeded(
            message, extra={"quota": "ledger_limit", "needed": str(-amount), "available": str(room.credits)}
        )
    return ValidationFailed(
        f"amount: {message}",
        code="ledger_limit",
        fields={"amount": [message]},
        extra={"limit": str(CREDIT_LIMIT), "available": str(room.credits)},
    )


def _refuse_unless_it_fits(*, project_id: int, kind: str, amount: Decimal) -> None:
    totals = ledger_totals(project_id=project_id)
    if amount < 0 and totals.balance + amount < 0:
        raise QuotaExceeded(
            f"The project has {totals.balance} credits left and this needs {-amount}.",
            extra={"quota": "credits", "needed": str(-amount), "available": str(totals.balance)},
        )
    room = credit_room(totals, kind=kind, negative=amount < 0)
    if abs(amount) > room.credits:
        raise _beyond_limit(kind, amount, room)


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
    # Callers hold lock_project(), so the totals read here cannot change before the insert. ``checked``: the
    # caller read them under that same lock (check_quota, a capped charge or grant) and they cannot have
    # moved since.
    if not checked:
        _refuse_unless_it_fits(project_id=project_id, kind=kind, amount=amount)
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


def _amount(amount: Decimal, *, positive: bool) -> Decimal:
    """An operator's amount, refused unless it is within the ledger's range (before rounding, which cannot
    take a number of more than 28 digits)."""
    if not Decimal(amount).is_finite() or abs(amount) > CREDIT_LIMIT:
        message = f"Must be at most {CREDIT_LIMIT} credits" + ("." if positive else " either way.")
        raise ValidationFailed(f"amount: {message}", fields={"amount": [message]})
    if positive and amount <= 0:
        raise ValidationFailed("amount: must be greater than zero.", fields={"amount": ["Must be greater than zero."]})
    value = credits(amount)
    if value == 0:  # an adjustment of -0.00001 rounds up to nothing
        raise ValidationFailed("amount: an adjustment cannot be zero.", fields={"amount": ["Must not be zero."]})
    return value


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
    amount = _amount(amount, positive=True)
    lock_project(project_id=project.pk)
    return _append(project_id=project.pk, kind=EntryKind.GRANT, amount=amount, reason=_reason(reason), actor=actor)


@transaction.atomic
def ledger_adjust(*, project: Project, amount: Decimal, actor: Any, reason: str) -> LedgerEntry:
    """An operator's correction, either sign; a negative one cannot take the balance below zero."""
    amount = _amount(amount, positive=False)
    lock_project(project_id=project.pk)
    return _append(project_id=project.pk, kind=EntryKind.ADJUST, amount=amount, reason=_reason(reason), actor=actor)


@transaction.atomic
def ledger_refund(*, project: Project, reservation: Any, amount: Decimal, actor: Any, reason: str) -> LedgerEntry:
    """An operator gives back credits a reservation was charged (an outage, a faulty GPU)."""
    if reservation.project_id != project.pk:
        raise ValidationFailed(
            "reservation: belongs to another project.",
            fields={"reservation": ["The reservation belongs to another project."]},
        )
    amount = _amount(amount, positive=True)
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


# A storage charge (controlplane/access/storage.py) is a charge with no reservation, ``data.kind`` "storage",
# and the UTC hour it pays for as its period key ("2026-11-03T14"), which sorts as the hours do.
STORAGE_DATA_KIND = "storage"


def hour_key_for(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H")


@transaction.atomic
def ledger_grant_period(*, project: Project, when: datetime | None = None) -> LedgerEntry | None:
    """Grant the policy's credits for the period holding ``when``, once; None when already granted or nothing to grant.

    A unique constraint on (project, period key) makes a second run, even a concurrent one, a no-op. A grant
    that would take a total past CREDIT_LIMIT is cut to what fits (perhaps zero) and the rest recorded in
    its ``data.ungranted``: refusing it would leave the period ungranted, and the task would pick the same
    project again on every run.
    """
    lock_project(project_id=project.pk)
    policy = QuotaPolicy.objects.filter(project=project).first()
    if policy is None or policy.credits_per_period <= 0:
        return None
    key = period_key_for(when or timezone.now())
    if LedgerEntry.objects.filter(project=project, kind=EntryKind.GRANT, period_key=key).exists():
        return None
    room = credit_room(ledger_totals(project_id=project.pk), kind=EntryKind.GRANT, negative=False)
    amount = min(policy.credits_per_period, room.credits)
    data = {} if amount == policy.credits_per_period else {"ungranted": str(policy.credits_per_period - amount)}
    try:
        with transaction.atomic():
            return _append(
                project_id=project.pk,
                kind=EntryKind.GRANT,
                amount=amount,
                reason=f"credits for {key}",
                actor_label="system:period-grant",
                period_key=key,
                data=data,
                checked=True,
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
    budget_credits: Decimal | None = None,
    budget_action: str | None = None,
    idle_util_percent: Decimal | None = None,
    idle_minutes: int | None = None,
    idle_grace_minutes: int | None = None,
    fields: set[str] | None = None,
) -> QuotaPolicy:
    """Create or change a project's policy. ``fields`` names what to change (all of them when None)."""
    lock_project(project_id=project.pk)
    policy, _ = QuotaPolicy.objects.get_or_create(project=project)
    values = {
        "credits_per_period": credits_per_period,
        "max_concurrent_gpus": max_concurrent_gpus,
        "max_reservation_hours": max_reservation_hours,
        "budget_credits": budget_credits,
        "budget_action": budget_action,
        "idle_util_percent": idle_util_percent,
        "idle_minutes": idle_minutes,
        "idle_grace_minutes": idle_grace_minutes,
    }
    for name in fields if fields is not None else set(values):
        if name in ("credits_per_period", "budget_action") and values[name] is None:
            continue
        setattr(policy, name, values[name])
    policy.updated_at = timezone.now()
    policy.updated_by = actor
    policy.full_clean()
    policy.save()
    return policy


@transaction.atomic
def member_cap_set(
    *, project: Project, user: Any, gpu_hours_per_period: Decimal | None, actor: Any
) -> MemberCap | None:
    """Set (or, with None, remove) the GPU-hours a member may book in the project per period. The user must
    be a member: a cap on an outsider would be a cap on nobody."""
    if not Membership.objects.filter(project=project, user=user).exists():
        raise ValidationFailed(
            f"user: {user.get_username()} is not a member of {project.slug}.",
            fields={"user": [f"{user.get_username()} is not a member of {project.slug}."]},
        )
    lock_project(project_id=project.pk)
    if gpu_hours_per_period is None:
        MemberCap.objects.filter(project=project, user=user).delete()
        return None
    cap, _ = MemberCap.objects.update_or_create(
        project=project,
        user=user,
        defaults={"gpu_hours_per_period": gpu_hours_per_period, "updated_at": timezone.now()},
    )
    return cap


# A booking's hold moves only the holds' total (credit_room), so only that one is read beside the balance.
_QUOTA_KINDS = (EntryKind.HOLD.value,)


def _quota_state_sql() -> tuple[str, list[str]]:
    columns, params = totals_sql(_QUOTA_KINDS)  # per database vendor: built when asked
    sql = (
        f"SELECT (SELECT max_concurrent_gpus FROM {QuotaPolicy._meta.db_table} WHERE project_id = %s), "  # noqa: S608 - names from metadata
        f"(SELECT max_reservation_hours FROM {QuotaPolicy._meta.db_table} WHERE project_id = %s), "
        f"{budgets.caps_sql()}, "
        f"{columns} FROM {LedgerEntry._meta.db_table} WHERE project_id = %s"
    )
    return sql, params


@dataclass(frozen=True)
class QuotaNeed:
    """What one booking (or extension) asks of the quota."""

    credits: Decimal
    # The project's GPUs in use at the busiest moment of the window, this one included. A callable is only
    # called when the project has a concurrency cap: counting reads every overlapping allocation.
    peak_concurrent_gpus: int | Callable[[], int]
    hours: Decimal  # the reservation's whole length after the change
    # For the budget and the member's GPU-hour cap (ledger/budgets.py): who books, the new GPU time's window
    # and GPU count; ``probe``: a check with no hold after it (a queued request's), which records no alert.
    member_id: int | None = None
    window: tuple[datetime, datetime] | None = None
    gpus: int = 0
    probe: bool = False
    # A new booking's allocations are written before the check: they are the need, not what the member has.
    booking_id: int | None = None


def _quota_state(
    project_id: int, member_id: int | None
) -> tuple[int | None, Decimal | None, budgets.Caps, LedgerTotals]:
    """The caps of the project's policy (None: no cap), its budget caps and its ledger's totals, in one query."""
    sql, params = _quota_state_sql()
    with connection.cursor() as cursor:
        caps = [project_id, project_id, project_id, member_id]
        cursor.execute(sql, [project_id, project_id, *caps, *params, project_id])
        max_gpus, max_hours, budget, action, member_hours, *totals = cursor.fetchone()
    hours_places = QuotaPolicy._meta.get_field("max_reservation_hours").decimal_places  # type: ignore[union-attr]
    return (
        max_gpus,
        rows.decimal(max_hours, Decimal(1).scaleb(-hours_places)),
        budgets.caps_from(budget, action, member_hours),
        totals_from(totals, _QUOTA_KINDS),
    )


def check_quota(*, project_id: int, need: QuotaNeed) -> list[dict[str, Any]]:
    """Refuse with QuotaExceeded naming the quota, what is needed and what is left. Caller holds lock_project().

    Returns the booking's warnings: a budget past its cap whose action is ``warn`` (ledger/budgets.py)."""
    max_gpus, max_hours, caps, totals = _quota_state(project_id, need.member_id)
    available = totals.balance
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
    room = credit_room(totals, kind=EntryKind.HOLD, negative=True)
    if need.credits > room.credits:
        raise _beyond_limit(EntryKind.HOLD, -need.credits, room)
    # Budgets last: an alert is recorded only for a booking every other rule lets through.
    return budgets.check(
        project_id=project_id,
        caps=caps,
        credits=need.credits,
        member_id=need.member_id,
        window=need.window,
        gpus=need.gpus,
        probe=need.probe,
        booking_id=need.booking_id,
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
    above what the project can pay (a container that ran past its window) is capped at the balance, and at
    what the charges' total can take (``credit_room``), and the shortfall recorded in the entry's data: the
    balance never goes below zero.
    Caller holds lock_project().
    """
    held = outstanding_hold(reservation_id=reservation_id)
    release = None
    if held > 0:
        # Never refused: it gives back what a hold took, so it leaves the balance plus held unchanged, and
        # the releases cannot total more than the holds did.
        release = _append(
            project_id=project_id,
            kind=EntryKind.RELEASE,
            amount=held,
            reason=reason,
            actor=actor,
            actor_label=actor_label,
            reservation_id=reservation_id,
            checked=True,
        )
    used = credits(used) if used > 0 else ZERO
    if used == 0:
        return release, None
    charge = ledger_charge_capped(
        project_id=project_id,
        used=used,
        reason=reason,
        actor=actor,
        actor_label=actor_label,
        reservation_id=reservation_id,
        released=held if held > 0 else ZERO,
    )
    return release, charge


def ledger_charge_capped(
    *,
    project_id: int,
    used: Decimal,
    reason: str,
    actor: Any = None,
    actor_label: str | None = None,
    reservation_id: int | None = None,
    period_key: str = "",
    data: dict[str, Any] | None = None,
    released: Decimal = ZERO,
) -> LedgerEntry:
    """Charge for what was used (a reservation's run, a volume's storage hour): capped, never refused, since
    it has been used. Capped at the balance, and at what the charges' total can still take (CREDIT_LIMIT,
    which only a project that has spent ~1e11 credits meets); the shortfall is kept in ``data.uncharged`` and
    the balance never goes below zero. Caller holds lock_project()."""
    used = credits(used) if used > 0 else ZERO
    totals = ledger_totals(project_id=project_id)
    charged = min(used, totals.balance, credit_room(totals, kind=EntryKind.CHARGE, negative=True).credits)
    data = {**(data or {}), "used": str(used)}
    if charged < used:
        data["uncharged"] = str(used - charged)
    if charged <= 0:
        # Nothing left to take; keep a zero charge so the shortfall is on the record.
        charged = ZERO
    entry = _append(
        project_id=project_id,
        kind=EntryKind.CHARGE,
        amount=-charged,
        reason=reason,
        actor=actor,
        actor_label=actor_label,
        reservation_id=reservation_id,
        period_key=period_key,
        data=data,
        checked=True,
    )
    # ``released``: the hold given back just before (a settlement); only a charge beyond it adds spending.
    budgets.after_charge(
        project_id=project_id, amount=charged - released, reservation_id=reservation_id, at=entry.created_at
    )
    return entry


def assert_not_settled(*, reservation_id: int) -> None:
    if LedgerEntry.objects.filter(reservation_id=reservation_id, kind=EntryKind.CHARGE).exists():
        raise Conflict("The reservation has already been settled.")
