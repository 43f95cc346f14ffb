from __future__ import annotations

from decimal import Decimal

import pytest
from django.db.models import Sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.core.errors import QuotaExceeded, ValidationFailed
from controlplane.ledger import services
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import AppendOnlyError, LedgerEntry
from controlplane.ledger.selectors import outstanding_hold, project_balance
from controlplane.reservations.models import Reservation
from tests.factories import OperatorFactory
from tests.reservations.fleet import gpu_model, project

pytestmark = pytest.mark.django_db


def a_reservation(proj):  # type: ignore[no-untyped-def]
    from django.utils import timezone

    now = timezone.now()
    return Reservation.objects.create(
        project=proj,
        name="r",
        gpu_model=gpu_model(),
        gpu_count=1,
        image="x",
        starts_at=now,
        ends_at=now + timezone.timedelta(hours=1),
    )


def test_entries_cannot_be_changed_or_deleted():
    proj = project(grant="10")
    entry = LedgerEntry.objects.get(project=proj)
    entry.amount = Decimal("1000")
    with pytest.raises(AppendOnlyError):
        entry.save()
    with pytest.raises(AppendOnlyError):
        entry.delete()
    with pytest.raises(AppendOnlyError):
        LedgerEntry.objects.filter(project=proj).update(amount=1)
    with pytest.raises(AppendOnlyError):
        LedgerEntry.objects.filter(project=proj).delete()


def test_negative_adjustment_cannot_take_the_balance_below_zero():
    proj = project(grant="5")
    with pytest.raises(QuotaExceeded) as exc:
        services.ledger_adjust(project=proj, amount=Decimal("-6"), actor=OperatorFactory(), reason="fix")
    assert exc.value.extra["quota"] == "credits"
    services.ledger_adjust(project=proj, amount=Decimal("-5"), actor=OperatorFactory(), reason="fix")
    assert project_balance(project_id=proj.pk) == 0


def test_operator_changes_need_a_reason():
    with pytest.raises(ValidationFailed) as exc:
        services.ledger_grant(project=project(grant=None), amount=Decimal("1"), actor=None, reason="  ")
    assert "reason" in exc.value.fields


def test_period_grant_happens_once_per_period():
    from datetime import datetime

    proj = project(grant=None)
    services.quota_policy_set(project=proj, actor=None, credits_per_period=Decimal("50"), fields={"credits_per_period"})
    when = datetime(2026, 11, 3, tzinfo=datetime.now().astimezone().tzinfo)
    assert services.ledger_grant_period(project=proj, when=when) is not None
    assert services.ledger_grant_period(project=proj, when=when) is None
    assert services.ledger_grant_period(project=proj, when=when.replace(month=12)) is not None
    assert project_balance(project_id=proj.pk) == Decimal("100")


def test_refund_is_bounded_by_what_was_charged():
    proj = project(grant="10")
    r = a_reservation(proj)
    services.ledger_hold(project_id=proj.pk, reservation_id=r.pk, amount=Decimal("4"), actor=None, reason="h")
    services.ledger_settle(project_id=proj.pk, reservation_id=r.pk, used=Decimal("3"), reason="done")
    with pytest.raises(ValidationFailed):
        services.ledger_refund(project=proj, reservation=r, amount=Decimal("3.5"), actor=None, reason="outage")
    services.ledger_refund(project=proj, reservation=r, amount=Decimal("3"), actor=None, reason="outage")
    assert project_balance(project_id=proj.pk) == Decimal("10")


def test_a_charge_above_the_balance_is_capped_and_the_shortfall_recorded():
    proj = project(grant="2")
    r = a_reservation(proj)
    services.ledger_hold(project_id=proj.pk, reservation_id=r.pk, amount=Decimal("2"), actor=None, reason="h")
    _, charge = services.ledger_settle(project_id=proj.pk, reservation_id=r.pk, used=Decimal("5"), reason="ran over")
    assert charge.amount == Decimal("-2") and charge.data["uncharged"] == "3.0000"
    assert project_balance(project_id=proj.pk) == 0


operations = st.lists(
    st.tuples(
        st.sampled_from(["grant", "hold", "settle", "refund", "adjust"]),
        st.decimals(min_value=Decimal("-50"), max_value=Decimal("50"), places=2, allow_nan=False, allow_infinity=False),
    ),
    max_size=25,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(operations)
def test_random_ledger_sequences_keep_balance_equal_to_the_sum_and_never_negative(ops):
    proj = project(grant=None)
    reservations = [a_reservation(proj) for _ in range(2)]
    for i, (op, amount) in enumerate(ops):
        r = reservations[i % 2]
        try:
            if op == "grant":
                services.ledger_grant(project=proj, amount=abs(amount) or Decimal("1"), actor=None, reason="g")
            elif op == "hold":
                services.ledger_hold(
                    project_id=proj.pk, reservation_id=r.pk, amount=abs(amount), actor=None, reason="h"
                )
            elif op == "settle":
                services.ledger_settle(project_id=proj.pk, reservation_id=r.pk, used=abs(amount), reason="s")
            elif op == "refund":
                services.ledger_refund(
                    project=proj, reservation=r, amount=abs(amount) or Decimal("1"), actor=None, reason="r"
                )
            else:
                services.ledger_adjust(project=proj, amount=amount or Decimal("1"), actor=None, reason="a")
        except (QuotaExceeded, ValidationFailed):
            pass
        balance = project_balance(project_id=proj.pk)
        total = LedgerEntry.objects.filter(project=proj).aggregate(t=Sum("amount"))["t"] or Decimal(0)
        # SQLite sums decimals as binary floats; to the ledger's four places they are the same number.
        assert balance == total.quantize(Decimal("0.0001")) >= 0
        assert balance == sum((e.amount for e in LedgerEntry.objects.filter(project=proj)), Decimal(0))
        for res in reservations:
            assert outstanding_hold(reservation_id=res.pk) >= 0
    # Everything held is given back by settling with nothing used.
    for res in reservations:
        services.ledger_settle(project_id=proj.pk, reservation_id=res.pk, used=Decimal(0), reason="end")
        assert outstanding_hold(reservation_id=res.pk) == 0
    assert not LedgerEntry.objects.filter(project=proj, kind=EntryKind.HOLD, amount__gt=0).exists()


def test_period_task_grants_each_project_once_then_finds_nothing():
    from controlplane.ledger.tasks import grant_period_credits

    proj = project(grant=None)
    services.quota_policy_set(project=proj, actor=None, credits_per_period=Decimal("30"), fields={"credits_per_period"})
    project(grant=None)  # no credits per period: nothing to grant
    assert grant_period_credits() is True
    assert grant_period_credits() is False
    assert project_balance(project_id=proj.pk) == Decimal("30")
