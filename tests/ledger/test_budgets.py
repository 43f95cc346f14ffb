"""Budgets (ledger/budgets.py): the period's spending cap, its alerts at 80/95/100 %, refuse or warn past it, and
per-member GPU-hour caps. Bookings go through the real booking service and API."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connections
from django.utils import timezone

from controlplane.accounts.choices import Role
from controlplane.accounts.models import Membership
from controlplane.core.errors import QuotaExceeded
from controlplane.ledger import budgets
from controlplane.ledger.models import BudgetAlert, LedgerEntry, MemberCap
from controlplane.ledger.services import ledger_settle, lock_project, member_cap_set, quota_policy_set
from controlplane.reservations import services
from controlplane.reservations.models import Reservation
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():  # type: ignore[no-untyped-def]
    model = gpu_model(weight="1")
    server(model, gpus=8)
    return model


@pytest.fixture
def team():  # type: ignore[no-untyped-def]
    owner, member, viewer, outsider = UserFactory(), UserFactory(), UserFactory(), UserFactory()
    proj = project(owner=owner, member=member, viewer=viewer, grant="1000")
    return {"project": proj, "owner": owner, "member": member, "viewer": viewer, "outsider": outsider}


def budget(proj, amount: str, action: str = "refuse") -> None:  # type: ignore[no-untyped-def]
    quota_policy_set(
        project=proj,
        actor=None,
        budget_credits=Decimal(amount),
        budget_action=action,
        fields={"budget_credits", "budget_action"},
    )


def book(proj, actor, *, gpus: int = 1, hours: float = 1, start_in: timedelta = timedelta(hours=1)):  # type: ignore[no-untyped-def]
    # Windows start at the next hour boundary so every booking of a test lands in the current UTC month.
    return services.reservation_create(
        project=proj,
        name="b",
        spec=spec(gpu_model(), count=gpus),
        window=window(start_in=start_in, hours=hours),
        container=CONTAINER,
        actor=actor,
    )


def post_booking(api_client, proj, *, gpus: int, start_in: timedelta):  # type: ignore[no-untyped-def]
    start = timezone.now() + start_in
    body = {
        "project": proj.slug,
        "name": "api",
        "spec": {"gpu_model": gpu_model().name, "gpu_count": gpus},
        "window": {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()},
        "container": {"image": "registry.example/train:1"},
    }
    return api_client.post("/api/v1/reservations/", body, format="json")


def test_each_threshold_is_recorded_once_as_spending_crosses_it(fleet, team):
    proj, owner = team["project"], team["owner"]
    budget(proj, "10")
    book(proj, owner, gpus=7, hours=1)  # 7 of 10: nothing
    assert not BudgetAlert.objects.exists()
    book(proj, owner, gpus=1, hours=1, start_in=timedelta(hours=3))  # 8: the 80 % line
    assert list(BudgetAlert.objects.values_list("threshold", flat=True)) == [80]
    book(proj, owner, gpus=2, hours=1, start_in=timedelta(hours=5))  # 10: 95 % and 100 % at once
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [80, 95, 100]
    alert = BudgetAlert.objects.get(threshold=100)
    assert alert.spent == Decimal("10") and alert.budget == Decimal("10")
    assert alert.period_key == timezone.now().strftime("%Y-%m")


def test_a_booking_past_a_refusing_budget_is_a_409_and_writes_nothing(api_client, fleet, team):
    proj = team["project"]
    budget(proj, "3")
    entries = LedgerEntry.objects.count()
    api_client.force_authenticate(team["owner"])
    response = post_booking(api_client, proj, gpus=4, start_in=timedelta(hours=1))
    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "budget_exceeded" and error["quota"] == "budget"
    assert (error["needed"], error["available"], error["budget"]) == ("4.0000", "3.0000", "3.0000")
    assert "budget" in error["message"]
    assert LedgerEntry.objects.count() == entries
    assert not Reservation.objects.exists() and not BudgetAlert.objects.exists()


def test_a_warning_budget_books_and_says_so_in_the_response(api_client, fleet, team):
    proj = team["project"]
    budget(proj, "3", action="warn")
    api_client.force_authenticate(team["owner"])
    response = post_booking(api_client, proj, gpus=4, start_in=timedelta(hours=1))
    assert response.status_code == 201, response.content
    [warning] = response.data["warnings"]
    assert warning["code"] == "budget_exceeded" and warning["needed"] == "4.0000"
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [80, 95, 100]
    # A later read shows no warning: it was the booking's.
    assert api_client.get(f"/api/v1/reservations/{response.data['id']}/").data["warnings"] == []


def test_a_cancelled_booking_gives_its_spending_back(fleet, team):
    proj, owner = team["project"], team["owner"]
    budget(proj, "4")
    r = book(proj, owner, gpus=4)
    with pytest.raises(QuotaExceeded):
        book(proj, owner, gpus=1, start_in=timedelta(hours=3))
    services.reservation_cancel(reservation=r, actor=owner)
    assert budgets.spent(project_id=proj.pk, when=timezone.now()) == Decimal("0")
    book(proj, owner, gpus=4, start_in=timedelta(hours=3))
    # The thresholds were crossed once this period; crossing them again records nothing new.
    assert BudgetAlert.objects.count() == 3


def test_a_charge_beyond_the_hold_can_cross_a_threshold(fleet, team):
    proj, owner = team["project"], team["owner"]
    budget(proj, "10")
    r = book(proj, owner, gpus=1, hours=2)  # holds 2
    from django.db import transaction

    with transaction.atomic():
        lock_project(project_id=proj.pk)
        ledger_settle(project_id=proj.pk, reservation_id=r.pk, used=Decimal("9"), reason="ran past its window")
    assert budgets.spent(project_id=proj.pk, when=timezone.now()) == Decimal("9")
    assert list(BudgetAlert.objects.values_list("threshold", flat=True)) == [80]


def test_a_queued_request_check_records_no_alert(fleet, team):
    from controlplane.ledger.services import QuotaNeed, check_quota

    proj = team["project"]
    budget(proj, "10", action="warn")
    warnings = check_quota(
        project_id=proj.pk, need=QuotaNeed(credits=Decimal("12"), hours=Decimal(1), peak_concurrent_gpus=1, probe=True)
    )
    assert warnings and warnings[0]["code"] == "budget_exceeded"
    assert not BudgetAlert.objects.exists()


def test_listeners_hear_each_alert_once_after_commit(fleet, team, django_capture_on_commit_callbacks):
    heard: list[int] = []
    listener = lambda alert: heard.append(alert.threshold)  # noqa: E731
    budgets.register_alert_listener(listener)
    try:
        budget(team["project"], "5")
        with django_capture_on_commit_callbacks(execute=True):
            book(team["project"], team["owner"], gpus=4)
        with django_capture_on_commit_callbacks(execute=True):
            book(team["project"], team["owner"], gpus=1, start_in=timedelta(hours=3))
    finally:
        budgets.unregister_alert_listener(listener)
    assert heard == [80, 95, 100]


def test_a_member_past_their_gpu_hour_cap_is_refused_by_name(api_client, fleet, team):
    proj, member = team["project"], team["member"]
    member_cap_set(project=proj, user=member, gpu_hours_per_period=Decimal("3"), actor=None)
    book(proj, member, gpus=2, hours=1)
    book(proj, team["owner"], gpus=4, hours=1, start_in=timedelta(hours=3))  # the owner has no cap
    api_client.force_authenticate(member)
    response = post_booking(api_client, proj, gpus=2, start_in=timedelta(hours=5))
    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "member_cap_exceeded" and error["member"] == member.username
    assert member.username in error["message"] and error["available"] == "1.00"
    assert Reservation.objects.count() == 2


def test_a_cancelled_booking_does_not_count_against_the_member(fleet, team):
    proj, member = team["project"], team["member"]
    member_cap_set(project=proj, user=member, gpu_hours_per_period=Decimal("2"), actor=None)
    r = book(proj, member, gpus=2)
    services.reservation_cancel(reservation=r, actor=member)
    book(proj, member, gpus=2, start_in=timedelta(hours=3))


def test_an_extension_past_the_member_cap_is_refused(fleet, team):
    proj, member = team["project"], team["member"]
    member_cap_set(project=proj, user=member, gpu_hours_per_period=Decimal("2"), actor=None)
    r = book(proj, member, gpus=1, hours=1)
    with pytest.raises(QuotaExceeded) as refused:
        services.reservation_extend(reservation=r, ends_at=r.ends_at + timedelta(hours=2), actor=member)
    assert refused.value.code == "member_cap_exceeded"


def test_an_extension_past_a_warning_budget_is_made_and_says_so_like_a_booking(api_client, fleet, team):
    proj, owner = team["project"], team["owner"]
    budget(proj, "3", action="warn")
    r = book(proj, owner, gpus=2, hours=1)  # 2 of 3: no warning
    api_client.force_authenticate(owner)
    url = f"/api/v1/reservations/{r.public_id}/"
    within = api_client.post(
        url + "extend/", {"ends_at": (r.ends_at + timedelta(minutes=30)).isoformat()}, format="json"
    )
    assert within.status_code == 200, within.content
    assert within.data["warnings"] == []  # 3 of 3: at the cap, not past it
    new_end = r.ends_at + timedelta(hours=1)
    quote = api_client.get(url + "extend-quote/", {"ends_at": new_end.isoformat()})
    assert quote.status_code == 200 and quote.data["allowed"] is True
    [quoted] = quote.data["warnings"]
    response = api_client.post(url + "extend/", {"ends_at": new_end.isoformat()}, format="json")
    assert response.status_code == 200, response.content
    [warning] = response.data["warnings"]
    # The booking's warning, from the one rule (budgets.check): the same keys, for the extension's need.
    assert warning == quoted
    assert warning["code"] == "budget_exceeded" and warning["quota"] == "budget"
    assert (warning["needed"], warning["spent"], warning["available"]) == ("1.0000", "3.0000", "0.0000")
    assert "Booked anyway: the budget warns." in warning["message"]
    r.refresh_from_db()
    assert r.ends_at == new_end
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [80, 95, 100]
    assert api_client.get(url).data["warnings"] == []


def test_an_extension_past_a_refusing_budget_is_a_409_and_writes_nothing(api_client, fleet, team):
    proj, owner = team["project"], team["owner"]
    budget(proj, "3")
    r = book(proj, owner, gpus=2, hours=1)
    entries, alerts = LedgerEntry.objects.count(), BudgetAlert.objects.count()
    api_client.force_authenticate(owner)
    url = f"/api/v1/reservations/{r.public_id}/"
    new_end = r.ends_at + timedelta(hours=1)
    quote = api_client.get(url + "extend-quote/", {"ends_at": new_end.isoformat()})
    assert quote.data["allowed"] is False and quote.data["refusal"]["code"] == "budget_exceeded"
    assert quote.data["warnings"] == []
    response = api_client.post(url + "extend/", {"ends_at": new_end.isoformat()}, format="json")
    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "budget_exceeded" and (error["needed"], error["available"]) == ("2.0000", "1.0000")
    assert (LedgerEntry.objects.count(), BudgetAlert.objects.count()) == (entries, alerts)
    r.refresh_from_db()
    assert r.ends_at == new_end - timedelta(hours=1)


def test_a_cap_on_someone_outside_the_project_is_a_400(fleet, team):
    from controlplane.core.errors import ValidationFailed

    with pytest.raises(ValidationFailed) as refused:
        member_cap_set(project=team["project"], user=team["outsider"], gpu_hours_per_period=Decimal("1"), actor=None)
    assert refused.value.fields.keys() == {"user"}


# -- API: who sees and sets what ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("who", "code"), [("owner", 200), ("viewer", 200), ("outsider", 404), ("operator", 200)])
def test_budget_status_is_for_members(api_client, fleet, team, who, code):
    budget(team["project"], "10")
    book(team["project"], team["owner"], gpus=8)
    api_client.force_authenticate(OperatorFactory() if who == "operator" else team[who])
    response = api_client.get(f"/api/v1/ledger/budgets/{team['project'].slug}/")
    assert response.status_code == code
    if code == 200:
        assert response.data["spent"] == "8.0000" and response.data["share"] == 0.8
        assert [a["threshold"] for a in response.data["alerts"]] == [80]


@pytest.mark.parametrize(("who", "count"), [("owner", 1), ("viewer", 1), ("outsider", 0)])
def test_alerts_and_caps_lists_are_narrowed(api_client, fleet, team, who, count):
    budget(team["project"], "10")
    book(team["project"], team["owner"], gpus=8)
    member_cap_set(project=team["project"], user=team["member"], gpu_hours_per_period=Decimal("5"), actor=None)
    api_client.force_authenticate(team[who])
    assert api_client.get("/api/v1/ledger/budget-alerts/").data["count"] == count
    assert api_client.get("/api/v1/ledger/member-caps/").data["count"] == count


@pytest.mark.parametrize(
    ("who", "code"), [("owner", 200), ("member", 403), ("viewer", 403), ("outsider", 404), ("operator", 200)]
)
def test_only_owners_and_operators_set_member_caps(api_client, team, who, code):
    api_client.force_authenticate(OperatorFactory() if who == "operator" else team[who])
    body = {"project": team["project"].slug, "user": team["member"].username, "gpu_hours_per_period": "12"}
    response = api_client.post("/api/v1/ledger/member-caps/", body, format="json")
    assert response.status_code == code, response.content
    if code == 200:
        assert response.data["user"] == team["member"].username and response.data["gpu_hours_per_period"] == "12.00"
    if who == "outsider":
        assert "project" in response.json()["error"]["fields"]


def test_member_cap_input_names_the_field(api_client, team):
    api_client.force_authenticate(team["owner"])
    url = "/api/v1/ledger/member-caps/"
    slug = team["project"].slug
    bad_hours = api_client.post(url, {"project": slug, "user": team["member"].username, "gpu_hours_per_period": "-1"})
    assert bad_hours.status_code == 400 and "gpu_hours_per_period" in bad_hours.json()["error"]["fields"]
    # Someone who is not a member (no such user at all, or another project's) is absent from where the cap would
    # be: a 404 naming the field, as the schema says (issue 22: a schema-valid body is never a 400 for it).
    for name in ("nobody-at-all", UserFactory().username):
        nobody = api_client.post(url, {"project": slug, "user": name, "gpu_hours_per_period": "1"})
        assert nobody.status_code == 404 and "user" in nobody.json()["error"]["fields"]
    assert not MemberCap.objects.exists()
    removed = api_client.post(
        url, {"project": slug, "user": team["member"].username, "gpu_hours_per_period": None}, format="json"
    )
    assert removed.status_code == 204


def test_only_operators_set_the_budget_and_a_bad_action_is_a_400(api_client, team):
    url = f"/api/v1/ledger/quotas/{team['project'].slug}/"
    api_client.force_authenticate(team["owner"])
    assert api_client.patch(url, {"budget_credits": "5"}, format="json").status_code == 403
    api_client.force_authenticate(OperatorFactory())
    ok = api_client.patch(url, {"budget_credits": "5", "budget_action": "warn"}, format="json")
    assert ok.status_code == 200 and ok.data["budget_credits"] == "5.0000" and ok.data["budget_action"] == "warn"
    bad = api_client.patch(url, {"budget_action": "shrug"}, format="json")
    assert bad.status_code == 400 and "budget_action" in bad.json()["error"]["fields"]
    cleared = api_client.patch(url, {"budget_credits": None}, format="json")
    assert cleared.status_code == 200 and cleared.data["budget_credits"] is None


# -- Races (PostgreSQL) ------------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_bookings_cross_each_threshold_once_and_never_pass_a_refusing_budget():
    model = gpu_model(weight="1")
    server(model, gpus=8)
    server(model, gpus=8)
    owner = UserFactory()
    proj = project(owner=owner, grant="1000")
    budget(proj, "10")
    threads = 16
    barrier = threading.Barrier(threads)
    results: list[object] = [None] * threads

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = book(proj, owner, gpus=1, hours=1)
        except Exception as exc:
            results[i] = exc
        finally:
            connections.close_all()

    workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    booked = [r for r in results if isinstance(r, Reservation)]
    refused = [r for r in results if isinstance(r, QuotaExceeded)]
    assert len(booked) == 10 and len(refused) == 6, results
    assert all(r.code == "budget_exceeded" for r in refused)
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [80, 95, 100]
    assert Membership.objects.filter(project=proj, role=Role.OWNER).count() == 1
