from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.celery import app as celery_app
from controlplane.core.errors import Conflict, QuotaExceeded, ValidationFailed
from controlplane.ledger.selectors import project_balance
from controlplane.ledger.services import quota_policy_set
from controlplane.reservations import services as booking
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Allocation, Reservation
from controlplane.scheduling import services
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import PriorityClass
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window
from tests.scheduling.support import allow, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def h100():  # type: ignore[no-untyped-def]
    model = gpu_model()
    server(model, gpus=2)
    return model


def occupy(proj, model, count=2, hours=3):  # type: ignore[no-untyped-def]
    """A reservation holding ``count`` GPUs from now."""
    return booking.reservation_create(
        project=proj,
        name="blocker",
        spec=spec(model, count=count),
        window=window(start_in=timedelta(0), hours=hours),
        container=CONTAINER,
        actor=UserFactory(),
    )


def test_the_classes_come_from_the_migration():
    assert [(c.name, c.rank, c.credit_multiplier, c.preemptible) for c in PriorityClass.objects.all()] == [
        ("high", 100, Decimal("1.500"), False),
        ("normal", 50, Decimal("1.000"), False),
        ("preemptible", 10, Decimal("0.500"), True),
    ]
    assert PriorityClass.objects.get(name="preemptible").notice_seconds == 120
    # Only the projects an operator grants it may use "high"; "normal" is anyone's.
    assert [(c.name, c.restricted) for c in PriorityClass.objects.all()] == [
        ("high", True),
        ("normal", False),
        ("preemptible", False),
    ]


def test_submitting_in_a_restricted_class_needs_the_policy_to_allow_it(h100):
    proj = project()
    with pytest.raises(ValidationFailed) as exc:
        submit(proj, spec(h100), priority="high", allow_class=False)
    assert list(exc.value.fields) == ["priority_class"]
    assert not proj.queued_requests.exists()
    allow(proj, "high")
    assert submit(proj, spec(h100), priority="high", allow_class=False).priority_class.name == "high"


def test_an_operator_class_change_is_an_event_and_reorders_the_queue():
    model = gpu_model()
    server(model, gpus=1)
    proj = project()
    first = submit(proj, spec(model), name="first")
    second = submit(proj, spec(model), name="second")
    operator = UserFactory(is_staff=True)
    moved = services.request_set_class(
        request=second, priority_class=PriorityClass.objects.get(name="high"), actor=operator, reason="deadline"
    )
    assert moved.priority_class.name == "high" and moved.state == RequestState.QUEUED
    assert moved.events.last().reason == "class normal -> high: deadline"
    assert services.schedule_pass() == 1
    second.refresh_from_db()
    first.refresh_from_db()
    assert second.state == RequestState.STARTED and first.state == RequestState.QUEUED
    with pytest.raises(Conflict) as exc:
        services.request_set_class(
            request=second, priority_class=PriorityClass.objects.get(name="normal"), actor=operator
        )
    assert exc.value.code == "invalid_state"


def test_submit_queues_without_holding_anything(h100):
    proj = project(grant="100")
    r = submit(proj, spec(h100, count=2))
    assert r.state == RequestState.QUEUED and r.reservation is None
    assert project_balance(project_id=proj.pk) == Decimal("100")
    assert [(e.from_state, e.to_state) for e in r.events.all()] == [("", "queued")]


def test_submit_refuses_more_gpus_than_the_fleet_has_in_the_words_of_no_capacity(h100):
    with pytest.raises(Conflict) as exc:
        submit(project(), spec(h100, count=3))
    assert exc.value.code == "no_capacity"
    assert "spec.gpu_count" in exc.value.fields
    assert "fewer than the 3 asked for, so no window can fit" in exc.value.message


def test_submit_refuses_a_duration_beyond_the_longest_booking(h100):
    proj = project()
    quota_policy_set(project=proj, actor=None, max_reservation_hours=Decimal("2"))
    with pytest.raises(QuotaExceeded) as exc:
        submit(proj, spec(h100), hours=3)
    assert exc.value.extra["quota"] == "max_reservation_hours"


def test_submit_refuses_a_cost_beyond_the_credits(h100):
    with pytest.raises(QuotaExceeded) as exc:
        submit(project(grant="1"), spec(h100, count=2), hours=2)
    assert exc.value.extra["quota"] == "credits"


def test_submit_refuses_a_bad_spec_a_naive_or_past_start_by_and_a_zero_duration(h100):
    proj = project()
    with pytest.raises(ValidationFailed) as exc:
        submit(proj, spec(h100, count=0))
    assert "spec.gpu_count" in exc.value.fields
    with pytest.raises(ValidationFailed) as exc:
        submit(proj, spec(h100), start_by=timezone.now().replace(tzinfo=None) + timedelta(hours=1))
    assert "start_by" in exc.value.fields
    with pytest.raises(ValidationFailed) as exc:
        submit(proj, spec(h100), start_by=timezone.now() - timedelta(minutes=1))
    assert "start_by" in exc.value.fields
    with pytest.raises(ValidationFailed) as exc:
        submit(proj, spec(h100), hours=0)
    assert "duration" in exc.value.fields


def test_cancel_only_while_queued(h100):
    proj = project()
    r = submit(proj, spec(h100))
    cancelled = services.request_cancel(request=r, actor=UserFactory(), reason="changed my mind")
    assert cancelled.state == RequestState.CANCELLED
    assert cancelled.events.last().reason == "changed my mind"
    with pytest.raises(Conflict) as exc:
        services.request_cancel(request=r, actor=UserFactory())
    assert exc.value.code == "invalid_state"
    started = submit(proj, spec(h100))
    assert services.schedule_pass() == 1
    with pytest.raises(Conflict) as exc:
        services.request_cancel(request=started, actor=UserFactory())
    assert exc.value.code == "invalid_state"


def test_the_pass_starts_a_request_at_once_when_its_gpus_are_free(h100):
    proj = project(grant="100")
    r = submit(proj, spec(h100, count=2), hours=2)
    now = timezone.now()
    assert services.schedule_pass(now=now) == 1
    r.refresh_from_db()
    assert r.state == RequestState.STARTED and r.started_at == now and r.reason == ""
    res = r.reservation
    # An ordinary reservation: booked by the booking service, from now for the duration, credits held.
    assert res.state == ReservationState.SCHEDULED and res.project == proj and res.created_by == r.created_by
    assert (res.starts_at, res.ends_at) == (now, now + timedelta(hours=2))
    assert res.allocations.filter(active=True).count() == 2
    assert project_balance(project_id=proj.pk) == Decimal("96")
    assert [e.to_state for e in r.events.all()] == ["queued", "started"]
    assert services.schedule_pass() == 0  # nothing left to do


def test_a_request_waits_while_its_gpus_are_booked_and_starts_once_they_are_released(h100):
    proj = project()
    blocker = occupy(proj, h100)
    r = submit(proj, spec(h100, count=2))
    assert services.schedule_pass() == 0
    r.refresh_from_db()
    assert r.state == RequestState.QUEUED
    assert r.reason.startswith(f"waiting for 2 x H100-80GB; blocked by reservation {blocker.public_id} until ")
    assert r.blocked_by == blocker and r.blocked_until == blocker.ends_at
    booking.reservation_release(reservation=blocker, actor=UserFactory())
    assert services.schedule_pass() == 1
    r.refresh_from_db()
    assert r.state == RequestState.STARTED


@pytest.fixture
def eager_celery():  # type: ignore[no-untyped-def]
    before = celery_app.conf.task_always_eager
    celery_app.conf.update(task_always_eager=True, CELERY_TASK_ALWAYS_EAGER=True)
    yield
    celery_app.conf.update(task_always_eager=before, CELERY_TASK_ALWAYS_EAGER=before)


@pytest.mark.parametrize("free", ["cancel", "finish"])
def test_freeing_gpus_runs_the_pass_through_the_reservations_hook(
    h100, eager_celery, django_capture_on_commit_callbacks, free
):  # type: ignore[no-untyped-def]
    proj = project()
    if free == "cancel":
        blocker = booking.reservation_create(
            project=proj,
            name="later",
            spec=spec(h100, count=2),
            window=window(start_in=timedelta(minutes=30)),
            container=CONTAINER,
            actor=UserFactory(),
        )
        r = submit(proj, spec(h100, count=2), hours=1)
    else:
        blocker = occupy(proj, h100)
        r = submit(proj, spec(h100, count=2), hours=1)
    assert services.schedule_pass() == 0
    with django_capture_on_commit_callbacks(execute=True):
        if free == "cancel":
            booking.reservation_cancel(reservation=blocker, actor=UserFactory())
        else:
            booking.reservation_finish(
                reservation=blocker,
                to=ReservationState.COMPLETED,
                ended_at=timezone.now(),
                actor_label="system:test",
                reason="done",
            )
    r.refresh_from_db()
    assert r.state == RequestState.STARTED


def test_an_advance_reservation_is_never_delayed_by_the_queue(h100):
    proj = project()
    advance = booking.reservation_create(
        project=proj,
        name="advance",
        spec=spec(h100, count=2),
        window=window(start_in=timedelta(minutes=30)),
        container=CONTAINER,
        actor=UserFactory(),
    )
    r = submit(proj, spec(h100, count=1), hours=1)  # would overlap the advance window
    assert services.schedule_pass() == 0
    r.refresh_from_db()
    assert r.state == RequestState.QUEUED
    assert Allocation.objects.filter(active=True).exclude(reservation=advance).count() == 0


def test_a_higher_class_starts_first():
    model = gpu_model()
    server(model, gpus=1)
    proj = project()
    normal = submit(proj, spec(model), name="normal")
    high = submit(proj, spec(model), priority="high", name="high")
    assert services.schedule_pass() == 1
    normal.refresh_from_db()
    high.refresh_from_db()
    assert high.state == RequestState.STARTED and normal.state == RequestState.QUEUED


def test_fifo_within_a_class_and_nothing_starts_that_would_delay_a_blocked_one_ahead():
    model = gpu_model()
    server(model, gpus=2)
    proj = project()
    first = submit(proj, spec(model, count=1), priority="high", name="first")
    big = submit(proj, spec(model, count=2), priority="high", name="big")  # cannot fit beside "first"
    # Both longer than "first": started now on the free GPU, either would push back "big"'s start.
    small_high = submit(proj, spec(model, count=1), hours=2, priority="high", name="small-high")
    small_normal = submit(proj, spec(model, count=1), hours=2, name="small-normal")
    assert services.schedule_pass() == 1
    states = {r.name: r.state for r in (first, big, small_high, small_normal) if not r.refresh_from_db()}
    # One GPU stays free, but neither the equal-class request behind "big" nor the lower-class one takes it.
    assert states == {
        "first": RequestState.STARTED,
        "big": RequestState.QUEUED,
        "small-high": RequestState.QUEUED,
        "small-normal": RequestState.QUEUED,
    }


def test_a_request_not_started_by_its_start_by_fails(h100):
    proj = project()
    occupy(proj, h100)
    start_by = timezone.now() + timedelta(minutes=10)
    r = submit(proj, spec(h100, count=2), start_by=start_by)
    assert services.schedule_pass(now=start_by - timedelta(minutes=1)) == 0
    assert services.schedule_pass(now=start_by + timedelta(seconds=1)) == 0
    r.refresh_from_db()
    assert r.state == RequestState.FAILED and r.reason == services.NOT_STARTED_BY
    assert r.events.last().to_state == RequestState.FAILED


def test_a_request_the_quota_refuses_now_waits_and_does_not_block_the_rest(h100):
    rich, poor = project(), project(grant="2")
    starved = submit(poor, spec(h100, count=1), hours=1, priority="high")
    booking.reservation_create(  # spends most of poor's credits after it was queued
        project=poor,
        name="spend",
        spec=spec(h100, count=1),
        window=window(start_in=timedelta(days=2), hours=1.5),
        container=CONTAINER,
        actor=UserFactory(),
    )
    other = submit(rich, spec(h100, count=1))
    assert services.schedule_pass() == 1
    starved.refresh_from_db()
    other.refresh_from_db()
    assert starved.state == RequestState.QUEUED and "credits" in starved.reason
    assert other.state == RequestState.STARTED


def test_a_lost_race_rolls_the_booking_back(h100, monkeypatch):  # type: ignore[no-untyped-def]
    """Another pass starting the request between our read and our update: our booking must not survive."""
    from controlplane.scheduling import models

    r = submit(project(), spec(h100, count=1))
    real_create = services.reservation_create

    def create_and_lose(**kwargs):  # type: ignore[no-untyped-def]
        created = real_create(**kwargs)
        models.QueuedRequest.objects.filter(pk=r.pk).update(state=RequestState.CANCELLED)
        return created

    monkeypatch.setattr(services, "reservation_create", create_and_lose)
    assert services.schedule_pass() == 0
    # The booking and the other change came in one transaction with the lost update: none of it is left.
    assert Reservation.objects.count() == 0 and Allocation.objects.count() == 0
    r.refresh_from_db()
    assert r.state == RequestState.QUEUED and r.reservation is None


@pytest.mark.postgres
def test_a_started_request_is_backed_by_the_exclusion_constraint(h100):
    """Its allocations are ordinary ones: the database refuses an overlapping allocation of the same GPU."""
    from django.db import IntegrityError, transaction

    assert connection.vendor == "postgresql"
    r = submit(project(), spec(h100, count=2))
    services.schedule_pass()
    r.refresh_from_db()
    alloc = r.reservation.allocations.first()
    other = Reservation.objects.create(
        project=r.project,
        name="sneak",
        gpu_model=h100,
        gpu_count=1,
        starts_at=alloc.starts_at,
        ends_at=alloc.ends_at,
        image="x",
        state=ReservationState.SCHEDULED,
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(
            reservation=other,
            gpu=alloc.gpu,
            server_id=alloc.server_id,
            starts_at=alloc.starts_at,
            ends_at=alloc.ends_at,
        )
