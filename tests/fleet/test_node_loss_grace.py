"""Node loss told apart from our own fault (controlplane/fleet/nodeloss.py, docs/fleet.md "Outages and node
loss"): a grace after the detector or the database was away, the disruption hold, one notification per incident,
one digest per pass, and the server-back notification; and the races: a heartbeat at the detector's critical
step, two detectors at once."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from controlplane.fleet import desired, nodeloss
from controlplane.fleet.models import NodeLossDisruption, NodeLossWatch
from controlplane.fleet.nodeloss import detect_lost_servers
from controlplane.inventory.choices import EventKind, ServerState
from controlplane.inventory.models import Server, ServerEvent
from controlplane.notifications import services as notifications
from controlplane.notifications.choices import EventType
from controlplane.notifications.models import EmailMessage, Event
from tests.factories import OperatorFactory
from tests.fleet.helpers import T0, enroll, heartbeat, ingest
from tests.fleet.node_loss_support import passes, steady_pass

pytestmark = pytest.mark.django_db

# The defaults: 5 s heartbeats and beat, offline after 15 s, requeue after 50 s, a 60 s grace, a disruption
# above 55 % of the live servers and at least 2 of them.
DEFAULTS = {
    "FLEET_HEARTBEAT_INTERVAL_S": 5.0,
    "FLEET_OFFLINE_AFTER_INTERVALS": 3,
    "FLEET_FENCE_AFTER_INTERVALS": 2,
    "DISPATCH_STOP_GRACE_S": 30,
    "FLEET_REQUEUE_MARGIN_S": 10.0,
    "FLEET_STARTUP_GRACE_S": 60.0,
    "FLEET_DISRUPTION_SHARE": 0.55,
    "FLEET_DISRUPTION_MIN_SERVERS": 2,
}


def fleet(*hostnames: str, at: datetime = T0) -> list[Server]:
    servers = [enroll(h)[0] for h in hostnames]
    for s in servers:
        beat(s, at)
    return servers


_seq: dict[int, int] = {}


def beat(server: Server, at: datetime) -> None:
    _seq[server.pk] = _seq.get(server.pk, 0) + 1
    ingest(server, heartbeat(server.hostname, seq=_seq[server.pk], start=at), now=at)


def states(*servers: Server) -> list[str]:
    return [Server.objects.get(pk=s.pk).state for s in servers]


def types() -> list[str]:
    return list(Event.objects.order_by("id").values_list("type", flat=True))


def metrics() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = APIClient().get("/metrics").content.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def no_release(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    """Dispatch's answer replaced by a record of what node loss asked: (hostname, seconds of silence)."""
    asked: list[tuple[str, float]] = []
    monkeypatch.setattr(desired, "server_lost", lambda s, now, silent_s: asked.append((s.hostname, silent_s)) or 1)
    return asked


# -- grace ---------------------------------------------------------------------------------------------------


@override_settings(**DEFAULTS)
def test_no_server_is_lost_during_the_grace_after_the_detectors_first_pass(no_release: list[Any]) -> None:
    [a] = fleet("node-a", at=T0 - timedelta(seconds=100))  # silent long before the detector ever ran
    assert detect_lost_servers(T0) == 0
    watch = NodeLossWatch.objects.get()
    assert watch.grace_until == T0 + timedelta(seconds=60) and "first pass" in watch.grace_reason
    assert passes(T0 + timedelta(seconds=5), T0 + timedelta(seconds=55)) == 0
    assert states(a) == [ServerState.COMMISSIONING]
    assert detect_lost_servers(T0 + timedelta(seconds=60)) == 1  # the grace is over; silent 60 s since it began
    offline = ServerEvent.objects.get(kind=EventKind.STATE, to_state=ServerState.OFFLINE)
    assert "since the detector's grace began" in offline.reason
    # Its silence counts from the grace's start (60 s), not from its last heartbeat (160 s).
    assert no_release == [("node-a", 60.0)]


@override_settings(**DEFAULTS)
def test_the_silence_of_our_own_absence_does_not_count_after_the_database_returns(no_release: list[Any]) -> None:
    a, b = fleet("node-a", "node-b")
    assert steady_pass(T0) == 0
    for t in range(5, 25, 5):  # a steady detector and two heartbeating servers
        at = T0 + timedelta(seconds=t)
        beat(a, at)
        beat(b, at)
        assert detect_lost_servers(at) == 0
    # The database is away from 20 s to 120 s: no heartbeat is recorded and no pass completes. node-b truly
    # died at 20 s; node-a's agent retries and is heard again 3 s after the database returns.
    back = T0 + timedelta(seconds=120)
    assert detect_lost_servers(back) == 0
    assert NodeLossWatch.objects.get().grace_reason.startswith("no pass for 100 s")
    for t in range(5, 60, 5):
        beat(a, back + timedelta(seconds=t - 2))  # heard again 3 s after the return, every 5 s since
        assert detect_lost_servers(back + timedelta(seconds=t)) == 0
    assert states(a, b) == [ServerState.COMMISSIONING, ServerState.COMMISSIONING]  # neither lost in the grace
    assert detect_lost_servers(back + timedelta(seconds=60)) == 1
    assert states(a, b) == [ServerState.COMMISSIONING, ServerState.OFFLINE]
    # node-b's requeue waits out the lease, grace and margin counted from the database's return, not from 20 s.
    assert no_release == [("node-b", 60.0)]


@override_settings(**DEFAULTS)
def test_a_pass_one_beat_late_opens_no_grace(no_release: list[Any]) -> None:
    fleet("node-a")
    assert steady_pass(T0) == 0
    assert detect_lost_servers(T0 + timedelta(seconds=10)) == 0  # two beat periods: late, not away
    assert not NodeLossWatch.objects.get().in_grace(T0 + timedelta(seconds=10))
    assert detect_lost_servers(T0 + timedelta(seconds=16)) == 1


# -- disruption ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("silent", "held"), [(3, True), (2, True), (1, False)])
@override_settings(**DEFAULTS)
def test_node_loss_is_held_when_most_servers_go_silent_together(silent: int, held: bool, no_release: list[Any]) -> None:
    servers = fleet("node-a", "node-b", "node-c")
    assert steady_pass(T0) == 0
    quiet, heard = servers[:silent], servers[silent:]
    for t in range(5, 125, 5):
        at = T0 + timedelta(seconds=t)
        for s in heard:
            beat(s, at)
        detect_lost_servers(at)
    if held:
        assert states(*quiet) == [ServerState.COMMISSIONING] * silent  # nothing offline
        assert no_release == []  # nothing interrupted, nothing requeued
        [incident] = NodeLossDisruption.objects.all()
        assert (incident.silent_servers, incident.live_servers, incident.ended_at) == (silent, 3, None)
        assert incident.hostnames == sorted(s.hostname for s in quiet)
        assert types().count(EventType.DISRUPTION) == 1  # one notification, however many passes held
        assert EventType.SERVER_LOST not in types()
    else:
        assert states(*quiet) == [ServerState.OFFLINE]
        assert not NodeLossDisruption.objects.exists()
        assert types().count(EventType.SERVER_LOST) == 1


@pytest.mark.django_db(transaction=True)  # /readyz reads in a thread of its own, on its own connection
@override_settings(**DEFAULTS)
def test_readyz_and_metrics_name_the_hold_and_the_end_of_a_disruption_is_told_once(no_release: list[Any]) -> None:
    operator = OperatorFactory(email="op@example.org")
    T = timezone.now() - timedelta(seconds=100)  # the grace below is still open by the wall clock /readyz reads
    a, b, c = fleet("node-a", "node-b", "node-c", at=T)
    assert steady_pass(T) == 0
    body = APIClient().get("/readyz").json()
    assert body["node_loss"]["held"] is False and body["node_loss"]["live_servers"] == 3
    assert passes(T + timedelta(seconds=5), T + timedelta(seconds=20)) == 0

    response = APIClient().get("/readyz")
    assert response.status_code == 200  # held is the system protecting itself: still ready
    hold = response.json()["node_loss"]
    assert (hold["held"], hold["reason"], hold["silent_servers"], hold["live_servers"]) == (True, "disruption", 3, 3)
    found = metrics()
    assert found[("gpucp_node_loss_held", (("reason", "disruption"),))] == 1.0
    assert found[("gpucp_node_loss_held", (("reason", "grace"),))] == 0.0
    assert found[("gpucp_servers_silent", ())] == 3.0
    assert found[("gpucp_servers_live", ())] == 3.0

    assert passes(T + timedelta(seconds=25), T + timedelta(seconds=95)) == 0  # held all along
    assert states(a, b, c) == [ServerState.COMMISSIONING] * 3

    # Two come back: the hold ends (one notification), and the straggler gets the grace before it is lost.
    back = T + timedelta(seconds=100)
    beat(a, back)
    beat(b, back)
    assert detect_lost_servers(back) == 0
    incident = NodeLossDisruption.objects.get()
    assert incident.ended_at == back and incident.most_silent == 3
    hold = APIClient().get("/readyz").json()["node_loss"]
    assert (hold["held"], hold["reason"]) == (True, "grace")
    assert metrics()[("gpucp_node_loss_held", (("reason", "grace"),))] == 1.0
    for t in range(5, 60, 5):
        beat(a, back + timedelta(seconds=t))
        beat(b, back + timedelta(seconds=t))
        assert detect_lost_servers(back + timedelta(seconds=t)) == 0
    beat(a, back + timedelta(seconds=60))
    beat(b, back + timedelta(seconds=60))
    assert detect_lost_servers(back + timedelta(seconds=60)) == 1
    assert states(c) == [ServerState.OFFLINE]
    # Its silence during the disruption was real for its agent too: released at once, not 50 s later.
    assert no_release == [("node-c", 160.0)]
    assert types() == [
        EventType.JOIN_TOKEN_USED,
        EventType.JOIN_TOKEN_USED,
        EventType.JOIN_TOKEN_USED,
        EventType.DISRUPTION,
        EventType.DISRUPTION_ENDED,
        EventType.SERVER_LOST,
    ]
    for pk in Event.objects.filter(fanned_out_at__isnull=True).values_list("pk", flat=True):
        notifications.event_fan_out(event_id=pk)
    subjects = list(
        EmailMessage.objects.filter(to_address=operator.email).order_by("id").values_list("subject", flat=True)
    )
    assert subjects == ["Node loss held: 3 of 3 servers silent", "Node loss no longer held", "Server lost: node-c"]


# -- notifications: one digest per pass, server back ------------------------------------------------------


@override_settings(**{**DEFAULTS, "FLEET_DISRUPTION_SHARE": 1.0})
def test_the_servers_one_pass_marks_offline_are_one_digest(no_release: list[Any]) -> None:
    operator = OperatorFactory(email="op@example.org")
    fleet("node-a", "node-b", "node-c")
    assert steady_pass(T0 + timedelta(seconds=16)) == 3
    [digest] = Event.objects.filter(type=EventType.SERVER_LOST)
    assert digest.payload["count"] == 3
    assert [s["hostname"] for s in digest.payload["servers"]] == ["node-a", "node-b", "node-c"]
    assert all("no heartbeat for 16 s" in s["reason"] for s in digest.payload["servers"])
    assert notifications.event_fan_out(event_id=digest.pk)
    [email] = EmailMessage.objects.filter(to_address=operator.email)
    assert email.subject == "3 servers lost: node-a, node-b, node-c"
    assert email.body_text.count("went offline") == 3


@override_settings(**DEFAULTS)
def test_a_server_heard_again_after_offline_is_back_with_a_notification(no_release: list[Any]) -> None:
    operator = OperatorFactory(email="op@example.org")
    [a] = fleet("node-a")
    assert steady_pass(T0 + timedelta(seconds=16)) == 1
    beat(a, T0 + timedelta(seconds=30))
    assert states(a) == [ServerState.COMMISSIONING]
    [back] = Event.objects.filter(type=EventType.SERVER_BACK)
    assert back.server_id == a.pk and back.payload["to_state"] == ServerState.COMMISSIONING
    assert notifications.event_fan_out(event_id=back.pk)
    subjects = list(
        EmailMessage.objects.filter(to_address=operator.email).order_by("id").values_list("subject", flat=True)
    )
    assert "Server back: node-a" in subjects
    beat(a, T0 + timedelta(seconds=35))  # an ordinary heartbeat is not news
    assert Event.objects.filter(type=EventType.SERVER_BACK).count() == 1


# -- races ---------------------------------------------------------------------------------------------------


@override_settings(**DEFAULTS)
def test_a_heartbeat_landing_at_the_detectors_critical_step_keeps_the_server_online(
    no_release: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    [a] = fleet("node-a")
    judged = nodeloss._mark_offline

    def heartbeat_first(*, server: Server, now: datetime, since: datetime | None) -> Any:
        beat(a, now)  # after the detector read it as silent, before its conditional update
        return judged(server=server, now=now, since=since)

    monkeypatch.setattr(nodeloss, "_mark_offline", heartbeat_first)
    assert steady_pass(T0 + timedelta(seconds=16)) == 0
    assert states(a) == [ServerState.COMMISSIONING]
    assert not ServerEvent.objects.filter(to_state=ServerState.OFFLINE).exists()
    assert EventType.SERVER_LOST not in types()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@override_settings(**{**DEFAULTS, "FLEET_DISRUPTION_SHARE": 1.0})
def test_two_detectors_at_once_mark_each_server_once_and_send_one_digest(no_release: list[Any]) -> None:
    servers = fleet("node-a", "node-b", "node-c")
    NodeLossWatch.objects.create(pk=1, last_pass_at=T0 + timedelta(seconds=11))
    start = threading.Barrier(2)
    errors: list[BaseException] = []
    results: list[int] = []

    def run(at: datetime) -> None:
        try:
            start.wait()
            results.append(detect_lost_servers(at))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    # Two beats, a millisecond apart: the second judges again after the first, and finds nothing left to do.
    threads = [threading.Thread(target=run, args=(T0 + timedelta(seconds=16, milliseconds=ms),)) for ms in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert sum(results) == 3
    assert states(*servers) == [ServerState.OFFLINE] * 3
    assert ServerEvent.objects.filter(to_state=ServerState.OFFLINE).count() == 3
    assert Event.objects.filter(type=EventType.SERVER_LOST).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@override_settings(**DEFAULTS)
def test_two_detectors_at_once_open_one_disruption_and_notify_once(no_release: list[Any]) -> None:
    fleet("node-a", "node-b", "node-c")
    NodeLossWatch.objects.create(pk=1, last_pass_at=T0 + timedelta(seconds=11))
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def run(at: datetime) -> None:
        try:
            start.wait()
            detect_lost_servers(at)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(T0 + timedelta(seconds=16, milliseconds=ms),)) for ms in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert NodeLossDisruption.objects.count() == 1
    assert Event.objects.filter(type=EventType.DISRUPTION).count() == 1
    assert not Server.objects.filter(state=ServerState.OFFLINE).exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@override_settings(**DEFAULTS)
def test_a_heartbeat_committed_by_another_connection_at_the_critical_step_wins(
    no_release: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    [a] = fleet("node-a")
    judged = nodeloss._mark_offline
    errors: list[BaseException] = []

    def heartbeat_elsewhere(at: datetime) -> None:
        try:
            beat(Server.objects.get(pk=a.pk), at)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def heartbeat_first(*, server: Server, now: datetime, since: datetime | None) -> Any:
        # The agent's heartbeat commits on its own connection while the detector holds its judgement open.
        other = threading.Thread(target=heartbeat_elsewhere, args=(now,))
        other.start()
        other.join(timeout=30)
        return judged(server=server, now=now, since=since)

    monkeypatch.setattr(nodeloss, "_mark_offline", heartbeat_first)
    assert steady_pass(T0 + timedelta(seconds=16)) == 0
    assert not errors, errors
    assert states(a) == [ServerState.COMMISSIONING]
    assert EventType.SERVER_LOST not in types()
