"""Node loss gives up a silent server's launches by kind of work (docs/fleet.md, "Outages and node loss").

Replaceable work (its project requeues on interrupt) is given up after the agent's lease, the stop grace and the
margin, and requeued; other work keeps its reservation running and its GPUs until the outage tolerance, the stop
grace and the margin have passed, and is never requeued. A window that ends while its server is silent is
settled from what the agent reports when it is back, so usage and charges equal what ran.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.test import override_settings
from django.utils import timezone

from controlplane.accounting.services import usage_record_reservation
from controlplane.dispatch import reports, services
from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch, Requeue
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Server
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.ledger.services import credits
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from tests.dispatch.support import book, report
from tests.fleet.node_loss_support import steady_pass
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db

DEFAULTS = {
    "FLEET_OFFLINE_AFTER_INTERVALS": 3,
    "FLEET_FENCE_AFTER_INTERVALS": 2,
    "DISPATCH_STOP_GRACE_S": 30,
    "DISPATCH_STOP_TIMEOUT_S": 60,
    "FLEET_REQUEUE_MARGIN_S": 10.0,
    "FLEET_OUTAGE_TOLERANCE_S": 1800.0,
    "DISPATCH_WARN_BEFORE_S": 0,
}


def running(proj: object, h100: object, *, at: datetime, seconds: float) -> tuple[Reservation, Launch]:
    r = book(proj, h100, seconds=seconds, now=at)
    [launch] = services.reservation_open(reservation_id=r.pk, now=at)
    started = at + timedelta(seconds=1)
    Server.objects.filter(pk=launch.server_id).update(last_heartbeat_at=started)
    reports.containers_reported(
        server=launch.server, now=started, reports=[report(launch, "running", started_at=started)]
    )
    r.refresh_from_db()
    assert r.state == ReservationState.RUNNING
    return r, Launch.objects.select_related("server").get(pk=launch.pk)


def back(srv: Server, at: datetime) -> None:
    """The agent's first heartbeat after the silence, as the ingest records it (its reports follow)."""
    Server.objects.filter(pk=srv.pk).update(last_heartbeat_at=at, state=ServerState.READY, state_before_offline="")
    srv.refresh_from_db()


def charged(r: Reservation) -> Decimal:
    return -(LedgerEntry.objects.filter(reservation=r, kind=EntryKind.CHARGE).aggregate(t=Sum("amount"))["t"] or 0)


@override_settings(**DEFAULTS)
def test_replaceable_work_is_requeued_after_the_lease_and_other_work_keeps_its_gpus_until_the_tolerance() -> None:
    h100 = gpu_model()
    server(h100, gpus=2)  # the only one: both reservations land on it
    elsewhere = server(h100, gpus=2)  # never heard: not live, but ready for the follow-up
    Server.objects.filter(pk=elsewhere.pk).update(state=ServerState.MAINTENANCE)
    t0 = timezone.now()
    requeuing = project()
    requeuing.requeue_on_interrupt = True
    requeuing.save(update_fields=["requeue_on_interrupt"])
    replaceable, fast = running(requeuing, h100, at=t0, seconds=7200)
    kept, slow = running(project(), h100, at=t0, seconds=7200)
    assert fast.server_id == slow.server_id
    Server.objects.filter(pk=elsewhere.pk).update(state=ServerState.READY)
    last = t0 + timedelta(seconds=1)

    assert steady_pass(last + timedelta(seconds=16)) == 1
    assert Server.objects.get(pk=fast.server_id).state == ServerState.OFFLINE
    assert steady_pass(last + timedelta(seconds=49)) == 0
    assert Launch.objects.get(pk=fast.pk).state == LaunchState.RUNNING

    assert steady_pass(last + timedelta(seconds=51)) == 1  # the lease 10 + grace 30 + margin 10
    assert Launch.objects.get(pk=fast.pk).state == LaunchState.LOST
    assert Reservation.objects.get(pk=replaceable.pk).state == ReservationState.INTERRUPTED
    assert Requeue.objects.filter(interrupted=replaceable).exists()
    # The other one runs on through the outage, holding its GPU.
    assert Launch.objects.get(pk=slow.pk).state == LaunchState.RUNNING
    assert Reservation.objects.get(pk=kept.pk).state == ReservationState.RUNNING
    assert kept.allocations.filter(active=True).count() == 1

    assert steady_pass(last + timedelta(seconds=1839)) == 0  # tolerance 1800 + grace 30 + margin 10 = 1840
    assert Launch.objects.get(pk=slow.pk).state == LaunchState.RUNNING
    assert steady_pass(last + timedelta(seconds=1841)) == 1
    gone = Launch.objects.get(pk=slow.pk)
    assert gone.state == LaunchState.LOST and gone.finished_at == last  # charged up to what we can vouch for
    kept.refresh_from_db()
    assert kept.state == ReservationState.INTERRUPTED
    assert not Requeue.objects.filter(interrupted=kept).exists()  # nothing replaces it
    assert Requeue.objects.count() == 1


@override_settings(**DEFAULTS)
def test_a_window_that_ends_while_its_server_is_silent_is_settled_from_what_the_agent_replays() -> None:
    h100 = gpu_model()
    server(h100, gpus=1)
    t0 = timezone.now()
    r, launch = running(project(), h100, at=t0, seconds=300)
    silent_from = t0 + timedelta(seconds=100)
    Server.objects.filter(pk=launch.server_id).update(last_heartbeat_at=silent_from)

    assert steady_pass(silent_from + timedelta(seconds=16)) == 1  # offline; the launch lives on
    services.dispatch_close_due(now=t0 + timedelta(seconds=301))
    assert Reservation.objects.get(pk=r.pk).state == ReservationState.ENDING
    # Long past the stop timeout (grace 30 + 60): a heard agent that did not confirm would be given up here,
    # charged to the window's end. This one was not heard since: wait for what it saw.
    services.dispatch_close_due(now=t0 + timedelta(seconds=500))
    assert Reservation.objects.get(pk=r.pk).state == ReservationState.ENDING
    assert charged(r) == 0

    # Back after 10 minutes: its journal says the container ran to the window's end and stopped in its grace.
    srv = launch.server
    back(srv, t0 + timedelta(seconds=700))
    stopped = report(
        launch, "exited", started_at=launch.started_at, finished_at=t0 + timedelta(seconds=303), exit_code=143
    )
    reports.containers_reported(server=srv, now=t0 + timedelta(seconds=700), reports=[stopped])
    r.refresh_from_db()
    assert r.state == ReservationState.COMPLETED
    ran = (r.ends_at - launch.started_at).total_seconds()  # 299 s: start to the window's end
    final = r.events.get(to_state=ReservationState.COMPLETED)
    assert final.data["gpu_seconds"] == {launch.gpu_uuids[0]: ran}
    assert charged(r) == credits(Decimal(ran) / Decimal(3600))  # a GPU of weight 1: a credit an hour
    [record] = usage_record_reservation(reservation=r)
    assert record.gpu_seconds == ran and record.finished_at == r.ends_at


@override_settings(**DEFAULTS)
def test_a_container_that_exited_during_the_silence_is_charged_to_its_exit_not_to_the_window() -> None:
    h100 = gpu_model()
    server(h100, gpus=1)
    t0 = timezone.now()
    r, launch = running(project(), h100, at=t0, seconds=300)
    silent_from = t0 + timedelta(seconds=40)
    Server.objects.filter(pk=launch.server_id).update(last_heartbeat_at=silent_from)
    assert steady_pass(silent_from + timedelta(seconds=16)) == 1
    services.dispatch_close_due(now=t0 + timedelta(seconds=301))
    services.dispatch_close_due(now=t0 + timedelta(seconds=500))
    assert charged(r) == 0

    srv = launch.server
    back(srv, t0 + timedelta(seconds=600))
    exited = t0 + timedelta(seconds=50)
    done = report(launch, "exited", started_at=launch.started_at, finished_at=exited, exit_code=0)
    reports.containers_reported(server=srv, now=t0 + timedelta(seconds=600), reports=[done])
    r.refresh_from_db()
    assert r.state == ReservationState.COMPLETED
    ran = (exited - launch.started_at).total_seconds()  # 49 s, not the 299 s of the window
    assert r.events.get(to_state=ReservationState.COMPLETED).data["gpu_seconds"] == {launch.gpu_uuids[0]: ran}
    assert charged(r) == credits(Decimal(ran) / Decimal(3600))


@override_settings(**DEFAULTS)
def test_a_heard_agent_that_does_not_confirm_the_stop_is_still_given_up_at_the_stop_timeout() -> None:
    h100 = gpu_model()
    server(h100, gpus=1)
    t0 = timezone.now()
    r, launch = running(project(), h100, at=t0, seconds=300)
    services.dispatch_close_due(now=t0 + timedelta(seconds=301))
    Server.objects.filter(pk=launch.server_id).update(last_heartbeat_at=t0 + timedelta(seconds=395))
    services.dispatch_close_due(now=t0 + timedelta(seconds=400))  # heard after the stop was due, no confirmation
    r.refresh_from_db()
    assert r.state == ReservationState.COMPLETED
    assert "did not confirm the stop" in r.events.get(to_state=ReservationState.COMPLETED).reason
