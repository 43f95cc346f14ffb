"""The cost on a reservation's answer, the extension quote and the history filters (issue 12)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.reservations import services
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window

pytestmark = pytest.mark.django_db
URL = "/api/v1/reservations/"


@pytest.fixture
def team():  # type: ignore[no-untyped-def]
    model = gpu_model(weight="1.5")
    server(model, gpus=4)
    owner, outsider = UserFactory(), UserFactory()
    return {"model": model, "owner": owner, "outsider": outsider, "project": project(owner=owner, grant="1000")}


def _book(team, *, start_in=timedelta(hours=1), hours=2.0, count=2, now=None):  # type: ignore[no-untyped-def]
    return services.reservation_create(
        project=team["project"],
        name="job",
        spec=spec(team["model"], count=count),
        window=window(start_in=start_in, hours=hours, now=now),
        container=CONTAINER,
        actor=team["owner"],
        now=now,
    )


def test_a_booked_reservation_shows_its_rate_and_nothing_used_yet(api_client, team):  # type: ignore[no-untyped-def]
    r = _book(team)
    api_client.force_authenticate(team["owner"])
    cost = api_client.get(f"{URL}{r.public_id}/").data["cost"]
    assert Decimal(cost["credits_per_hour"]) == Decimal("3")  # two GPUs of weight 1.5
    assert Decimal(cost["booked_credits"]) == Decimal("6")
    assert cost["elapsed_seconds"] == 0
    assert Decimal(cost["gpu_hours"]) == 0 and Decimal(cost["credits_so_far"]) == 0
    assert cost["credits_charged"] is None
    # The list carries it too, and the booking's own answer.
    listed = api_client.get(URL).data["results"][0]["cost"]
    assert listed == cost


def test_a_running_reservation_costs_what_it_has_held_and_its_end_what_the_ledger_charged(api_client, team):  # type: ignore[no-untyped-def]
    # Booked 30 minutes ago, starting then, for two hours.
    then = timezone.now() - timedelta(minutes=30)
    r = _book(team, start_in=timedelta(0), hours=2, now=then)
    Reservation.objects.filter(pk=r.pk).update(state=ReservationState.RUNNING)
    api_client.force_authenticate(team["owner"])
    cost = api_client.get(f"{URL}{r.public_id}/").data["cost"]
    assert 29 * 60 <= cost["elapsed_seconds"] <= 31 * 60
    assert Decimal("0.98") <= Decimal(cost["gpu_hours"]) <= Decimal("1.02")  # two GPUs, half an hour each
    assert Decimal("1.47") <= Decimal(cost["credits_so_far"]) <= Decimal("1.53")
    assert cost["credits_charged"] is None

    ended = then + timedelta(minutes=6)
    assert services.reservation_finish(
        reservation=r, to=ReservationState.COMPLETED, ended_at=ended, actor_label="system:test", reason="done"
    )
    cost = api_client.get(f"{URL}{r.public_id}/").data["cost"]
    charge = LedgerEntry.objects.get(reservation=r, kind=EntryKind.CHARGE)
    assert Decimal(cost["credits_charged"]) == -charge.amount == Decimal("0.3")  # 2 GPUs, 6 min, weight 1.5
    assert cost["elapsed_seconds"] == 360
    assert Decimal(cost["gpu_hours"]) == Decimal("0.2")
    listed = api_client.get(URL, {"state": "completed"}).data["results"][0]["cost"]
    assert listed["credits_charged"] == cost["credits_charged"]


def test_a_reservation_cancelled_before_its_window_cost_nothing(api_client, team):  # type: ignore[no-untyped-def]
    r = _book(team)
    services.reservation_cancel(reservation=r, actor=team["owner"])
    api_client.force_authenticate(team["owner"])
    cost = api_client.get(f"{URL}{r.public_id}/").data["cost"]
    assert cost["elapsed_seconds"] == 0 and Decimal(cost["credits_charged"]) == 0


def test_the_extend_quote_prices_the_extension_and_writes_nothing(api_client, team):  # type: ignore[no-untyped-def]
    r = _book(team)
    api_client.force_authenticate(team["owner"])
    new_end = r.ends_at + timedelta(hours=4)
    before = LedgerEntry.objects.count()
    quote = api_client.get(f"{URL}{r.public_id}/extend-quote/", {"ends_at": new_end.isoformat()})
    assert quote.status_code == 200, quote.data
    data = quote.data
    assert data["allowed"] is True and data["gpus_free"] is True and data["refusal"] is None
    assert Decimal(data["extra_hours"]) == 4 and Decimal(data["extra_credits"]) == Decimal("12")
    assert Decimal(data["credits_per_hour"]) == 3
    r.refresh_from_db()
    assert r.ends_at == new_end - timedelta(hours=4) and LedgerEntry.objects.count() == before
    # The extension then holds what the quote said, and its event names the old and the new end.
    extended = api_client.post(f"{URL}{r.public_id}/extend/", {"ends_at": new_end.isoformat()}, format="json")
    assert extended.status_code == 200
    event = extended.data["events"][-1]
    assert event["data"]["old_ends_at"] == (new_end - timedelta(hours=4)).isoformat()
    assert event["data"]["ends_at"] == new_end.isoformat()
    assert Decimal(event["data"]["credits_held"]) == Decimal(data["extra_credits"])


def test_the_extend_quote_says_when_a_gpu_is_booked_after(api_client, team):  # type: ignore[no-untyped-def]
    r = _book(team, count=4)  # the whole server
    later = _book(team, start_in=timedelta(hours=5), hours=1, count=1)
    api_client.force_authenticate(team["owner"])
    quote = api_client.get(
        f"{URL}{r.public_id}/extend-quote/", {"ends_at": (r.ends_at + timedelta(days=1)).isoformat()}
    ).data
    assert quote["allowed"] is False and quote["gpus_free"] is False
    assert quote["refusal"]["code"] == "gpu_taken"
    assert quote["refusal"]["free_until"] == later.starts_at.isoformat()
    # Up to the next booking it is free.
    ok = api_client.get(f"{URL}{r.public_id}/extend-quote/", {"ends_at": later.starts_at.isoformat()}).data
    assert ok["allowed"] is True


def test_the_extend_quote_says_when_the_quota_refuses(api_client, team):  # type: ignore[no-untyped-def]
    r = _book(team)
    api_client.force_authenticate(team["owner"])
    quote = api_client.get(
        f"{URL}{r.public_id}/extend-quote/", {"ends_at": (r.ends_at + timedelta(days=30)).isoformat()}
    ).data
    assert quote["allowed"] is False and quote["gpus_free"] is True
    assert quote["refusal"]["code"] == "quota_exceeded"


def test_the_extend_quote_refuses_bad_input_clearly(api_client, team):  # type: ignore[no-untyped-def]
    r = _book(team)
    api_client.force_authenticate(team["owner"])
    missing = api_client.get(f"{URL}{r.public_id}/extend-quote/")
    assert missing.status_code == 400 and "ends_at" in missing.data["error"]["fields"]
    naive = api_client.get(f"{URL}{r.public_id}/extend-quote/", {"ends_at": "2030-01-01T10:00:00"})
    assert naive.status_code == 400 and "ends_at" in naive.data["error"]["fields"]
    earlier = api_client.get(f"{URL}{r.public_id}/extend-quote/", {"ends_at": r.starts_at.isoformat()}).data
    assert earlier["allowed"] is False and earlier["refusal"]["code"] == "validation_error"
    api_client.force_authenticate(team["outsider"])
    other = api_client.get(f"{URL}{r.public_id}/extend-quote/", {"ends_at": r.ends_at.isoformat()})
    assert other.status_code == 404


def test_the_history_filters_by_state_project_and_period(api_client, team):  # type: ignore[no-untyped-def]
    then = timezone.now() - timedelta(days=3)
    old = _book(team, start_in=timedelta(0), hours=1, count=1, now=then)
    services.reservation_finish(
        reservation=old,
        to=ReservationState.COMPLETED,
        ended_at=old.ends_at,
        actor_label="system:test",
        reason="done",
    )
    recent = _book(team, count=1)
    services.reservation_cancel(reservation=recent, actor=team["owner"])
    other = project(owner=team["owner"])
    api_client.force_authenticate(team["owner"])

    def ids(**query):  # type: ignore[no-untyped-def]
        return {r["id"] for r in api_client.get(URL, query).data["results"]}

    assert ids(state=["completed", "cancelled"]) == {str(old.public_id), str(recent.public_id)}
    assert ids(state="completed") == {str(old.public_id)}
    assert ids(project=other.slug) == set()
    day_before = (then - timedelta(days=1)).isoformat()
    assert ids(ends_after=day_before, ends_before=(then + timedelta(days=1)).isoformat()) == {str(old.public_id)}
    bad = api_client.get(URL, {"ends_before": "yesterday"})
    assert bad.status_code == 400 and "ends_before" in bad.data["error"]["fields"]


def test_what_a_running_reservation_shows_is_what_the_ledger_charges_when_nothing_was_measured(team):  # type: ignore[no-untyped-def]
    """One rule (costs.held_credits) for the figure shown while it runs and for the unmeasured charge."""
    from controlplane.reservations import costs

    then = timezone.now() - timedelta(hours=1)
    r = _book(team, start_in=timedelta(0), hours=2, now=then)
    Reservation.objects.filter(pk=r.pk).update(state=ReservationState.RUNNING)
    ended = then + timedelta(minutes=7, seconds=13)  # an odd length, so any rounding apart would show
    shown = costs.cost_for(Reservation.objects.get(pk=r.pk), now=ended)["credits_so_far"]
    assert services.reservation_finish(
        reservation=r, to=ReservationState.COMPLETED, ended_at=ended, actor_label="system:test", reason="done"
    )
    charge = LedgerEntry.objects.get(reservation=r, kind=EntryKind.CHARGE)
    assert Decimal(shown) == -charge.amount
