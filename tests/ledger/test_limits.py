"""The ledger's range: every total it shows stays within +-CREDIT_LIMIT, tried exactly at the edges."""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from controlplane.accounts.models import Project
from controlplane.core import rows
from controlplane.core.errors import QuotaExceeded, ValidationFailed
from controlplane.ledger import services
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import CREDIT_LIMIT, LedgerEntry
from controlplane.ledger.selectors import ledger_totals, outstanding_hold, project_balance
from controlplane.ledger.tasks import grant_period_credits
from controlplane.reservations.models import Reservation
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db

L = CREDIT_LIMIT
UNIT = Decimal("0.0001")
GRANTS = "/api/v1/ledger/grants/"
ADJUSTMENTS = "/api/v1/ledger/adjustments/"


def a_reservation(proj: Project) -> Reservation:
    now = timezone.now()
    return Reservation.objects.create(
        project=proj,
        name="r",
        gpu_model=gpu_model(),
        gpu_count=1,
        image="x",
        starts_at=now,
        ends_at=now + timedelta(hours=1),
    )


def held_and_given_back(proj: Project, amount: Decimal) -> Reservation:
    """A reservation that held ``amount`` and was settled with nothing used: the holds' total grows by it."""
    r = a_reservation(proj)
    services.ledger_hold(project_id=proj.pk, reservation_id=r.pk, amount=amount, actor=None, reason="h")
    services.ledger_settle(project_id=proj.pk, reservation_id=r.pk, used=Decimal(0), reason="s")
    return r


def legacy_entry(proj: Project, kind: str, amount: str) -> None:
    """An entry as the ledger wrote it before it had a limit: straight to the table, past every check."""
    rows.insert([LedgerEntry(project=proj, kind=kind, amount=Decimal(amount), actor_label="system", reason="legacy")])


def grant(proj: Project, amount: Decimal) -> LedgerEntry:
    return services.ledger_grant(project=proj, amount=amount, actor=None, reason="g")


def adjust(proj: Project, amount: Decimal) -> LedgerEntry:
    return services.ledger_adjust(project=proj, amount=amount, actor=None, reason="a")


def balance_of(client: Any, proj: Project) -> dict[str, Any]:
    response = client.get(f"/api/v1/ledger/balances/{proj.slug}/")
    assert response.status_code == 200, response.content
    listed = client.get("/api/v1/ledger/balances/")
    assert listed.status_code == 200, listed.content
    assert [row for row in listed.json() if row["project"] == proj.slug] == [response.json()]
    return response.json()


@pytest.fixture
def operator(api_client):  # type: ignore[no-untyped-def]
    api_client.force_authenticate(OperatorFactory())
    return api_client


def test_the_largest_grant_is_accepted_and_one_unit_more_refused_naming_amount(operator):
    proj = project(grant=None)
    too_much = operator.post(GRANTS, {"project": proj.slug, "amount": str(L + UNIT), "reason": "x"}, format="json")
    assert too_much.status_code == 400
    assert too_much.json()["error"]["code"] == "validation_error" and "amount" in too_much.json()["error"]["fields"]
    largest = operator.post(GRANTS, {"project": proj.slug, "amount": str(L), "reason": "x"}, format="json")
    assert largest.status_code == 201, largest.content
    assert largest.json()["amount"] == "99999999999.9999"
    # The service refuses the same on its own (a caller that is not the API).
    with pytest.raises(ValidationFailed) as exc:
        grant(project(grant=None), L + UNIT)
    assert set(exc.value.fields) == {"amount"}


def test_the_issues_two_grants_at_the_schema_maximum_are_refused(operator):
    proj = project(grant=None)
    for _ in range(2):
        response = operator.post(
            GRANTS, {"project": proj.slug, "amount": "999999999999.9999", "reason": "x"}, format="json"
        )
        assert response.status_code == 400 and "amount" in response.json()["error"]["fields"]
    assert not LedgerEntry.objects.filter(project=proj).exists()
    assert balance_of(operator, proj)["balance"] == "0.0000"


def test_a_second_grant_past_the_limit_is_refused_with_nothing_written(operator):
    proj = project(grant=None)
    grant(proj, L - 1)
    response = operator.post(GRANTS, {"project": proj.slug, "amount": "1.0001", "reason": "x"}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "ledger_limit" and list(error["fields"]) == ["amount"]
    assert (error["available"], error["limit"]) == ("1.0000", str(L))
    assert LedgerEntry.objects.filter(project=proj).count() == 1
    # Exactly what fits is accepted, and then not a unit more.
    assert operator.post(GRANTS, {"project": proj.slug, "amount": "1", "reason": "x"}, format="json").status_code == 201
    assert balance_of(operator, proj)["balance"] == str(L)
    with pytest.raises(ValidationFailed):
        grant(proj, UNIT)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_grants_under_the_project_lock_never_pass_the_limit_together():
    proj = project(grant=None)
    # Each grant fits alone; any two pass the limit. Real threads, each with its own connection.
    half = (L / 2).quantize(UNIT) + 1
    threads = 4
    barrier = threading.Barrier(threads)
    results: list[Any] = [None] * threads

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = grant(Project.objects.get(pk=proj.pk), half)
        except Exception as exc:
            results[i] = exc
        finally:
            connections.close_all()

    workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    assert sum(isinstance(r, LedgerEntry) for r in results) == 1, results
    assert all(isinstance(r, LedgerEntry | ValidationFailed) for r in results), results
    assert project_balance(project_id=proj.pk) == half


def test_balance_endpoints_answer_exactly_with_every_total_at_its_limit(operator):
    proj = project(grant=None)
    grant(proj, L)
    assert balance_of(operator, proj)["balance"] == str(L)
    r = a_reservation(proj)
    services.ledger_hold(project_id=proj.pk, reservation_id=r.pk, amount=L, actor=None, reason="h")
    shown = balance_of(operator, proj)
    assert (shown["balance"], shown["held"]) == ("0.0000", str(L))
    services.ledger_settle(project_id=proj.pk, reservation_id=r.pk, used=L, reason="s")
    services.ledger_refund(project=proj, reservation=r, amount=L, actor=None, reason="outage")
    adjust(proj, -L)
    shown = balance_of(operator, proj)
    assert shown["by_kind"] == {
        "grant": str(L),
        "hold": str(-L),
        "charge": str(-L),
        "release": str(L),
        "refund": str(L),
        "adjust": str(-L),
    }
    assert (shown["balance"], shown["held"]) == ("0.0000", "0.0000")
    # Nothing can take a full total further; an adjustment back towards zero still fits. (The adjustments'
    # total cannot go below -CREDIT_LIMIT with credits left to take: the balance stops it first.)
    with pytest.raises(ValidationFailed):
        grant(proj, UNIT)
    adjust(proj, UNIT)
    assert balance_of(operator, proj)["by_kind"]["adjust"] == str(-L + UNIT)


def test_compensating_adjustments_make_room_and_the_limit_holds_at_the_unit(operator):
    proj = project(grant=None)
    grant(proj, L)
    response = operator.post(ADJUSTMENTS, {"project": proj.slug, "amount": "0.0001", "reason": "x"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "ledger_limit"
    assert "balance plus held" in response.json()["error"]["message"]
    adjust(proj, Decimal(-10))
    adjust(proj, Decimal(10))
    with pytest.raises(ValidationFailed):
        adjust(proj, UNIT)
    lowest = operator.post(ADJUSTMENTS, {"project": proj.slug, "amount": str(-L - UNIT), "reason": "x"}, format="json")
    assert lowest.status_code == 400 and "amount" in lowest.json()["error"]["fields"]
    assert (
        operator.post(ADJUSTMENTS, {"project": proj.slug, "amount": str(-L), "reason": "x"}, format="json").status_code
        == 201
    )
    assert balance_of(operator, proj)["balance"] == "0.0000"


def test_a_booking_whose_hold_would_pass_the_limit_is_refused_as_a_quota(api_client):
    model = gpu_model()
    server(model, gpus=8)
    owner = UserFactory()
    proj = project(owner=owner, grant=None)
    grant(proj, L)
    held_and_given_back(proj, L - 4)  # the holds' total: 4 credits from the limit
    api_client.force_authenticate(owner)
    start = timezone.now() + timedelta(hours=1)

    def book(hours: int) -> Any:
        return api_client.post(
            "/api/v1/reservations/",
            {
                "project": proj.slug,
                "name": "train",
                "spec": {"gpu_model": model.name, "gpu_count": 2},
                "window": {"start": start.isoformat(), "end": (start + timedelta(hours=hours)).isoformat()},
                "container": {"image": "registry.example/train:1", "command": ["python"], "env": {}},
            },
            format="json",
        )

    entries = LedgerEntry.objects.filter(project=proj).count()
    refused = book(3)  # 2 GPUs x 3 h = 6 credits
    assert refused.status_code == 409, refused.content
    error = refused.json()["error"]
    assert (error["code"], error["quota"], error["needed"], error["available"]) == (
        "quota_exceeded",
        "ledger_limit",
        "6.0000",
        "4.0000",
    )
    assert LedgerEntry.objects.filter(project=proj).count() == entries
    assert not Reservation.objects.filter(project=proj, name="train").exists()
    accepted = book(2)  # exactly the 4 credits left in the holds' total
    assert accepted.status_code == 201, accepted.content
    assert ledger_totals(project_id=proj.pk).by_kind["hold"] == -L


def test_an_extension_hold_past_the_limit_is_refused(operator):
    proj = project(grant=None)
    grant(proj, L)
    held_and_given_back(proj, L - 1)
    r = a_reservation(proj)
    with pytest.raises(QuotaExceeded) as exc:
        services.ledger_hold(project_id=proj.pk, reservation_id=r.pk, amount=Decimal("1.0001"), actor=None, reason="x")
    assert exc.value.extra["quota"] == "ledger_limit"
    services.ledger_hold(project_id=proj.pk, reservation_id=r.pk, amount=Decimal(1), actor=None, reason="x")
    assert balance_of(operator, proj)["by_kind"]["hold"] == str(-L)


def test_a_charge_past_the_limit_is_capped_and_the_shortfall_recorded():
    proj = project(grant=None)
    grant(proj, L)
    first = a_reservation(proj)
    services.ledger_settle(project_id=proj.pk, reservation_id=first.pk, used=L - 1, reason="ran")
    services.ledger_refund(project=proj, reservation=first, amount=L - 1, actor=None, reason="outage")
    r = a_reservation(proj)
    services.ledger_hold(project_id=proj.pk, reservation_id=r.pk, amount=Decimal(3), actor=None, reason="h")
    _, charge = services.ledger_settle(project_id=proj.pk, reservation_id=r.pk, used=Decimal(3), reason="ran")
    assert charge is not None
    assert (charge.amount, charge.data["uncharged"]) == (Decimal(-1), "2.0000")
    totals = ledger_totals(project_id=proj.pk)
    assert totals.by_kind["charge"] == -L and totals.balance == L - 1 and outstanding_hold(reservation_id=r.pk) == 0


def test_the_period_grant_is_cut_to_what_fits_and_the_task_moves_on():
    proj = project(grant=None)
    services.quota_policy_set(project=proj, actor=None, credits_per_period=Decimal(50), fields={"credits_per_period"})
    grant(proj, L - 10)
    november = datetime(2030, 11, 3, tzinfo=UTC)  # not the current period: the task grants that
    entry = services.ledger_grant_period(project=proj, when=november)
    assert entry is not None and (entry.amount, entry.data) == (Decimal(10), {"ungranted": "40.0000"})
    assert services.ledger_grant_period(project=proj, when=november) is None
    full = services.ledger_grant_period(project=proj, when=november.replace(month=12))
    assert full is not None and (full.amount, full.data) == (Decimal(0), {"ungranted": "50.0000"})
    assert project_balance(project_id=proj.pk) == L
    # The task grants (or records) the current period once and then finds nothing: a full project never
    # keeps it coming back.
    assert grant_period_credits() is True
    assert grant_period_credits() is False


def test_credits_per_period_past_the_limit_are_refused_naming_the_field(operator):
    proj = project(grant=None)
    url = f"/api/v1/ledger/quotas/{proj.slug}/"
    refused = operator.patch(url, {"credits_per_period": str(L + UNIT)}, format="json")
    assert refused.status_code == 400 and "credits_per_period" in refused.json()["error"]["fields"]
    assert operator.patch(url, {"credits_per_period": str(L)}, format="json").status_code == 200


def test_totals_written_before_the_limit_still_read_and_take_compensation(operator):
    proj = project(grant=None)
    legacy_entry(proj, EntryKind.GRANT, str(L))
    legacy_entry(proj, EntryKind.GRANT, str(L))  # the old ledger accepted both
    shown = balance_of(operator, proj)
    assert shown["balance"] == shown["by_kind"]["grant"] == "199999999999.9998"
    with pytest.raises(ValidationFailed):
        grant(proj, UNIT)
    adjust(proj, -L)
    assert balance_of(operator, proj)["balance"] == str(L)
    with pytest.raises(ValidationFailed):
        adjust(proj, UNIT)


@pytest.mark.postgres
def test_the_issues_broken_balance_reads_again(operator):
    # SQLite cannot keep 16 significant digits, and Django cannot read such a row back there: PostgreSQL only.
    proj = project(grant=None)
    legacy_entry(proj, EntryKind.GRANT, "999999999999.9999")
    legacy_entry(proj, EntryKind.GRANT, "999999999999.9999")
    shown = balance_of(operator, proj)
    assert shown["balance"] == shown["by_kind"]["grant"] == "1999999999999.9998"
    assert operator.get("/api/v1/ledger/entries/").status_code == 200


def test_sums_are_exact_to_the_unit_near_the_limit():
    # On SQLite 3.40, summing these as floats (what SUM of a decimal column does there) comes out 0.0001 off.
    proj = project(grant=None)
    rng = random.Random(4)
    amounts = [Decimal(90_000_000_000)] + [Decimal(rng.randint(1, 10**8)) / 10000 for _ in range(60)]
    for amount in amounts:
        grant(proj, amount)
    assert project_balance(project_id=proj.pk) == sum(amounts) == Decimal("90000270252.1270")


amounts = st.one_of(
    st.decimals(min_value=UNIT, max_value=Decimal(100), places=4),
    st.integers(min_value=0, max_value=20).map(lambda k: L - k * UNIT),
    st.sampled_from([L / 2, L / 3, L + UNIT]).map(lambda d: d.quantize(UNIT)),
)
operations = st.lists(
    st.tuples(st.sampled_from(["grant", "hold", "settle", "refund", "adjust+", "adjust-", "period"]), amounts),
    max_size=16,
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(operations)
def test_random_sequences_within_the_limits_never_break_a_balance_endpoint(operator, ops):
    proj = project(grant=None)
    reservations = [a_reservation(proj) for _ in range(2)]
    for i, (op, amount) in enumerate(ops):
        r = reservations[i % 2]
        try:
            if op == "grant":
                grant(proj, amount)
            elif op == "hold":
                services.ledger_hold(project_id=proj.pk, reservation_id=r.pk, amount=amount, actor=None, reason="h")
            elif op == "settle":
                services.ledger_settle(project_id=proj.pk, reservation_id=r.pk, used=amount, reason="s")
            elif op == "refund":
                services.ledger_refund(project=proj, reservation=r, amount=amount, actor=None, reason="r")
            elif op == "period":
                services.quota_policy_set(
                    project=proj, actor=None, credits_per_period=min(amount, L), fields={"credits_per_period"}
                )
                services.ledger_grant_period(
                    project=proj, when=datetime(2000, 1, 1, tzinfo=UTC) + timedelta(days=31 * i)
                )
            else:
                adjust(proj, amount if op == "adjust+" else -amount)
        except (QuotaExceeded, ValidationFailed) as exc:
            event(f"refused: {exc.code} {exc.extra.get('quota', '')}")  # --hypothesis-show-statistics
        shown = balance_of(operator, proj)
        entries = list(LedgerEntry.objects.filter(project=proj))
        by_kind = {kind.value: sum((e.amount for e in entries if e.kind == kind), Decimal(0)) for kind in EntryKind}
        assert {k: Decimal(v) for k, v in shown["by_kind"].items()} == by_kind
        assert Decimal(shown["balance"]) == sum(by_kind.values()) == project_balance(project_id=proj.pk) >= 0
        assert Decimal(shown["held"]) >= 0
        assert all(abs(Decimal(v)) <= L for v in [shown["balance"], shown["held"], *shown["by_kind"].values()])
