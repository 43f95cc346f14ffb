from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.core.errors import Conflict, QuotaExceeded, ValidationFailed
from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.ledger.selectors import project_balance
from controlplane.ledger.services import quota_policy_set
from controlplane.reservations import services
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window

pytestmark = pytest.mark.django_db


def book(proj, s, w, user=None, name="job"):  # type: ignore[no-untyped-def]
    return services.reservation_create(
        project=proj, name=name, spec=s, window=w, container=CONTAINER, actor=user or UserFactory()
    )


def test_booking_places_holds_credits_and_records_events():
    h100 = gpu_model(weight="2")
    srv = server(h100, gpus=8)
    proj = project(grant="100")
    r = book(proj, spec(h100, count=2), window(hours=3))
    assert r.state == ReservationState.SCHEDULED
    gpus = list(r.allocations.select_related("gpu"))
    assert len(gpus) == 2 and {a.gpu.server_id for a in gpus} == {srv.pk}
    # 2 GPUs x 3 h x weight 2 = 12 credits held.
    assert project_balance(project_id=proj.pk) == Decimal("88")
    assert [e.to_state for e in r.events.all()] == ["pending", "scheduled"]


def test_overlapping_booking_is_refused_when_the_gpus_are_taken():
    h100 = gpu_model()
    server(h100, gpus=2)
    proj = project()
    w = window(hours=2)
    book(proj, spec(h100, count=2), w)
    with pytest.raises(Conflict) as exc:
        book(proj, spec(h100, count=1), Window(w.starts_at + timedelta(hours=1), w.ends_at + timedelta(hours=1)))
    assert exc.value.code == "no_capacity"
    assert Reservation.objects.count() == 1


def test_back_to_back_windows_share_a_gpu():
    h100 = gpu_model()
    server(h100, gpus=1)
    proj = project()
    w = window(hours=2)
    book(proj, spec(h100), w)
    r2 = book(proj, spec(h100), Window(w.ends_at, w.ends_at + timedelta(hours=1)))
    assert r2.state == ReservationState.SCHEDULED


def test_unhealthy_missing_and_not_ready_gpus_are_never_placed():
    h100 = gpu_model()
    a = server(h100, gpus=1)
    b = server(h100, gpus=1, state=ServerState.MAINTENANCE)
    c = server(h100, gpus=1)
    a.gpus.update(health=GpuHealth.UNHEALTHY)
    c.gpus.update(present=False)
    with pytest.raises(Conflict):
        book(project(), spec(h100), window())
    assert b.gpus.count() == 1


def test_min_memory_spec_matches_bigger_gpus_only():
    small = gpu_model("A10-24GB", 24576)
    big = gpu_model("A100-80GB", 81920)
    server(small, gpus=4)
    srv = server(big, gpus=4)
    r = book(project(), spec(None, count=2, min_memory=40000), window())
    assert {a.gpu.server_id for a in r.allocations.select_related("gpu")} == {srv.pk}


def test_whole_server_booking_takes_every_gpu_of_a_free_server():
    h100 = gpu_model()
    busy = server(h100, gpus=4)
    free = server(h100, gpus=4)
    proj = project()
    w = window()
    book(proj, spec(h100, count=1), w)
    r = book(proj, spec(h100, whole=1), w)
    servers = {a.gpu.server_id for a in r.allocations.select_related("gpu")}
    assert servers == {free.pk} and r.allocations.count() == 4
    assert busy.pk not in servers


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("spec.gpu_model", {"gpu_model_id": None, "min_memory_mib": None, "gpu_count": 1}),
        ("spec.gpu_count", {"gpu_model_id": 1, "gpu_count": 0}),
        ("spec.gpu_count", {"gpu_model_id": 1, "gpu_count": 1, "whole_servers": 1}),
    ],
)
def test_bad_spec_is_refused_naming_the_field(field, kwargs):
    with pytest.raises(ValidationFailed) as exc:
        book(project(), GpuSpec(**kwargs), window())
    assert field in exc.value.fields


def test_window_in_the_past_or_empty_is_refused():
    h100 = gpu_model()
    server(h100)
    now = timezone.now()
    with pytest.raises(ValidationFailed) as exc:
        book(project(), spec(h100), Window(now - timedelta(hours=1), now + timedelta(hours=1)))
    assert "window.start" in exc.value.fields
    with pytest.raises(ValidationFailed) as exc:
        book(project(), spec(h100), Window(now + timedelta(hours=1), now + timedelta(hours=1)))
    assert "window.end" in exc.value.fields


def test_env_must_be_a_string_map():
    h100 = gpu_model()
    server(h100)
    with pytest.raises(ValidationFailed) as exc:
        services.reservation_create(
            project=project(),
            name="x",
            spec=spec(h100),
            window=window(),
            container=ContainerSpec(image="img", env={"A": 1}),
            actor=None,
        )  # type: ignore[dict-item]
    assert "container.env" in exc.value.fields


def test_booking_beyond_credits_is_refused_and_writes_nothing():
    h100 = gpu_model()
    server(h100)
    proj = project(grant="3")
    before = LedgerEntry.objects.count()
    with pytest.raises(QuotaExceeded) as exc:
        book(proj, spec(h100, count=2), window(hours=2))
    assert exc.value.extra == {"quota": "credits", "needed": "4.0000", "available": "3.0000"}
    assert Reservation.objects.count() == 0 and Allocation.objects.count() == 0
    assert LedgerEntry.objects.count() == before


def test_concurrent_gpu_cap_counts_overlapping_reservations_only():
    h100 = gpu_model()
    server(h100, gpus=8)
    proj = project()
    quota_policy_set(project=proj, actor=None, max_concurrent_gpus=3, fields={"max_concurrent_gpus"})
    w = window(hours=2)
    book(proj, spec(h100, count=2), w)
    with pytest.raises(QuotaExceeded) as exc:
        book(proj, spec(h100, count=2), Window(w.starts_at + timedelta(hours=1), w.ends_at + timedelta(hours=1)))
    assert exc.value.extra["quota"] == "max_concurrent_gpus"
    assert exc.value.extra["needed"] == 4
    book(proj, spec(h100, count=2), Window(w.ends_at, w.ends_at + timedelta(hours=1)))


def test_reservation_length_cap_is_enforced():
    h100 = gpu_model()
    server(h100)
    proj = project()
    quota_policy_set(project=proj, actor=None, max_reservation_hours=Decimal("4"), fields={"max_reservation_hours"})
    with pytest.raises(QuotaExceeded) as exc:
        book(proj, spec(h100), window(hours=5))
    assert exc.value.extra["quota"] == "max_reservation_hours"


def test_cancel_before_start_releases_gpus_and_credits():
    h100 = gpu_model()
    server(h100, gpus=1)
    proj = project(grant="10")
    w = window(hours=2)
    r = book(proj, spec(h100), w)
    assert project_balance(project_id=proj.pk) == Decimal("8")
    r = services.reservation_cancel(reservation=r, actor=None, reason="plans changed")
    assert r.state == ReservationState.CANCELLED
    assert project_balance(project_id=proj.pk) == Decimal("10")
    assert not Allocation.objects.filter(active=True).exists()
    assert r.events.last().reason == "plans changed"
    book(proj, spec(h100), w)  # the GPU is free again


def test_cancelling_twice_is_a_conflict():
    h100 = gpu_model()
    server(h100)
    r = book(project(), spec(h100), window())
    services.reservation_cancel(reservation=r, actor=None)
    with pytest.raises(Conflict):
        services.reservation_cancel(reservation=r, actor=None)


def test_release_during_window_cuts_it_and_finish_charges_the_time_used():
    h100 = gpu_model()
    server(h100, gpus=1)
    proj = project(grant="10")
    now = timezone.now()
    r = book(proj, spec(h100), Window(now, now + timedelta(hours=4)))
    later = now + timedelta(hours=1)
    r = services.reservation_release(reservation=r, actor=None, now=later)
    assert r.state == ReservationState.ENDING and r.ends_at == later
    # The GPU is free from the release on.
    book(proj, spec(h100), Window(later + timedelta(minutes=1), later + timedelta(hours=1)))
    assert services.reservation_finish(
        reservation=r, to=ReservationState.COMPLETED, ended_at=later, actor_label="system:dispatch", reason="stopped"
    )
    kinds = list(LedgerEntry.objects.filter(reservation=r).values_list("kind", "amount").order_by("id"))
    assert kinds == [
        (EntryKind.HOLD, Decimal("-4")),
        (EntryKind.RELEASE, Decimal("4")),
        (EntryKind.CHARGE, Decimal("-1")),
    ]
    # finish is idempotent
    assert not services.reservation_finish(
        reservation=r, to=ReservationState.COMPLETED, ended_at=later, actor_label="system:dispatch", reason="again"
    )


def test_finish_charges_measured_gpu_seconds_by_uuid():
    h100 = gpu_model(weight="3")
    server(h100, gpus=2)
    proj = project(grant="100")
    r = book(proj, spec(h100, count=2), window(hours=2))
    uuids = [a.gpu.uuid for a in r.allocations.select_related("gpu")]
    services.reservation_finish(
        reservation=r,
        to=ReservationState.COMPLETED,
        ended_at=r.ends_at,
        used_gpu_seconds_by_gpu={uuids[0]: 3600, uuids[1]: 1800},
        actor_label="system:dispatch",
        reason="done",
    )
    assert project_balance(project_id=proj.pk) == Decimal("100") - Decimal("4.5")


def test_extend_when_the_same_gpus_are_free():
    h100 = gpu_model()
    server(h100, gpus=1)
    proj = project(grant="10")
    w = window(hours=1)
    r = book(proj, spec(h100), w)
    r = services.reservation_extend(reservation=r, ends_at=w.ends_at + timedelta(hours=2), actor=None)
    assert r.ends_at == w.ends_at + timedelta(hours=2)
    assert r.allocations.get().ends_at == r.ends_at
    assert project_balance(project_id=proj.pk) == Decimal("7")
    assert r.events.last().data["old_ends_at"] == w.ends_at.isoformat()


def test_extend_into_another_booking_is_refused():
    h100 = gpu_model()
    server(h100, gpus=1)
    proj = project()
    w = window(hours=1)
    r = book(proj, spec(h100), w)
    book(proj, spec(h100), Window(w.ends_at + timedelta(hours=1), w.ends_at + timedelta(hours=2)))
    with pytest.raises(Conflict) as exc:
        services.reservation_extend(reservation=r, ends_at=w.ends_at + timedelta(hours=3), actor=None)
    assert exc.value.code == "gpu_taken"
    r.refresh_from_db()
    assert r.ends_at == w.ends_at


def test_extend_beyond_the_credit_budget_is_refused():
    h100 = gpu_model()
    server(h100, gpus=1)
    proj = project(grant="2")
    w = window(hours=2)
    r = book(proj, spec(h100), w)
    with pytest.raises(QuotaExceeded):
        services.reservation_extend(reservation=r, ends_at=w.ends_at + timedelta(hours=1), actor=None)


def test_mark_is_a_conditional_update_with_an_event():
    h100 = gpu_model()
    server(h100)
    r = book(project(), spec(h100), window())
    assert services.reservation_mark(
        reservation=r,
        from_states=[ReservationState.SCHEDULED],
        to=ReservationState.STARTING,
        actor_label="system:dispatch",
        reason="launch",
    )
    assert not services.reservation_mark(
        reservation=r,
        from_states=[ReservationState.SCHEDULED],
        to=ReservationState.STARTING,
        actor_label="system:dispatch",
        reason="again",
    )
    assert r.events.filter(to_state=ReservationState.STARTING).count() == 1


def test_a_booking_starting_now_is_handed_to_dispatch_when_it_commits(django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    from unittest import mock

    model = gpu_model()
    server(model, gpus=2)
    proj = project()
    now = timezone.now()
    with mock.patch("controlplane.dispatch.tasks.open_reservation.apply_async") as enqueue:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            r = services.reservation_create(
                project=proj,
                name="now",
                spec=spec(model, count=1),
                window=Window(now, now + timedelta(hours=1)),
                container=CONTAINER,
                actor=None,
                now=now,
            )
    assert callbacks, "the booking registered no dispatch on commit"
    enqueue.assert_called_once()
    assert enqueue.call_args.kwargs["args"] == [r.pk]


def test_a_fresh_booking_reads_like_one_loaded_from_the_database():
    """reservation_create hands back its allocations and events prefetched; querying through them still works."""
    from django.utils import timezone as tz

    from controlplane.reservations.models import Allocation
    from controlplane.reservations.specs import Window
    from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec

    model = gpu_model()
    server(model, gpus=4)
    start = tz.now() + timedelta(hours=1)
    r = services.reservation_create(
        project=project(), name="r", spec=spec(model, count=2), container=CONTAINER, actor=None,
        window=Window(start, start + timedelta(hours=1)),
    )  # fmt: skip
    cached = sorted(a.gpu_id for a in r.allocations.all())
    assert cached == sorted(r.allocations.values_list("gpu_id", flat=True))
    assert cached == sorted(Allocation.objects.filter(reservation=r).values_list("gpu_id", flat=True))
    assert r.allocations.filter(active=True).count() == 2
    assert [e.to_state for e in r.events.all()] == [e.to_state for e in r.events.order_by("at", "id")]
