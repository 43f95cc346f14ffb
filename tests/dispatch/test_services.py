"""Dispatch services with the agent's reports faked: the lifecycle, failures, node loss and requeue."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.dispatch import recovery, reports, services
from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch, Requeue
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Server
from controlplane.ledger.selectors import outstanding_hold
from controlplane.reservations import services as reservations
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from tests.dispatch.support import book, report
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db


def states(reservation: Reservation) -> list[str]:
    return [e.to_state for e in reservation.events.order_by("id")]


def opened(reservation: Reservation, now=None) -> list[Launch]:  # type: ignore[no-untyped-def]
    services.dispatch_open_due(now=now or timezone.now())
    return list(Launch.objects.filter(reservation=reservation).order_by("server_id"))


def test_window_opening_creates_one_launch_per_server_and_marks_starting():
    h100 = gpu_model()
    a, b = server(h100, gpus=2), server(h100, gpus=2)
    r = book(project(), h100, count=4)
    launches = opened(r)
    assert {launch.server_id for launch in launches} == {a.pk, b.pk}
    assert sorted(len(launch.gpu_uuids) for launch in launches) == [2, 2]
    r.refresh_from_db()
    assert r.state == ReservationState.STARTING
    assert states(r)[-1] == "starting"


def test_opening_twice_creates_no_second_launch():
    h100 = gpu_model()
    server(h100, gpus=2)
    r = book(project(), h100, count=2)
    opened(r)
    assert services.reservation_open(reservation_id=r.pk) == []
    assert services.dispatch_open_due() == 0
    assert Launch.objects.filter(reservation=r).count() == 1


def test_a_window_beyond_the_lead_time_is_not_opened_yet():
    h100 = gpu_model()
    server(h100, gpus=1)
    r = book(project(), h100, start_in=30)
    assert opened(r) == []
    r.refresh_from_db()
    assert r.state == ReservationState.SCHEDULED


@override_settings(DISPATCH_WARN_BEFORE_S=7, DISPATCH_STOP_GRACE_S=3)
def test_heartbeat_opens_its_servers_due_window_and_answers_with_the_container():
    h100 = gpu_model()
    srv = server(h100, gpus=2)
    r = book(project(), h100, count=2)
    desired, stop = services.desired_state_for(server=srv)
    assert stop == []
    [item] = desired
    launch = Launch.objects.get(reservation=r)
    assert item.launch_id == launch.launch_id
    assert item.gpu_uuids == launch.gpu_uuids == sorted(launch.gpu_uuids)
    assert (item.window_start, item.window_end) == (r.starts_at, r.ends_at)
    assert (item.warn_before_s, item.stop_grace_s, item.image) == (7, 3, "gpucp-busybox:test")
    # Another server's heartbeat never carries it.
    other = server(h100, gpus=1)
    assert services.desired_state_for(server=other) == ([], [])


def test_running_reports_move_the_reservation_to_running():
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    r = book(project(), h100)
    [launch] = opened(r)
    now = timezone.now()
    reports.containers_reported(
        server=srv, reports=[report(launch, "running", container_id="c1", started_at=now)], now=now
    )
    launch.refresh_from_db()
    r.refresh_from_db()
    assert (launch.state, launch.container_id) == (LaunchState.RUNNING, "c1")
    assert r.state == ReservationState.RUNNING
    # A stale "pending" from an older heartbeat does not move it back.
    reports.containers_reported(server=srv, reports=[report(launch, "pending")], now=now)
    launch.refresh_from_db()
    assert launch.state == LaunchState.RUNNING


def test_non_zero_exit_inside_the_window_fails_with_exit_code_and_log_tail():
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    proj = project()
    r = book(proj, h100, seconds=3600)
    [launch] = opened(r)
    now = timezone.now()
    reports.containers_reported(
        server=srv,
        now=now,
        reports=[
            report(
                launch,
                "exited",
                container_id="c1",
                started_at=now,
                finished_at=now + timedelta(seconds=10),
                exit_code=3,
                log_tail="Traceback: boom\n",
            )
        ],
    )
    r.refresh_from_db()
    launch.refresh_from_db()
    assert r.state == ReservationState.FAILED
    assert "exited with code 3" in r.events.last().reason
    assert (launch.exit_code, launch.log_tail) == (3, "Traceback: boom\n")
    # Settled: no hold left, and the GPUs are free.
    assert outstanding_hold(reservation_id=r.pk) == Decimal(0)
    assert not r.allocations.filter(active=True).exists()


def test_missing_image_fails_the_reservation_with_the_reason():
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    r = book(project(), h100)
    [launch] = opened(r)
    now = timezone.now()
    reports.containers_reported(
        server=srv,
        now=now,
        reports=[report(launch, "failed", error="image not found: gpucp-busybox:test", finished_at=now)],
    )
    r.refresh_from_db()
    assert r.state == ReservationState.FAILED
    assert "image not found" in r.events.last().reason
    # Nothing ran, so nothing is charged.
    assert r.events.last().data["gpu_seconds"] == {}


def test_a_gpu_still_held_by_the_previous_container_is_not_a_failure():
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    r = book(project(), h100)
    [launch] = opened(r)
    reports.containers_reported(
        server=srv,
        now=timezone.now(),
        reports=[report(launch, "pending", error=f"GPU {launch.gpu_uuids[0]} is already bound to launch x")],
    )
    r.refresh_from_db()
    launch.refresh_from_db()
    assert (r.state, launch.state) == (ReservationState.STARTING, LaunchState.PENDING)
    assert "already bound" in launch.error  # the operator sees why it waits
    started = timezone.now()
    reports.containers_reported(server=srv, now=started, reports=[report(launch, "running", started_at=started)])
    launch.refresh_from_db()
    assert (launch.state, launch.error) == (LaunchState.RUNNING, "")


def test_exit_zero_before_the_end_completes_and_charges_what_ran():
    h100 = gpu_model(weight="1")
    srv = server(h100, gpus=2)
    r = book(project(), h100, count=2, seconds=3600)
    [launch] = opened(r)
    start = timezone.now()
    reports.containers_reported(server=srv, now=start, reports=[report(launch, "running", started_at=start)])
    end = start + timedelta(seconds=90)
    reports.containers_reported(
        server=srv,
        now=end,
        reports=[report(launch, "exited", started_at=start, finished_at=end, exit_code=0, log_tail="done\n")],
    )
    r.refresh_from_db()
    assert r.state == ReservationState.COMPLETED
    assert states(r)[-3:] == ["starting", "running", "completed"]
    data = r.events.last().data
    assert data["measured"] is True
    assert data["gpu_seconds"] == {uuid: pytest.approx(90.0, abs=1) for uuid in launch.gpu_uuids}


def test_window_end_moves_running_to_ending_then_completed_when_the_container_stopped():
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    r = book(project(), h100, seconds=5)
    [launch] = opened(r)
    start = timezone.now()
    reports.containers_reported(server=srv, now=start, reports=[report(launch, "running", started_at=start)])
    after = r.ends_at + timedelta(seconds=1)
    assert services.dispatch_close_due(now=after) >= 1
    r.refresh_from_db()
    assert r.state == ReservationState.ENDING
    # Outside the window the launch is no longer desired: the agent stops it.
    assert services.node_desired_state(server=srv, now=after) == ([], [launch.launch_id])
    reports.containers_reported(
        server=srv,
        now=after,
        reports=[
            report(launch, "exited", started_at=start, finished_at=r.ends_at + timedelta(seconds=1), exit_code=143)
        ],
    )
    r.refresh_from_db()
    assert r.state == ReservationState.COMPLETED
    assert states(r)[-2:] == ["ending", "completed"]


def test_sigterm_exit_reported_at_the_end_before_the_closer_ran_completes():
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    r = book(project(), h100, seconds=5)
    [launch] = opened(r)
    start = timezone.now()
    end = r.ends_at + timedelta(milliseconds=300)
    reports.containers_reported(
        server=srv, now=end, reports=[report(launch, "exited", started_at=start, finished_at=end, exit_code=143)]
    )
    r.refresh_from_db()
    assert r.state == ReservationState.COMPLETED


def test_release_during_the_window_stops_the_container_and_completes():
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    user = None
    r = book(project(), h100, seconds=3600)
    [launch] = opened(r)
    start = timezone.now()
    reports.containers_reported(server=srv, now=start, reports=[report(launch, "running", started_at=start)])
    reservations.reservation_release(reservation=r, actor=user, reason="done early")
    assert services.node_desired_state(server=srv)[1] == [launch.launch_id]
    assert services.dispatch_close_due() >= 1  # pushes the stop once
    launch.refresh_from_db()
    assert launch.stop_requested_at is not None
    end = timezone.now()
    reports.containers_reported(
        server=srv, now=end, reports=[report(launch, "exited", started_at=start, finished_at=end, exit_code=143)]
    )
    r.refresh_from_db()
    assert r.state == ReservationState.COMPLETED


def test_cancel_before_the_start_cancels_the_pending_launch():
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    now = timezone.now()
    r = book(project(), h100, start_in=1.5, now=now)
    [launch] = opened(r, now=now)
    reservations.reservation_cancel(reservation=r, actor=None, now=now)
    assert services.node_desired_state(server=srv, now=now) == ([], [launch.launch_id])
    services.dispatch_close_due(now=now)
    launch.refresh_from_db()
    assert launch.state == LaunchState.CANCELLED
    assert services.node_desired_state(server=srv, now=now) == ([], [])


def test_a_report_about_another_servers_launch_is_ignored():
    h100 = gpu_model()
    srv, intruder = server(h100, gpus=1), server(h100, gpus=1)
    r = book(project(), h100)
    [launch] = opened(r)
    now = timezone.now()
    assert launch.server_id == srv.pk or launch.server_id == intruder.pk
    other = intruder if launch.server_id == srv.pk else srv
    reports.containers_reported(
        server=other, now=now, reports=[report(launch, "exited", exit_code=1, started_at=now, finished_at=now)]
    )
    launch.refresh_from_db()
    assert launch.state == LaunchState.PENDING


def test_a_launch_that_never_starts_fails_after_the_start_timeout():
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    r = book(project(), h100, seconds=3600)
    opened(r)
    Server.objects.filter(pk=srv.pk).update(last_heartbeat_at=r.starts_at + timedelta(seconds=31))
    with override_settings(DISPATCH_START_TIMEOUT_S=30):
        services.dispatch_close_due(now=r.starts_at + timedelta(seconds=31))
    r.refresh_from_db()
    assert r.state == ReservationState.FAILED
    assert "did not start the container within 30 s" in r.events.last().reason


def test_a_launch_whose_agent_was_not_heard_since_its_start_was_due_is_not_failed():
    """Its agent, silent through an outage, may have started it from the desired state it holds: its replayed
    reports decide, or node loss gives the launch up."""
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    r = book(project(), h100, seconds=3600)
    [launch] = opened(r)
    Server.objects.filter(pk=srv.pk).update(last_heartbeat_at=r.starts_at + timedelta(seconds=29))
    with override_settings(DISPATCH_START_TIMEOUT_S=30):
        services.dispatch_close_due(now=r.starts_at + timedelta(seconds=600))
    r.refresh_from_db()
    launch.refresh_from_db()
    assert r.state == ReservationState.STARTING
    assert launch.state == LaunchState.PENDING


def lose(srv: Server, *, silent_for: float = 30.0) -> None:
    now = timezone.now()
    Server.objects.filter(pk=srv.pk).update(
        last_heartbeat_at=now - timedelta(seconds=silent_for),
        state=ServerState.OFFLINE,
        state_before_offline=ServerState.READY,
    )
    srv.refresh_from_db()
    # Long past every release time, replaceable or not (fleet.fencing): every launch is given up.
    recovery.server_lost(server=srv, now=now, silent_s=1e6)


def test_a_lost_server_interrupts_its_reservations_and_settles_what_ran():
    h100 = gpu_model()
    srv = server(h100, gpus=1)
    server(h100, gpus=1)
    r = book(project(), h100, seconds=3600)
    [launch] = opened(r)
    start = timezone.now() - timedelta(seconds=60)
    reports.containers_reported(server=launch.server, now=start, reports=[report(launch, "running", started_at=start)])
    lose(launch.server)
    r.refresh_from_db()
    launch.refresh_from_db()
    assert launch.state == LaunchState.LOST
    assert r.state == ReservationState.INTERRUPTED
    assert "stopped sending heartbeats" in r.events.last().reason
    assert not Requeue.objects.exists()  # the project did not opt in
    assert srv.pk  # the other server is untouched


def test_a_lost_server_requeues_the_rest_of_the_window_on_healthy_gpus_when_opted_in():
    h100 = gpu_model()
    server(h100, gpus=2)
    server(h100, gpus=2)
    proj = project()
    proj.requeue_on_interrupt = True
    proj.save(update_fields=["requeue_on_interrupt"])
    r = book(proj, h100, count=2, seconds=3600)
    [launch] = opened(r)
    lost_server = launch.server
    lose(lost_server)
    r.refresh_from_db()
    assert r.state == ReservationState.INTERRUPTED
    link = Requeue.objects.get(interrupted=r)
    follow = link.follow_up
    assert follow.state == ReservationState.STARTING
    assert follow.ends_at == r.ends_at
    [again] = Launch.objects.filter(reservation=follow)
    assert again.server_id != lost_server.pk
    assert again.generation == 2
    assert "requeued as" in r.events.last().reason


def test_requeue_without_capacity_says_why():
    h100 = gpu_model()
    server(h100, gpus=2)
    proj = project()
    proj.requeue_on_interrupt = True
    proj.save(update_fields=["requeue_on_interrupt"])
    r = book(proj, h100, count=2, seconds=3600)
    [launch] = opened(r)
    lose(launch.server)
    r.refresh_from_db()
    assert r.state == ReservationState.INTERRUPTED
    reason = r.events.last().reason
    # The same words as the API's no_capacity: here the only server is lost, so no GPU is healthy on a ready one.
    assert reason.startswith("not requeued: The fleet has 2 H100-80GB GPUs, but only 0 healthy"), reason
