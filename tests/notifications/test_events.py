"""Real state changes become events, and their fan-out writes each person's notifications and emails."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from controlplane.inventory.models import Gpu
from controlplane.notifications import events, services
from controlplane.notifications.choices import Channel, EventType
from controlplane.notifications.models import EmailMessage, Event, Notification
from controlplane.reservations import services as reservations
from controlplane.reservations.choices import ReservationState
from tests.factories import OperatorFactory, UserFactory
from tests.fleet.helpers import T0, enroll, gpu_uuid, heartbeat, ingest
from tests.reservations.fleet import CONTAINER, gpu_model, hold, project, server, spec, window

pytestmark = pytest.mark.django_db


def _types(**filters: Any) -> list[str]:
    return list(Event.objects.filter(**filters).order_by("id").values_list("type", flat=True))


def _fan_out_all() -> None:
    for pk in Event.objects.filter(fanned_out_at__isnull=True).order_by("id").values_list("pk", flat=True):
        assert services.event_fan_out(event_id=pk)


@pytest.fixture
def booked() -> Any:
    owner, member = UserFactory(email="owner@example.org"), UserFactory(email="member@example.org")
    proj = project(owner=owner, member=member)
    model = gpu_model()
    server(model, gpus=2)
    r = reservations.reservation_create(
        project=proj, name="train", spec=spec(model), window=window(), container=CONTAINER, actor=owner
    )
    return r, owner, member


def test_a_booking_is_one_booked_event_listed_for_every_member(booked: Any) -> None:
    r, owner, member = booked
    assert _types(reservation=r) == [EventType.BOOKED]
    _fan_out_all()
    for user in (owner, member):
        (n,) = Notification.objects.filter(user=user)
        assert n.title == "Booked: train" and n.read_at is None
        assert n.event.payload["reservation"]["id"] == str(r.public_id)
        assert n.event.payload["link"].endswith(f"/reservations/{r.public_id}")
    # Booked is not emailed by default.
    assert not EmailMessage.objects.exists()


def test_fan_out_happens_once(booked: Any) -> None:
    event = Event.objects.get()
    assert services.event_fan_out(event_id=event.pk)
    assert not services.event_fan_out(event_id=event.pk)
    assert Notification.objects.count() == 2


def test_preferences_choose_email_or_nothing_per_person(booked: Any) -> None:
    r, owner, member = booked
    services.preferences_set(user=owner, changes={EventType.BOOKED: Channel.EMAIL})
    services.preferences_set(user=member, changes={EventType.RUNNING: Channel.NONE})
    _fan_out_all()
    assert list(EmailMessage.objects.values_list("to_address", flat=True)) == ["owner@example.org"]
    reservations.reservation_mark(
        reservation=r, from_states=[r.state], to=ReservationState.STARTING, actor_label="system:test", reason="go"
    )
    reservations.reservation_mark(
        reservation=r,
        from_states=[ReservationState.STARTING],
        to=ReservationState.RUNNING,
        actor_label="system:test",
        reason="the agent reports it running",
    )
    _fan_out_all()
    running = EmailMessage.objects.filter(subject="Running: train")
    # Running is emailed by default; the member turned it off.
    assert list(running.values_list("to_address", flat=True)) == ["owner@example.org"]
    assert Notification.objects.filter(user=member, event__type=EventType.RUNNING).exists()


def test_running_carries_the_connect_information(booked: Any) -> None:
    r, owner, _ = booked
    for to in (ReservationState.STARTING, ReservationState.RUNNING):
        reservations.reservation_mark(
            reservation=r, from_states=[r.state], to=to, actor_label="system:test", reason="x"
        )
    _fan_out_all()
    event = Event.objects.get(type=EventType.RUNNING)
    assert set(event.payload["connect"]) >= {"ready", "message", "ssh"}
    assert "running" in Notification.objects.get(user=owner, event=event).body


def test_extension_failure_and_requeue_note_are_their_events(booked: Any) -> None:
    r, owner, _ = booked
    reservations.reservation_extend(reservation=r, ends_at=r.ends_at + timedelta(hours=1), actor=owner)
    r.refresh_from_db()
    reservations.reservation_mark(
        reservation=r,
        from_states=[r.state],
        to=r.state,
        actor_label="system:dispatch",
        reason="requeued as x",
        data={"follow_up": "00000000-0000-0000-0000-000000000001"},
    )
    reservations.reservation_finish(
        reservation=r,
        to=ReservationState.FAILED,
        ended_at=timezone.now(),
        actor_label="system:test",
        reason="pull failed",
    )
    assert _types(reservation=r) == [EventType.BOOKED, EventType.EXTENDED, EventType.REQUEUED, EventType.FAILED]
    _fan_out_all()
    failed = Notification.objects.get(user=owner, event__type=EventType.FAILED)
    assert failed.body == "train failed: pull failed"


def test_a_rolled_back_change_announces_nothing(booked: Any) -> None:
    r, owner, _ = booked
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        reservations.reservation_extend(reservation=r, ends_at=r.ends_at + timedelta(hours=1), actor=owner)
        raise RuntimeError("the caller failed after the change")
    assert _types(reservation=r) == [EventType.BOOKED]


def test_gpu_fault_on_a_held_gpu_notifies_that_reservations_project(db: Any) -> None:
    owner = UserFactory()
    proj, other = project(owner=owner), project(owner=UserFactory())
    srv, _ = enroll("node-f")
    ingest(srv, heartbeat("node-f", seq=1), now=T0)
    held = Gpu.objects.get(uuid=gpu_uuid("node-f", 0))
    hold(held, T0 - timedelta(hours=1), T0 + timedelta(hours=1), proj=proj)
    hold(Gpu.objects.get(uuid=gpu_uuid("node-f", 1)), T0 + timedelta(hours=2), T0 + timedelta(hours=3), proj=other)
    xid = {"kind": "xid", "ts": T0.isoformat(), "uuid": held.uuid, "xid": 79}
    xid1 = {**xid, "uuid": gpu_uuid("node-f", 1)}
    ingest(
        srv,
        heartbeat("node-f", seq=2, events=[xid, xid1], start=T0 + timedelta(seconds=5)),
        now=T0 + timedelta(seconds=5),
    )
    (fault,) = Event.objects.filter(type=EventType.GPU_FAULT)
    # The other GPU's reservation has not started: its fault is nobody's reservation's yet.
    assert fault.project == proj and fault.payload["gpu"] == held.uuid
    _fan_out_all()
    assert Notification.objects.get(user=owner, event=fault).title.startswith("GPU fault")


def test_join_token_use_and_server_loss_notify_operators_only(db: Any) -> None:
    from tests.fleet.node_loss_support import steady_pass

    operator, tenant = OperatorFactory(email="op@example.org"), UserFactory()
    project(owner=tenant)
    srv, _ = enroll("node-l", operator=operator)
    ingest(srv, heartbeat("node-l", seq=1), now=T0)
    assert steady_pass(T0 + timedelta(seconds=16)) == 1
    assert _types() == [EventType.JOIN_TOKEN_USED, EventType.SERVER_LOST]
    _fan_out_all()
    assert list(Notification.objects.filter(user=operator).values_list("event__type", flat=True).order_by("id")) == [
        EventType.JOIN_TOKEN_USED,
        EventType.SERVER_LOST,
    ]
    assert not Notification.objects.filter(user=tenant).exists()
    # Server lost is emailed to operators by default; a join token's use is not.
    assert list(EmailMessage.objects.values_list("subject", flat=True)) == ["Server lost: node-l"]


def test_ends_soon_is_raised_once_per_lead_and_rearmed_by_an_extension(settings: Any) -> None:
    settings.NOTIFICATIONS_ENDS_IN_S = [3600, 600]
    now = timezone.now()
    owner = UserFactory()
    proj = project(owner=owner)
    a = hold(
        Gpu.objects.create(
            server=server(gpu_model(), gpus=0), uuid="GPU-x", index=0, model=gpu_model(), product_name="x", memory_mib=1
        ),
        now - timedelta(hours=2),
        now + timedelta(minutes=50),
        proj=proj,
    )
    r = a.reservation
    r.state = ReservationState.RUNNING
    r.save()
    assert services.ends_soon_check(now) == 1
    assert services.ends_soon_check(now) == 0  # idempotent
    assert services.ends_soon_check(now + timedelta(minutes=30)) == 0  # still within the same lead
    assert services.ends_soon_check(now + timedelta(minutes=41)) == 1  # the 10-minute lead
    leads = list(Event.objects.filter(type=EventType.ENDS_SOON).values_list("payload__lead_s", flat=True))
    assert leads == [3600, 600]
    r.ends_at += timedelta(hours=1)
    r.save()
    assert services.ends_soon_check(now + timedelta(minutes=55)) == 1  # a new end: the 1-hour lead again


def test_ends_soon_skips_a_lead_longer_than_the_window_and_a_stale_lead(settings: Any) -> None:
    settings.NOTIFICATIONS_ENDS_IN_S = [3600, 600]
    now = timezone.now()
    proj = project(owner=UserFactory())
    model = gpu_model()
    gpu = Gpu.objects.create(
        server=server(model, gpus=0), uuid="GPU-y", index=0, model=model, product_name="y", memory_mib=1
    )
    short = hold(gpu, now - timedelta(minutes=25), now + timedelta(minutes=5), proj=proj).reservation
    Event.objects.all().delete()
    short.state = ReservationState.RUNNING
    short.save()
    assert services.ends_soon_check(now) == 1
    assert list(Event.objects.values_list("payload__lead_s", flat=True)) == [600]


def test_emit_functions_for_features_to_come_write_their_events_once(booked: Any) -> None:
    r, owner, _ = booked
    events.emit_preempted(reservation=r, by="request 12", notice_s=300, reason="a higher class needs the GPUs")
    assert events.emit_budget_threshold(
        project=r.project, period="2026-12", threshold_percent=80, used="80", budget="100"
    )
    assert (
        events.emit_budget_threshold(project=r.project, period="2026-12", threshold_percent=80, used="81", budget="100")
        is None
    )
    at = timezone.now()
    assert events.emit_idle_warning(reservation=r, idle_minutes=30, threshold_percent=5, at=at)
    assert events.emit_idle_warning(reservation=r, idle_minutes=31, threshold_percent=5, at=at) is None
    _fan_out_all()
    titles = set(Notification.objects.filter(user=owner).values_list("title", flat=True))
    assert {"Preempted: train", "Idle GPUs: train", f"Budget 80 % used: {r.project.slug}"} <= titles


def test_a_window_cut_short_by_a_winner_is_a_preempted_event(booked: Any) -> None:
    r, owner, _ = booked
    winner = reservations.reservation_create(
        project=r.project, name="winner", spec=spec(r.gpu_model), window=window(), container=CONTAINER, actor=owner
    )
    reservations.reservation_yield(
        reservation=r,
        end_at=r.starts_at + timedelta(minutes=30),
        notice_seconds=120,
        reason="preempted by a booking",
        by=winner,
        actor=None,
    )
    event = Event.objects.get(type=EventType.PREEMPTED)
    assert event.reservation_id == r.pk
    assert event.payload == {
        "by": f"reservation {winner.public_id}",
        "notice_s": 120.0,
        "reason": "preempted by a booking",
    }


def test_a_cut_without_a_winner_is_not_a_preemption(booked: Any) -> None:
    r, _, _ = booked
    reservations.reservation_yield(
        reservation=r,
        end_at=r.starts_at + timedelta(minutes=30),
        notice_seconds=0,
        reason="operator",
        by=None,
        actor=None,
    )
    assert not Event.objects.filter(type=EventType.PREEMPTED).exists()


def test_a_budget_threshold_crossed_is_one_event(django_capture_on_commit_callbacks: Any) -> None:
    from decimal import Decimal

    from controlplane.ledger.services import quota_policy_set

    owner = UserFactory()
    proj = project(owner=owner, grant="1000")
    model = gpu_model()
    server(model, gpus=2)
    quota_policy_set(
        project=proj,
        actor=None,
        budget_credits=Decimal("1"),
        budget_action="warn",
        fields={"budget_credits", "budget_action"},
    )
    with django_capture_on_commit_callbacks(execute=True):
        reservations.reservation_create(
            project=proj, name="big", spec=spec(model), window=window(hours=4), container=CONTAINER, actor=owner
        )
    thresholds = sorted(e.payload["threshold_percent"] for e in Event.objects.filter(type=EventType.BUDGET_THRESHOLD))
    assert thresholds == [80, 95, 100]
