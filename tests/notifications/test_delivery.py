"""Webhook deliveries against a real HTTP receiver that verifies each signature as a receiver would."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from controlplane.core.errors import ValidationFailed
from controlplane.notifications import delivery, services
from controlplane.notifications.choices import DeliveryState, EventType
from controlplane.notifications.models import EmailMessage, Event, WebhookDelivery, WebhookEndpoint
from controlplane.reservations import services as reservations
from tests.factories import UserFactory
from tests.notifications.support import Receiver
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window

pytestmark = pytest.mark.django_db

EVENTS = [EventType.BOOKED, EventType.EXTENDED, EventType.FAILED]


class Clock:
    def __init__(self) -> None:
        self.now = timezone.now()

    def __call__(self) -> Any:
        return self.now


@pytest.fixture
def world(receiver: Receiver) -> Any:
    owner = UserFactory(email="owner@example.org")
    proj = project(owner=owner)
    model = gpu_model()
    server(model, gpus=4)
    endpoint = services.endpoint_create(project=proj, url=receiver.url, events=EVENTS, description="", actor=owner)
    receiver.secrets = [endpoint.secret]
    return proj, owner, model, endpoint


def _book(proj: Any, owner: Any, model: Any, name: str) -> Any:
    return reservations.reservation_create(
        project=proj, name=name, spec=spec(model), window=window(), container=CONTAINER, actor=owner
    )


def _fan_out() -> None:
    for pk in Event.objects.filter(fanned_out_at__isnull=True).order_by("id").values_list("pk", flat=True):
        services.event_fan_out(event_id=pk)


def test_deliveries_are_signed_per_standard_webhooks_and_in_event_order(world: Any, receiver: Receiver) -> None:
    proj, owner, model, endpoint = world
    booked = [_book(proj, owner, model, f"job-{i}") for i in range(3)]
    reservations.reservation_extend(reservation=booked[0], ends_at=booked[0].ends_at + timedelta(hours=1), actor=owner)
    _fan_out()
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk) == 4
    assert len(receiver.verified()) == 4
    bodies = [r.payload for r in receiver.received]
    assert [b["type"] for b in bodies] == [EventType.BOOKED] * 3 + [EventType.EXTENDED]
    assert [b["data"]["reservation"]["name"] for b in bodies] == ["job-0", "job-1", "job-2", "job-0"]
    first = receiver.received[0]
    event = Event.objects.get(public_id=bodies[0]["data"]["event_id"])
    assert first.msg_id == f"msg_{event.public_id.hex}"
    assert first.signature.startswith("v1,") and " " not in first.signature
    assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {DeliveryState.DELIVERED}


def test_failed_attempts_are_retried_with_backoff_and_later_events_wait(
    world: Any, receiver: Receiver, settings: Any
) -> None:
    settings.NOTIFICATIONS_WEBHOOK_RETRY_S = [10, 20, 40]
    proj, owner, model, endpoint = world
    receiver.fail_first = 2
    for i in range(2):
        _book(proj, owner, model, f"job-{i}")
    _fan_out()
    clock = Clock()
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk, clock=clock) == 1  # fails, stops: job-1 waits
    first = WebhookDelivery.objects.order_by("event_id").first()
    assert first is not None
    assert (first.attempts, first.last_status_code, first.state) == (1, 500, DeliveryState.PENDING)
    assert first.next_attempt_at == clock.now + timedelta(seconds=10)
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk, clock=clock) == 0  # not due yet
    clock.now += timedelta(seconds=10)
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk, clock=clock) == 1  # fails again: 20 s now
    first.refresh_from_db()
    assert first.next_attempt_at == clock.now + timedelta(seconds=20)
    clock.now += timedelta(seconds=20)
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk, clock=clock) == 2
    names = [r.payload["data"]["reservation"]["name"] for r in receiver.received]
    # The same message (one webhook-id) three times, then the next event: order is kept across retries.
    assert names == ["job-0", "job-0", "job-0", "job-1"]
    assert len({r.msg_id for r in receiver.received[:3]}) == 1
    first.refresh_from_db()
    assert [h["status_code"] for h in first.history] == [500, 500, 200]
    assert first.state == DeliveryState.DELIVERED and first.last_response == "ok"


def test_the_endpoint_is_disabled_and_its_owners_emailed_after_the_retry_window(
    world: Any, receiver: Receiver, settings: Any
) -> None:
    settings.NOTIFICATIONS_WEBHOOK_RETRY_S = [1, 2]
    proj, owner, model, endpoint = world
    receiver.fail_first = 100
    _book(proj, owner, model, "job")
    _fan_out()
    clock = Clock()
    for step in (0, 1, 2):
        clock.now += timedelta(seconds=step)
        assert delivery.deliver_endpoint(endpoint_id=endpoint.pk, clock=clock) == 1
    d = WebhookDelivery.objects.get()
    assert (d.state, d.attempts) == (DeliveryState.FAILED, 3)
    endpoint.refresh_from_db()
    assert not endpoint.enabled and "3 attempts" in endpoint.disabled_reason
    (mail,) = EmailMessage.objects.filter(subject__startswith="Webhook disabled")
    assert mail.to_address == "owner@example.org" and receiver.url in mail.body_text
    # Disabled: nothing more is sent, and a new event is not queued for it.
    clock.now += timedelta(hours=1)
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk, clock=clock) == 0
    _book(proj, owner, model, "job-2")
    _fan_out()
    assert WebhookDelivery.objects.count() == 1
    # An owner enables it again: what was pending is due again.
    services.endpoint_update(endpoint=endpoint, enabled=True)
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).disabled_reason == ""


def test_rotation_signs_with_both_secrets_for_the_overlap_then_only_the_new(world: Any, receiver: Receiver) -> None:
    _proj, owner, _model, endpoint = world
    old = endpoint.secret
    rotated = services.endpoint_rotate_secret(endpoint=endpoint, overlap_s=3600)
    assert rotated.secret != old and rotated.previous_secret == old
    receiver.secrets = [old]  # a receiver not yet updated still verifies
    services.endpoint_send_test(endpoint=rotated, actor=owner)
    clock = Clock()
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk, clock=clock) == 1
    assert len(receiver.received[-1].signature.split(" ")) == 2 and receiver.received[-1].verified_with == [old]
    receiver.secrets = [rotated.secret]
    services.endpoint_send_test(endpoint=rotated, actor=owner)
    # The overlap has passed (the receiver checks timestamps against its own clock, so the clock stays).
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(previous_secret_expires_at=timezone.now())
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk) == 1
    last = receiver.received[-1]
    assert " " not in last.signature and last.verified_with == [rotated.secret]
    assert last.payload["type"] == EventType.TEST


def test_a_second_worker_finds_the_lease_taken(world: Any, receiver: Receiver) -> None:
    proj, owner, model, endpoint = world
    _book(proj, owner, model, "job")
    _fan_out()
    until = timezone.now() + timedelta(seconds=60)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(lease_until=until)
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk) == 0
    assert receiver.received == []


def test_only_the_events_an_endpoint_chose_are_delivered(world: Any, receiver: Receiver) -> None:
    proj, owner, model, endpoint = world
    services.endpoint_update(endpoint=endpoint, events=[EventType.FAILED])
    _book(proj, owner, model, "job")
    _fan_out()
    assert not WebhookDelivery.objects.exists()


def test_ssrf_refused_at_save_and_again_at_delivery(world: Any, receiver: Receiver, settings: Any) -> None:
    proj, owner, model, endpoint = world
    _book(proj, owner, model, "job")
    _fan_out()
    # The operator withdraws the allowance (or the name now resolves inside): the delivery refuses to connect.
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = False
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk) == 1
    d = WebhookDelivery.objects.get()
    assert d.last_status_code is None and d.last_error.startswith("refused: ")
    assert receiver.received == []
    with pytest.raises(ValidationFailed) as refused:
        services.endpoint_create(project=proj, url=receiver.url, events=EVENTS, description="", actor=owner)
    assert "url" in refused.value.fields


def test_a_receiver_that_is_down_is_an_attempt_with_an_error(world: Any, receiver: Receiver) -> None:
    proj, owner, model, endpoint = world
    receiver.stop()
    _book(proj, owner, model, "job")
    _fan_out()
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk) == 1
    d = WebhookDelivery.objects.get()
    assert d.state == DeliveryState.PENDING and d.last_status_code is None and d.last_error


def test_the_reconciler_fans_out_and_sends_what_a_lost_task_left(world: Any, receiver: Receiver) -> None:
    from controlplane.notifications.tasks import reconcile

    proj, owner, model, _endpoint = world
    _book(proj, owner, model, "job")
    Event.objects.update(occurred_at=timezone.now() - timedelta(minutes=1))
    assert reconcile()
    assert len(receiver.verified()) == 1
    assert not reconcile()


# -- Batches ----------------------------------------------------------------------------------------------------
def _queue(proj: Any, owner: Any, model: Any, n: int) -> list[str]:
    server(model, gpus=8)  # room for a longer queue than the world's four GPUs hold
    names = [f"job-{i}" for i in range(n)]
    for name in names:
        _book(proj, owner, model, name)
    _fan_out()
    return names


def _names(receiver: Receiver) -> list[str]:
    return [r.payload["data"]["reservation"]["name"] for r in receiver.received]


def test_a_queue_longer_than_a_batch_goes_out_in_event_order_and_is_recorded_per_delivery(
    world: Any, receiver: Receiver, monkeypatch: Any
) -> None:
    monkeypatch.setattr(delivery, "BATCH", 2)
    proj, owner, model, endpoint = world
    names = _queue(proj, owner, model, 5)
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk) == 5
    assert _names(receiver) == names
    rows = list(WebhookDelivery.objects.order_by("event_id"))
    assert [(d.state, d.attempts, d.last_status_code) for d in rows] == [(DeliveryState.DELIVERED, 1, 200)] * 5
    assert all(d.delivered_at and len(d.history) == 1 and d.history[0]["status_code"] == 200 for d in rows)
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).lease_until is None


def test_a_batch_costs_a_fixed_number_of_statements(
    world: Any, receiver: Receiver, django_assert_max_num_queries: Any
) -> None:
    proj, owner, model, endpoint = world
    _queue(proj, owner, model, 8)
    # Claim, read the batch, read the next (empty) one, release; the outcomes: one pipelined executemany.
    with django_assert_max_num_queries(6):
        assert delivery.deliver_endpoint(endpoint_id=endpoint.pk) == 8
    assert len(receiver.verified()) == 8


def test_a_failure_in_the_middle_of_a_batch_holds_back_the_rest_then_a_retry_resumes_in_order(
    world: Any, receiver: Receiver, settings: Any
) -> None:
    settings.NOTIFICATIONS_WEBHOOK_RETRY_S = [10, 20]
    proj, owner, model, endpoint = world
    names = _queue(proj, owner, model, 5)
    receiver.fail_numbers = {3}
    clock = Clock()
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk, clock=clock) == 3  # two delivered, the third failed
    assert _names(receiver) == names[:3]
    rows = list(WebhookDelivery.objects.order_by("event_id"))
    assert [d.state for d in rows] == [DeliveryState.DELIVERED] * 2 + [DeliveryState.PENDING] * 3
    assert (rows[2].attempts, rows[2].last_status_code) == (1, 500)
    assert rows[2].next_attempt_at == clock.now + timedelta(seconds=10)
    assert [d.attempts for d in rows[3:]] == [0, 0]  # held back, never tried
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk, clock=clock) == 0  # the failed one is not due yet
    clock.now += timedelta(seconds=10)
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk, clock=clock) == 3
    assert _names(receiver) == [*names[:3], *names[2:]]  # the retry first, then the ones it held back
    assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {DeliveryState.DELIVERED}
    third = WebhookDelivery.objects.order_by("event_id")[2]
    assert [h["status_code"] for h in third.history] == [500, 200]


def test_the_last_attempt_failing_mid_batch_disables_the_endpoint_and_keeps_the_rest_pending(
    world: Any, receiver: Receiver, settings: Any
) -> None:
    settings.NOTIFICATIONS_WEBHOOK_RETRY_S = []
    proj, owner, model, endpoint = world
    _queue(proj, owner, model, 3)
    receiver.fail_numbers = {2}
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk) == 2
    rows = list(WebhookDelivery.objects.order_by("event_id"))
    assert [d.state for d in rows] == [DeliveryState.DELIVERED, DeliveryState.FAILED, DeliveryState.PENDING]
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.lease_until is None
    assert EmailMessage.objects.filter(subject__startswith="Webhook disabled").count() == 1


def test_many_events_fan_out_in_one_transaction_with_a_fixed_number_of_statements(
    world: Any, receiver: Receiver, django_assert_max_num_queries: Any
) -> None:
    proj, owner, model, endpoint = world
    server(model, gpus=8)
    second = services.endpoint_create(project=proj, url=receiver.url, events=EVENTS, description="", actor=owner)
    for i in range(6):
        _book(proj, owner, model, f"job-{i}")
    ids = list(Event.objects.filter(fanned_out_at__isnull=True).values_list("pk", flat=True))
    with django_assert_max_num_queries(12):
        assert services.events_fan_out(event_ids=ids) == len(ids)
    assert WebhookDelivery.objects.filter(endpoint=endpoint).count() == 6
    assert WebhookDelivery.objects.filter(endpoint=second).count() == 6
    assert not Event.objects.filter(fanned_out_at__isnull=True).exists()
    assert services.events_fan_out(event_ids=ids) == 0  # once
    assert Event.objects.filter(pk__in=ids).exclude(payload__event_id=None).count() == len(ids)


def test_nothing_past_an_event_still_waiting_for_its_fan_out_is_sent(world: Any, receiver: Receiver) -> None:
    # Two fan-out workers may commit out of order: event B's deliveries exist while A, earlier, waits. B must
    # not overtake A at the endpoint.
    proj, owner, model, endpoint = world
    server(model, gpus=8)
    _book(proj, owner, model, "first")
    _book(proj, owner, model, "second")
    first, second = Event.objects.filter(type=EventType.BOOKED).order_by("id")[:2]
    services.event_fan_out(event_id=second.pk)
    assert WebhookDelivery.objects.filter(event=second).exists()
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk) == 0  # held back behind the first
    services.event_fan_out(event_id=first.pk)
    _fan_out()
    assert delivery.deliver_endpoint(endpoint_id=endpoint.pk) >= 2
    assert _names(receiver)[:2] == ["first", "second"]
