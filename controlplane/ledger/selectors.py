"""Reads of the ledger: balances are always the sum of the entries, never a stored number.

Sums are exact on both databases. PostgreSQL sums NUMERIC exactly. SQLite keeps a decimal as a binary float
and sums floats, which loses the fourth place once totals reach ~1e11 (and Django reads back only 15
significant digits); there each amount is summed as a whole number of 0.0001 credits instead. Every
amount has at most 15 significant digits (``CREDIT_LIMIT``), so rounding ``amount * 10000`` gives back
exactly the number that was written, and SQLite adds integers exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import CREDIT_PLACES, LedgerEntry, QuotaPolicy

ZERO = Decimal("0")
_ENTRY = LedgerEntry._meta.db_table
_KINDS = tuple(kind.value for kind in EntryKind)
_UNITS = int(1 / CREDIT_PLACES)


@dataclass(frozen=True)
class LedgerTotals:
    """A project's balance and its totals by kind (zero for a kind it has none of), and what follows.

    ``by_kind`` holds the kinds that were read: all of them, unless a caller on a hot path asked for fewer
    (a booking reads only the holds'); a rule that needs another kind fails loudly with a KeyError.
    """

    balance: Decimal  # credits the project can still spend: the sum of all its entries (holds taken off)
    by_kind: Mapping[str, Decimal]

    @property
    def held(self) -> Decimal:
        """Credits held for booked windows and not given back yet (holds are negative, releases positive)."""
        return -(self.by_kind[EntryKind.HOLD] + self.by_kind[EntryKind.RELEASE])

    @property
    def owned(self) -> Decimal:
        """The balance plus what is held (grants + charges + refunds + adjustments). Bounding it bounds both,
        as neither is below zero, and a release, which moves credits from held back to the balance, leaves it
        as it was."""
        return self.balance + self.held


def sum_sql(expression: str) -> str:
    """``SUM(expression)`` of credit amounts, exact on both databases; read its value with ``summed``."""
    if connection.vendor == "sqlite":
        return f"SUM(CAST(ROUND(({expression}) * {_UNITS}) AS INTEGER))"
    return f"SUM({expression})"


def summed(value: Any) -> Decimal:
    """A ``sum_sql`` column as credits (None, no rows: zero)."""
    if value is None:
        return ZERO.quantize(CREDIT_PLACES)
    if isinstance(value, int):  # SQLite: a whole number of 0.0001 credits
        return Decimal(value) * CREDIT_PLACES
    return Decimal(value).quantize(CREDIT_PLACES)


def totals_sql(kinds: Sequence[str] = _KINDS) -> tuple[str, list[str]]:
    """The select list of a project's balance and then the totals of ``kinds``, and its parameters; each
    conditional sum costs about as much as the balance's own, so a hot path asks only for what it needs."""
    columns = [sum_sql("amount"), *(sum_sql("CASE WHEN kind = %s THEN amount END") for _ in kinds)]
    return ", ".join(columns), list(kinds)


def totals_from(values: Sequence[Any], kinds: Sequence[str] = _KINDS) -> LedgerTotals:
    balance, *by_kind = values
    return LedgerTotals(summed(balance), dict(zip(kinds, (summed(v) for v in by_kind), strict=True)))


def totals_for_projects(project_ids: Iterable[int], kinds: Sequence[str] = _KINDS) -> dict[int, LedgerTotals]:
    """The totals of each project, in one query (a project without entries gets zeros)."""
    ids = list(project_ids)
    out = {pk: totals_from([None] * (1 + len(kinds)), kinds) for pk in ids}
    if not ids:
        return out
    columns, params = totals_sql(kinds)
    marks = ", ".join(["%s"] * len(ids))
    sql = f"SELECT project_id, {columns} FROM {_ENTRY} WHERE project_id IN ({marks}) GROUP BY project_id"  # noqa: S608 - names from metadata
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *ids])
        for project_id, *values in cursor.fetchall():
            out[project_id] = totals_from(values, kinds)
    return out


def ledger_totals(*, project_id: int, kinds: Sequence[str] = _KINDS) -> LedgerTotals:
    return totals_for_projects([project_id], kinds)[project_id]


def project_balance(*, project_id: int) -> Decimal:
    """Credits the project can still spend: the sum of all its entries (holds already taken off)."""
    return ledger_totals(project_id=project_id, kinds=()).balance


def outstanding_hold(*, reservation_id: int) -> Decimal:
    """Credits still held for a reservation: its holds (negative) not yet given back by releases."""
    sql = f"SELECT {sum_sql('amount')} FROM {_ENTRY} WHERE reservation_id = %s AND kind IN (%s, %s)"  # noqa: S608 - names from metadata
    with connection.cursor() as cursor:
        cursor.execute(sql, [reservation_id, EntryKind.HOLD.value, EntryKind.RELEASE.value])
        (total,) = cursor.fetchone()
    # Holds are negative and releases positive, so what is still held is minus their sum.
    held = -summed(total)
    return held if held else ZERO.quantize(CREDIT_PLACES)  # not "-0.0000"


def policy_for(*, project_id: int) -> QuotaPolicy | None:
    return QuotaPolicy.objects.filter(project_id=project_id).first()


def entries_for_projects(project_ids: QuerySet) -> QuerySet[LedgerEntry]:  # type: ignore[type-arg]
    return LedgerEntry.objects.filter(project_id__in=project_ids)
