"""The notifications API: your own list only, preferences, and a project's webhooks for its owners."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.accounts.choices import Role
from controlplane.notifications import services
from controlplane.notifications.choices import Channel, DeliveryState, EventType
from controlplane.notifications.models import Event, Notification, WebhookDelivery
from tests.factories import ProjectFactory, UserFactory, member_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def trio() -> Any:
    proj = ProjectFactory(slug="atlas")
    owner = member_of(proj, Role.OWNER)
    teammate = member_of(proj, Role.MEMBER)
    outsider = member_of(ProjectFactory(slug="zephyr"), Role.OWNER)
    return proj, owner, teammate, outsider


def client(user: Any) -> APIClient:
    c = APIClient()
    c.force_authenticate(user)
    return c


def _notify(proj: Any, n: int = 2) -> None:
    for _ in range(n):
        e = Event.objects.create(type=EventType.BUDGET_THRESHOLD, project=proj, payload={"threshold_percent": 80})
        services.event_fan_out(event_id=e.pk)


def test_the_list_the_unread_count_and_mark_read_are_per_user(trio: Any) -> None:
    proj, owner, teammate, outsider = trio
    _notify(proj)
    listed = client(owner).get("/api/v1/notifications/").json()
    assert listed["count"] == 2 and all(n["unread"] for n in listed["results"])
    assert client(outsider).get("/api/v1/notifications/").json()["count"] == 0
    assert client(owner).get("/api/v1/notifications/unread-count/").json() == {"unread": 2}
    first = listed["results"][0]["id"]
    # The teammate cannot mark the owner's notification: it is ignored, as if it did not exist.
    assert client(teammate).post("/api/v1/notifications/mark-read/", {"ids": [first + 100]}).json()["marked"] == 0
    mine = Notification.objects.filter(user=owner).values_list("pk", flat=True)
    theirs = Notification.objects.filter(user=teammate).first()
    assert theirs is not None
    answer = client(owner).post("/api/v1/notifications/mark-read/", {"ids": [mine[0], theirs.pk]}).json()
    assert answer == {"marked": 1, "unread": 1}
    assert Notification.objects.get(pk=theirs.pk).read_at is None
    assert client(owner).get("/api/v1/notifications/?unread=true").json()["count"] == 1
    assert client(owner).post("/api/v1/notifications/mark-read/", {}).json() == {"marked": 1, "unread": 0}


def test_mark_read_with_bad_ids_is_a_400_naming_the_field(trio: Any) -> None:
    _, owner, _, _ = trio
    answer = client(owner).post("/api/v1/notifications/mark-read/", {"ids": ["x"]}, format="json")
    assert answer.status_code == 400 and any(k.startswith("ids") for k in answer.json()["error"]["fields"])


def test_preferences_read_defaults_and_are_set_all_or_nothing(trio: Any) -> None:
    _, owner, _, _ = trio
    prefs = client(owner).get("/api/v1/notifications/preferences/").json()["preferences"]
    by_type = {p["event_type"]: p for p in prefs}
    assert by_type[EventType.RUNNING]["channel"] == Channel.EMAIL
    assert EventType.SERVER_LOST not in by_type  # an operator's event
    answer = client(owner).put(
        "/api/v1/notifications/preferences/",
        {"preferences": [{"event_type": EventType.RUNNING, "channel": "webhook"}]},
        format="json",
    )
    assert answer.status_code == 200
    assert {p["event_type"]: p["channel"] for p in answer.json()["preferences"]}[EventType.RUNNING] == "webhook"
    bad = client(owner).put(
        "/api/v1/notifications/preferences/",
        {
            "preferences": [
                {"event_type": EventType.BOOKED, "channel": "email"},
                {"event_type": EventType.SERVER_LOST, "channel": "email"},
            ]
        },
        format="json",
    )
    assert bad.status_code == 403 and "preferences.fleet.server_lost" in bad.json()["error"]["fields"]
    assert services.preferences_of(owner)[0]["channel"] == Channel.NONE  # booked unchanged: nothing written
    assert (
        client(owner)
        .put(
            "/api/v1/notifications/preferences/",
            {"preferences": [{"event_type": "x", "channel": "email"}]},
            format="json",
        )
        .status_code
        == 400
    )


def test_webhooks_are_for_owners_teammates_get_403_outsiders_404(trio: Any, settings: Any) -> None:
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = True
    proj, owner, teammate, outsider = trio
    base = f"/api/v1/projects/{proj.pk}/webhooks/"
    body = {"url": "http://127.0.0.1:9/hook", "events": [EventType.FAILED]}
    created = client(owner).post(base, body, format="json")
    assert created.status_code == 201
    hook = created.json()
    assert hook["secret"].startswith("whsec_") and hook["enabled"]
    detail = f"{base}{hook['id']}/"
    for path, method in ((base, "get"), (detail, "get"), (detail + "deliveries/", "get"), (detail + "test/", "post")):
        assert getattr(client(teammate), method)(path).status_code == 403
        assert getattr(client(outsider), method)(path).status_code == 404
    assert client(teammate).post(base, body, format="json").status_code == 403
    assert client(outsider).post(base, body, format="json").status_code == 404
    assert client(owner).get(base).json()["count"] == 1
    test = client(owner).post(detail + "test/")
    assert test.status_code == 202 and test.json()["type"] == EventType.TEST
    log = client(owner).get(detail + "deliveries/").json()
    assert log["count"] == 1 and log["results"][0]["state"] == DeliveryState.PENDING
    assert client(owner).get(detail + "deliveries/?state=nope").json()["error"]["fields"] == {
        "state": ["Not one of pending, delivered, failed."]
    }
    rotated = client(owner).post(detail + "rotate-secret/", {"overlap_s": 60}, format="json").json()
    assert rotated["secret"] != hook["secret"] and rotated["previous_secret_expires_at"]
    off = client(owner).patch(detail, {"enabled": False}, format="json").json()
    assert not off["enabled"] and off["disabled_reason"]
    assert client(owner).post(detail + "test/").json()["error"]["code"] == "endpoint_disabled"
    assert client(owner).delete(detail).status_code == 204
    assert not WebhookDelivery.objects.exists()


def test_a_private_url_is_refused_naming_the_field(trio: Any, settings: Any) -> None:
    settings.NOTIFICATIONS_WEBHOOK_ALLOW_PRIVATE = False
    proj, owner, _, _ = trio
    base = f"/api/v1/projects/{proj.pk}/webhooks/"
    for url in ("http://127.0.0.1/hook", "http://169.254.169.254/", "ftp://x/", "nonsense"):
        answer = client(owner).post(base, {"url": url, "events": [EventType.FAILED]}, format="json")
        assert answer.status_code == 400 and "url" in answer.json()["error"]["fields"], url
    answer = client(owner).post(base, {"url": "http://127.0.0.1/", "events": ["fleet.server_lost"]}, format="json")
    assert answer.status_code == 400 and "events.0" in answer.json()["error"]["fields"]


def test_the_outbox_shows_your_own_emails_or_all_to_an_operator(trio: Any) -> None:
    from tests.factories import OperatorFactory

    proj, owner, teammate, _ = trio
    owner.email, teammate.email = "o@example.org", "t@example.org"
    owner.save()
    teammate.save()
    e = Event.objects.create(type=EventType.FAILED, project=proj, payload={"reason": "x"})
    services.event_fan_out(event_id=e.pk)
    assert [m["to_address"] for m in client(owner).get("/api/v1/notifications/outbox/").json()["results"]] == [
        "o@example.org"
    ]
    assert client(OperatorFactory()).get("/api/v1/notifications/outbox/").json()["count"] == 2
    assert client(UserFactory()).get("/api/v1/notifications/outbox/").json()["count"] == 0


def test_the_list_reads_a_fixed_number_of_queries(trio: Any, django_assert_max_num_queries: Any) -> None:
    proj, owner, _, _ = trio
    _notify(proj, 1)
    with django_assert_max_num_queries(6) as one:
        client(owner).get("/api/v1/notifications/")
    _notify(proj, 6)
    with django_assert_max_num_queries(len(one.captured_queries)):
        client(owner).get("/api/v1/notifications/")
