"""Reads of the ledger: balances are always the sum of the entries, never a stored number."""

from __future__ import annotations

from decimal import Decimal

from django.db.models import QuerySet, Sum

from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import CREDIT_PLACES, LedgerEntry, QuotaPolicy

ZERO = Decimal("0")


def project_balance(*, project_id: int) -> Decimal:
    """Credits the project can still spend: the sum of all its entries (holds already taken off)."""
    total = LedgerEntry.objects.filter(project_id=project_id).aggregate(total=Sum("amount"))["total"]
    # SQLite sums decimals without their scale; quantize so both databases print "3.0000".
    return (total if total is not None else ZERO).quantize(CREDIT_PLACES)


def balances_by_kind(*, project_id: int) -> dict[str, Decimal]:
    rows = LedgerEntry.objects.filter(project_id=project_id).values("kind").annotate(total=Sum("amount"))
    out = {kind.value: ZERO for kind in EntryKind}
    for row in rows:
        out[row["kind"]] = row["total"]
    return out


def outstanding_hold(*, reservation_id: int) -> Decimal:
    """Credits still held for a reservation: its holds (negative) not yet given back by releases."""
    total = LedgerEntry.objects.filter(
        reservation_id=reservation_id, kind__in=[EntryKind.HOLD, EntryKind.RELEASE]
    ).aggregate(total=Sum("amount"))["total"]
    # Holds are negative and releases positive, so what is still held is minus their sum.
    return (-total if total else ZERO).quantize(CREDIT_PLACES)


def policy_for(*, project_id: int) -> QuotaPolicy | None:
    return QuotaPolicy.objects.filter(project_id=project_id).first()


def entries_for_projects(project_ids: QuerySet) -> QuerySet[LedgerEntry]:  # type: ignore[type-arg]
    return LedgerEntry.objects.filter(project_id__in=project_ids)
