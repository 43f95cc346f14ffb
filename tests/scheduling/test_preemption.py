"""The queue's side of preemption: higher classes take preemptible GPUs after the notice; requeue."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.reservations import services as booking
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import Window
from controlplane.scheduling import services
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import QueuedRequest
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec
from tests.scheduling.support import klass

pytestmark = pytest.mark.django_db


@pytest.fixture
def h100():  # type: ignore[no-untyped-def]
    model = gpu_model()
    server(model, gpus=2)
    return model


def submit(proj, s, *, priority="normal", requeue=False, hours=1, now=None):  # type: ignore[no-untyped-def]
    return services.request_submit(
        project=proj,
        name=f"{priority}-job",
        spec=s,
        container=CONTAINER,
        duration=timedelta(hours=hours),
        start_by=None,
        priority_class=klass(priority),
        actor=UserFactory(),
        now=now,
        requeue=requeue,
    )


def started(request: QueuedRequest) -> Reservation:
    request.refresh_from_db()
    assert request.state == RequestState.STARTED, request.reason
    assert request.reservation is not None
    return request.reservation


def test_a_preemptible_request_books_at_the_class_terms_on_free_gpus(h100):
    now = timezone.now()
    r = submit(project(), spec(h100, count=2), priority="preemptible", now=now)
    services.schedule_pass(now=now)
    reservation = started(r)
    assert reservation.preemptible and reservation.notice_seconds == 120
    assert reservation.credit_multiplier == Decimal("0.5")
    hold = LedgerEntry.objects.get(reservation=reservation, kind=EntryKind.HOLD)
    assert -hold.amount == Decimal("1")  # 2 GPUs x 1 h x weight 1 x 0.5


def test_a_high_request_holds_one_and_a_half_times(h100):
    now = timezone.now()
    r = submit(project(), spec(h100, count=2), priority="high", now=now)
    services.schedule_pass(now=now)
    reservation = started(r)
    assert not reservation.preemptible
    assert -LedgerEntry.objects.get(reservation=reservation, kind=EntryKind.HOLD).amount == Decimal("3")


@pytest.mark.parametrize("priority", ["high", "normal"])
def test_a_higher_class_request_preempts_from_now_plus_the_notice(h100, priority):
    now = timezone.now()
    low = submit(project(), spec(h100, count=2), priority="preemptible", hours=3, now=now)
    services.schedule_pass(now=now)
    victim = started(low)
    later = now + timedelta(seconds=30)
    winner_request = submit(project(), spec(h100, count=2), priority=priority, now=later)
    assert services.schedule_pass(now=later) == 1
    winner = started(winner_request)
    assert winner.starts_at == later + timedelta(seconds=120)
    victim.refresh_from_db()
    assert victim.ends_at == winner.starts_at and victim.preempted_by_id == winner.pk
    low.refresh_from_db()
    assert f"preempted by reservation {winner.public_id}" in low.events.order_by("-pk").first().reason
    # Without requeue, nothing goes back into the queue.
    assert not QueuedRequest.objects.filter(requeued_from=low).exists()


def test_a_preemptible_request_never_preempts_another(h100):
    now = timezone.now()
    first = submit(project(), spec(h100, count=2), priority="preemptible", hours=3, now=now)
    services.schedule_pass(now=now)
    victim = started(first)
    second = submit(project(), spec(h100, count=2), priority="preemptible", now=now)
    assert services.schedule_pass(now=now + timedelta(seconds=1)) == 0
    second.refresh_from_db()
    assert second.state == RequestState.QUEUED
    victim.refresh_from_db()
    assert victim.preempted_by_id is None


def test_a_higher_class_request_never_preempts_an_advance_reservation(h100):
    now = timezone.now()
    advance = booking.reservation_create(
        project=project(),
        name="advance",
        spec=spec(h100, count=2),
        window=Window(now, now + timedelta(hours=3)),
        container=CONTAINER,
        actor=UserFactory(),
        now=now,
    )
    r = submit(project(), spec(h100, count=2), priority="high", now=now)
    assert services.schedule_pass(now=now) == 0
    r.refresh_from_db()
    assert r.state == RequestState.QUEUED
    advance.refresh_from_db()
    assert advance.ends_at == now + timedelta(hours=3) and advance.preempted_by_id is None


def test_a_requeue_request_goes_back_into_the_queue_when_preempted(h100):
    now = timezone.now()
    low = submit(project(), spec(h100, count=2), priority="preemptible", requeue=True, hours=3, now=now)
    services.schedule_pass(now=now)
    victim = started(low)
    Reservation.objects.filter(pk=victim.pk).update(state=ReservationState.RUNNING)
    # An advance reservation via the booking service, in an hour.
    winner = booking.reservation_create(
        project=project(),
        name="advance",
        spec=spec(h100, count=2),
        window=Window(now + timedelta(hours=1), now + timedelta(hours=2)),
        container=CONTAINER,
        actor=UserFactory(),
        now=now,
    )
    again = QueuedRequest.objects.get(requeued_from=low)
    assert again.state == RequestState.QUEUED and again.requeue
    assert (again.spec, again.container, again.duration_seconds) == (low.spec, low.container, low.duration_seconds)
    assert again.priority_class.name == "preemptible" and again.project_id == low.project_id
    assert f"preempted by reservation {winner.public_id}" in again.events.get().reason
    low.refresh_from_db()
    assert str(again.public_id) in low.events.order_by("-pk").first().reason
    # It starts again once GPUs are free for its whole duration: after the advance reservation.
    assert services.schedule_pass(now=now + timedelta(seconds=5)) == 0
    victim.refresh_from_db()
    booking.reservation_finish(
        reservation=victim,
        to=ReservationState.COMPLETED,
        ended_at=victim.ends_at,
        actor_label="test",
        reason="stopped",
    )
    Reservation.objects.filter(pk=winner.pk).update(state=ReservationState.COMPLETED)
    winner.allocations.update(active=False)
    assert services.schedule_pass(now=now + timedelta(hours=2)) == 1
    assert started(again).preemptible


# -- the API ------------------------------------------------------------------------------------------------


def test_the_api_shows_requeue_and_the_preemption_on_both_sides(api_client, h100):
    owner = UserFactory()
    proj = project(owner=owner)
    api_client.force_authenticate(owner)
    data = {
        "project": proj.slug,
        "name": "ckpt",
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 2},
        "container": {"image": "registry.example/train:1"},
        "duration": "3h",
        "priority_class": "preemptible",
        "requeue": True,
    }
    response = api_client.post("/api/v1/requests/", data, format="json")
    assert response.status_code == 201, response.data
    assert response.data["requeue"] is True and response.data["requeued_from"] is None
    now = timezone.now()
    services.schedule_pass(now=now)
    low = QueuedRequest.objects.get(public_id=response.data["id"])
    victim = started(low)
    start = (now + timedelta(hours=1)).isoformat()
    end = (now + timedelta(hours=2)).isoformat()
    advance = {
        "project": proj.slug,
        "name": "advance",
        "spec": {"gpu_model": "H100-80GB", "gpu_count": 2},
        "window": {"start": start, "end": end},
        "container": {"image": "registry.example/train:1"},
    }
    response = api_client.post("/api/v1/reservations/", advance, format="json")
    assert response.status_code == 201, response.data
    winner_id = response.data["id"]
    assert response.data["preemptible"] is False and response.data["preempted_by"] is None
    assert response.data["credit_multiplier"] == "1.000" and response.data["cost"]["credit_multiplier"] == "1.000"
    detail = api_client.get(f"/api/v1/reservations/{victim.public_id}/").data
    assert detail["preemptible"] is True and detail["notice_seconds"] == 120
    assert detail["credit_multiplier"] == "0.500" and detail["preempted_by"] == winner_id
    assert detail["cost"]["credits_per_hour"] == "1.0000"  # two GPUs of weight 1, x0.5
    listed = {r["id"]: r for r in api_client.get("/api/v1/reservations/").data["results"]}
    assert listed[str(victim.public_id)]["preempted_by"] == winner_id
    requests = {r["id"]: r for r in api_client.get("/api/v1/requests/").data["results"]}
    (again,) = [r for r in requests.values() if r["requeued_from"] == str(low.public_id)]
    assert again["state"] == "queued" and again["requeue"] is True
    # The timeline marks the preemptible holder's segments as yielding capacity, the advance one's not.
    timeline = api_client.get(
        "/api/v1/availability/timeline/", {"start": "now", "end": (now + timedelta(hours=3)).isoformat()}
    ).data
    segments = [s for g in timeline["gpus"] for s in g["segments"]]
    assert {(s["reservation"], s["yielding"]) for s in segments} == {(str(victim.public_id), True), (winner_id, False)}


def test_submit_prices_the_quota_check_with_the_class_multiplier(h100):
    from controlplane.core.errors import QuotaExceeded

    proj = project(grant="1.5")
    with pytest.raises(QuotaExceeded):
        submit(proj, spec(h100, count=2), priority="normal")  # 2 GPUs x 1 h x 1 = 2 credits
    assert submit(proj, spec(h100, count=2), priority="preemptible").state == RequestState.QUEUED  # 1 credit


def test_a_preempting_booking_the_quota_refuses_cuts_nothing_and_waits(h100):
    now = timezone.now()
    low = submit(project(), spec(h100, count=2), priority="preemptible", hours=3, now=now)
    services.schedule_pass(now=now)
    victim = started(low)
    poor = project(grant="1")
    r = services.request_submit(
        project=poor,
        name="cheap",
        spec=spec(h100, count=1),
        container=CONTAINER,
        duration=timedelta(minutes=30),
        start_by=None,
        priority_class=klass("high"),
        actor=UserFactory(),
        now=now,
    )  # 0.75 credits: submit accepts it
    from controlplane.ledger.services import ledger_adjust

    ledger_adjust(project=poor, amount=Decimal("-0.5"), actor=None, reason="spent elsewhere")
    assert services.schedule_pass(now=now + timedelta(seconds=1)) == 0
    r.refresh_from_db()
    assert r.state == RequestState.QUEUED and r.reservation is None
    victim.refresh_from_db()
    assert victim.preempted_by_id is None and victim.ends_at == now + timedelta(hours=3)
