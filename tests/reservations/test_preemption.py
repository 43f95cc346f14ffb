"""Preemption in booking: which preemptible reservations a non-preemptible booking cuts short, with notice."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from controlplane.core.errors import Conflict
from controlplane.dispatch.services import _desired_container, reservation_open
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.reservations import services
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Allocation, Reservation, ReservationEvent
from controlplane.reservations.specs import Window
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec

pytestmark = pytest.mark.django_db

NOTICE = 120


@pytest.fixture
def h100():  # type: ignore[no-untyped-def]
    return gpu_model()


def book(
    model: Any,
    *,
    start: datetime,
    hours: float = 1,
    count: int | None = 1,
    whole: int | None = None,
    preemptible: bool = False,
    notice: int = 0,
    multiplier: str = "1",
    now: datetime | None = None,
    proj: Any = None,
    name: str = "job",
) -> Reservation:
    return services.reservation_create(
        project=proj or project(),
        name=name,
        spec=spec(model, count=count, whole=whole),
        window=Window(start, start + timedelta(hours=hours)),
        container=CONTAINER,
        actor=UserFactory(),
        now=now or start,
        preemptible=preemptible,
        notice_seconds=notice,
        credit_multiplier=Decimal(multiplier),
    )


def running_preemptible(
    model: Any, *, now: datetime, count: int = 1, ago: float = 600, hours: float = 3
) -> Reservation:
    """A preemptible reservation that started ``ago`` seconds before ``now`` and is running."""
    start = now - timedelta(seconds=ago)
    r = book(model, start=start, hours=hours, count=count, preemptible=True, notice=NOTICE, multiplier="0.5")
    Reservation.objects.filter(pk=r.pk).update(state=ReservationState.RUNNING)
    r.refresh_from_db()
    return r


def gpus_of(r: Reservation) -> set[int]:
    return set(r.allocations.filter(active=True).values_list("gpu_id", flat=True))


def test_an_advance_booking_cuts_a_preemptible_reservation_to_its_start(h100):
    server(h100, gpus=2)
    now = timezone.now()
    victim = running_preemptible(h100, now=now, count=2)
    start = now + timedelta(minutes=30)
    winner = book(h100, start=start, count=2, now=now)
    victim.refresh_from_db()
    assert victim.ends_at == start and victim.preempted_by_id == winner.pk
    assert victim.yield_notice_seconds == NOTICE and "preempted by" in victim.yield_reason
    assert set(victim.allocations.values_list("ends_at", flat=True)) == {start}
    assert gpus_of(winner) == gpus_of(victim)
    event = victim.events.order_by("-pk").first()
    assert event.data["preempted_by"] == str(winner.public_id)
    assert event.data["notice_seconds"] == NOTICE
    assert event.reason == f"preempted by reservation {winner.public_id}"
    # The victim keeps running until the cut: nothing of its window before the winner's start is taken.
    assert victim.state == ReservationState.RUNNING


def test_a_booking_sooner_than_the_notice_is_refused_and_says_when_the_gpus_yield(h100):
    server(h100, gpus=1)
    now = timezone.now()
    victim = running_preemptible(h100, now=now)
    with pytest.raises(Conflict) as caught:
        book(h100, start=now + timedelta(seconds=60), now=now)
    assert caught.value.code == "no_capacity"
    yield_at = datetime.fromisoformat(caught.value.extra["preemptible_yield_at"].replace("Z", "+00:00"))
    assert abs((yield_at - (now + timedelta(seconds=NOTICE))).total_seconds()) < 1
    assert "Preemptible reservations hold enough of them" in caught.value.message
    victim.refresh_from_db()
    assert victim.preempted_by_id is None and victim.ends_at == now - timedelta(seconds=600) + timedelta(hours=3)
    assert Reservation.objects.count() == 1


def test_a_booking_that_fits_on_free_gpus_preempts_nothing(h100):
    server(h100, gpus=1)
    server(h100, gpus=1)
    now = timezone.now()
    victim = running_preemptible(h100, now=now)
    winner = book(h100, start=now + timedelta(seconds=10), now=now)
    victim.refresh_from_db()
    assert victim.preempted_by_id is None and not (gpus_of(winner) & gpus_of(victim))


def test_a_non_preemptible_reservation_is_never_cut(h100):
    server(h100, gpus=1)
    now = timezone.now()
    held = book(h100, start=now, hours=3, now=now)
    with pytest.raises(Conflict) as caught:
        book(h100, start=now + timedelta(hours=1), now=now)
    assert caught.value.code == "no_capacity" and "preemptible_yield_at" not in caught.value.extra
    held.refresh_from_db()
    assert held.ends_at == now + timedelta(hours=3) and held.preempted_by_id is None


def test_a_preemptible_booking_never_preempts(h100):
    server(h100, gpus=1)
    now = timezone.now()
    victim = running_preemptible(h100, now=now)
    with pytest.raises(Conflict):
        book(h100, start=now + timedelta(hours=1), preemptible=True, notice=NOTICE, now=now)
    victim.refresh_from_db()
    assert victim.preempted_by_id is None


def test_the_fewest_victims_then_the_fewest_gpus_then_the_most_recently_started(h100):
    server(h100, gpus=4, nvlink_groups=[[0, 1], [2, 3]], numa=[0, 0, 1, 1])
    now = timezone.now()
    pair = running_preemptible(h100, now=now, count=2, ago=900)  # GPUs 0 and 1
    older = running_preemptible(h100, now=now, count=1, ago=800)
    newer = running_preemptible(h100, now=now, count=1, ago=100)
    start = now + timedelta(minutes=10)
    one = book(h100, start=start, hours=0.5, now=now)
    for r in (pair, older, newer):
        r.refresh_from_db()
    # One GPU: the newest one-GPU victim, only it.
    assert newer.preempted_by_id == one.pk and gpus_of(one) == gpus_of(newer)
    assert pair.preempted_by_id is None and older.preempted_by_id is None


def test_one_victim_of_two_gpus_beats_two_victims_of_one(h100):
    server(h100, gpus=4, nvlink_groups=[[0, 1], [2, 3]], numa=[0, 0, 1, 1])
    now = timezone.now()
    pair = running_preemptible(h100, now=now, count=2, ago=900)
    singles = [running_preemptible(h100, now=now, ago=ago) for ago in (800, 100)]
    two = book(h100, start=now + timedelta(minutes=10), count=2, hours=0.5, now=now)
    pair.refresh_from_db()
    assert pair.preempted_by_id == two.pk
    assert gpus_of(two) == set(Allocation.objects.filter(reservation=pair).values_list("gpu_id", flat=True))
    assert not Reservation.objects.filter(pk__in=[r.pk for r in singles], preempted_by__isnull=False).exists()


def test_only_victims_on_gpus_the_winner_takes_are_cut(h100):
    """Three preemptible reservations on a 4-GPU server, one GPU free: a 2-GPU booking cuts one, not three."""
    server(h100, gpus=4, nvlink_groups=[[0, 1, 2, 3]], numa=[0, 0, 0, 0])
    now = timezone.now()
    victims = [running_preemptible(h100, now=now, ago=300 + i) for i in range(3)]
    winner = book(h100, start=now + timedelta(minutes=5), count=2, now=now)
    cut = [v for v in victims if (v.refresh_from_db() or v.preempted_by_id == winner.pk)]
    assert len(cut) == 1
    assert gpus_of(cut[0]) <= gpus_of(winner)


def test_a_preemptible_reservation_that_has_not_started_is_cancelled_without_charge(h100):
    server(h100, gpus=1)
    now = timezone.now()
    later = book(h100, start=now + timedelta(hours=1), hours=2, preemptible=True, notice=NOTICE, now=now)
    # Even a winner that starts sooner than the notice: the victim never runs, so it needs none.
    winner = book(h100, start=now + timedelta(seconds=30), hours=2, now=now)
    later.refresh_from_db()
    assert later.state == ReservationState.CANCELLED and later.preempted_by_id == winner.pk
    charged = LedgerEntry.objects.filter(reservation=later, kind=EntryKind.CHARGE)
    assert sum((e.amount for e in charged), Decimal(0)) == 0
    assert later.events.order_by("-pk").first().data["preempted_by"] == str(winner.public_id)


def test_a_whole_server_booking_preempts_what_holds_the_server(h100):
    server(h100, gpus=2)
    now = timezone.now()
    a = running_preemptible(h100, now=now)
    b = running_preemptible(h100, now=now, ago=30)
    winner = book(h100, start=now + timedelta(minutes=3), count=None, whole=1, now=now)
    for r in (a, b):
        r.refresh_from_db()
        assert r.preempted_by_id == winner.pk
    assert len(gpus_of(winner)) == 2


def test_the_multiplier_prices_the_hold_and_the_cost(h100):
    server(h100, gpus=4)
    now = timezone.now()
    start = now + timedelta(hours=1)
    rates = {}
    for multiplier in ("1.5", "1", "0.5"):
        r = book(h100, start=start, hours=2, multiplier=multiplier, now=now)
        hold = LedgerEntry.objects.get(reservation=r, kind=EntryKind.HOLD)
        rates[multiplier] = -hold.amount
        from controlplane.reservations.costs import cost_for

        cost = cost_for(Reservation.objects.get(pk=r.pk), now=now)
        assert cost["credit_multiplier"] == str(Decimal(multiplier).quantize(Decimal("0.001")))
        assert Decimal(cost["booked_credits"]) == rates[multiplier]
    assert rates == {"1.5": Decimal("3"), "1": Decimal("2"), "0.5": Decimal("1")}


def test_a_preempted_reservation_is_charged_only_for_what_it_ran(h100):
    server(h100, gpus=1)
    now = timezone.now()
    victim = running_preemptible(h100, now=now, ago=3600, hours=4)  # weight 1, x0.5, 4 h booked: 2 held
    assert -LedgerEntry.objects.get(reservation=victim, kind=EntryKind.HOLD).amount == Decimal("2")
    start = now + timedelta(seconds=NOTICE)
    book(h100, start=start, now=now)
    victim.refresh_from_db()
    assert services.reservation_finish(
        reservation=victim,
        to=ReservationState.COMPLETED,
        ended_at=victim.ends_at,
        actor_label="test",
        reason="window closed",
    )
    ran_hours = Decimal(3600 + NOTICE) / 3600
    charge = -LedgerEntry.objects.get(reservation=victim, kind=EntryKind.CHARGE).amount
    assert charge == (Decimal("0.5") * ran_hours).quantize(charge)
    # The hold beyond the cut went back: the reservation holds nothing any more.
    entries = LedgerEntry.objects.filter(reservation=victim)
    held = sum((e.amount for e in entries if e.kind in (EntryKind.HOLD, EntryKind.RELEASE)), Decimal(0))
    assert held == 0


def test_yield_gives_the_container_its_notice_before_the_new_end(h100):
    server(h100, gpus=1)
    now = timezone.now()
    r = book(h100, start=now, hours=2, preemptible=True, notice=NOTICE, now=now)
    (launch,) = reservation_open(reservation_id=r.pk, now=now)
    launch.reservation.refresh_from_db()
    before = _desired_container(launch)
    assert before.window_end == now + timedelta(hours=2) and before.notice_reason is None
    end = now + timedelta(seconds=600)
    services.reservation_yield(
        reservation=r, end_at=end, notice_seconds=NOTICE, reason="idle GPUs reclaimed", by=None, actor=None, now=now
    )
    launch.reservation.refresh_from_db()
    after = _desired_container(launch)
    assert after.window_end == end and after.warn_before_s == NOTICE
    assert after.notice_reason == "idle GPUs reclaimed"
    event = ReservationEvent.objects.filter(reservation=r).order_by("-pk").first()
    assert event.data["preempted_by"] is None and event.reason == "idle GPUs reclaimed"


def test_yield_refuses_a_cut_without_its_notice_or_past_the_end(h100):
    server(h100, gpus=1)
    now = timezone.now()
    r = running_preemptible(h100, now=now)
    with pytest.raises(Conflict) as caught:
        services.reservation_yield(
            reservation=r,
            end_at=now + timedelta(seconds=60),
            notice_seconds=NOTICE,
            reason="x",
            by=None,
            actor=None,
            now=now,
        )
    assert caught.value.code == "notice_too_short"
    with pytest.raises(Conflict) as caught:
        services.reservation_yield(
            reservation=r, end_at=r.ends_at, notice_seconds=0, reason="x", by=None, actor=None, now=now
        )
    assert caught.value.code == "invalid_state"
    r.refresh_from_db()
    assert r.yield_notice_seconds is None and r.events.count() == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_bookings_racing_for_one_victims_gpus_never_double_book_or_double_cut(h100):
    import threading

    from django.db import connection

    assert connection.vendor == "postgresql"
    server(h100, gpus=2)
    now = timezone.now()
    victim = running_preemptible(h100, now=now, count=2)
    start = now + timedelta(minutes=10)
    outcomes: list[str] = []
    barrier = threading.Barrier(4)
    projects = [project() for _ in range(4)]

    def body(i: int) -> None:
        try:
            barrier.wait()
            book(h100, start=start, count=2, now=now, proj=projects[i])
            outcomes.append("booked")
        except Conflict as exc:
            outcomes.append(exc.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("booked") == 1, outcomes
    victim.refresh_from_db()
    assert victim.ends_at == start
    yields = [e for e in victim.events.all() if e.data.get("preempted_by")]
    assert len(yields) == 1
    # No GPU is held twice at any instant.
    active = list(Allocation.objects.filter(active=True).values_list("gpu_id", "starts_at", "ends_at"))
    for i, (g, a, b) in enumerate(active):
        for g2, a2, b2 in active[i + 1 :]:
            assert g != g2 or b <= a2 or b2 <= a
