"""Recovery on the real Docker engine: an agent restarted mid-window adopts its container, and a lost server's
reservation is interrupted and its rest requeued on another server's GPUs, launched there by a second agent.

Same setting as test_end_to_end: real agents in threads talking HTTP to the live server, Celery eager.

Fencing on the control plane's side, without agents: node loss requeues only after the agent's lease, the stop
grace and the margin; a stop the agent reports as fenced interrupts and requeues at once, but only once the
container is gone. tests/faults/test_partition.py runs the whole of it through a real partition.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.dispatch import reports, services
from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch, Requeue
from controlplane.fleet import services as fleet
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Server
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from nodeagent.agent import Agent, AgentState
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.client import ControlPlaneClient
from nodeagent.collectors import HostCollector
from nodeagent.commands import CommandChannel
from nodeagent.runtime.containers import LABEL_LAUNCH
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image
from tests.dispatch.support import book, report
from tests.dispatch.test_end_to_end import book_now, containers, eager_celery, wait_for  # noqa: F401 - fixture
from tests.fleet.node_loss_support import steady_pass
from tests.reservations.fleet import gpu_model, project, server

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


class RunningAgent:
    """One real agent in a thread; ``restart()`` stops it and starts a fresh one on the same state dirs."""

    def __init__(self, *, url: str, docker_client: Any, state: Path, hostname: str, join_token: str | None) -> None:
        self.url, self.docker_client, self.state, self.hostname = url, docker_client, state, hostname
        self.join_token = join_token
        self.start()

    def start(self) -> None:
        holder: dict[str, Agent] = {}
        self.channel = CommandChannel(
            credential=lambda: holder["a"].credential, server_name=lambda: holder["a"].server_name
        )
        runtime = DockerRuntime(
            state_dir=self.state / "runtime", client=self.docker_client, node=self.hostname, nvidia_runtime=False
        )
        self.runtime = runtime
        self.agent = holder["a"] = Agent(
            client=ControlPlaneClient(self.url, timeout=10),
            backend=SimulatedBackend("2xH100-80GB", hostname=self.hostname, busy_source=runtime.busy_gpus),
            runtime=runtime,
            state=AgentState(self.state / "agent"),
            host=HostCollector(hostname=self.hostname),
            join_token=self.join_token,
            interval=0.5,
            commands=self.channel,
        )
        self.channel.start()
        self.thread = threading.Thread(target=self.agent.run, name=f"agent-{self.hostname}", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.agent.stop()
        self.thread.join(timeout=10)
        self.channel.close()

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def agents(transactional_db, live_server, docker_client, tmp_path: Path, eager_celery) -> Iterator[Any]:  # type: ignore[no-untyped-def]  # noqa: F811
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    started: list[RunningAgent] = []

    def start(n: int = 1) -> list[RunningAgent]:
        new = []
        for _ in range(n):
            hostname = f"rec-{uuid.uuid4().hex[:8]}"
            _, token = fleet.join_token_create(actor=None, note="recovery")
            new.append(
                RunningAgent(
                    url=live_server.url,
                    docker_client=docker_client,
                    state=tmp_path / hostname,
                    hostname=hostname,
                    join_token=token,
                )
            )
        started.extend(new)
        hosts = [a.hostname for a in new]
        wait_for(
            lambda: Server.objects.filter(hostname__in=hosts, gpus__isnull=False).distinct().count() == len(hosts),
            what="enrollment and GPU discovery",
        )
        Server.objects.filter(hostname__in=hosts).update(state=ServerState.READY, heartbeat_interval_s=1.0)
        wait_for(
            lambda: all(s.facts.get("command_url") for s in Server.objects.filter(hostname__in=hosts)),
            what="the command URLs",
        )
        return new

    yield start
    for agent in started:
        agent.stop()
        for container in containers(docker_client, agent.hostname):
            container.remove(force=True)


# A lease of 8 s (8 x 1 s) rather than 2 s: the restart must not be slower than the lease, or the restarted agent
# rightly fences the container it adopts (test_agent_fencing's restart test shows that side).
@override_settings(
    DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=2, FLEET_OFFLINE_AFTER_INTERVALS=10, FLEET_FENCE_AFTER_INTERVALS=8
)
def test_agent_restarted_mid_window_adopts_its_container_and_the_reservation_completes(agents, docker_client):
    [node] = agents(1)
    r = book_now(project(), seconds=9, gpus=1)
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING, what="running")
    [before] = containers(docker_client, node.hostname)
    started_at = before.attrs["State"]["StartedAt"]

    node.restart()  # a new Agent and DockerRuntime on the same state directories, mid-window

    assert node.runtime.report()[0].container_id == before.id  # adopted as it was on the engine
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.COMPLETED, timeout=25, what="done")
    [after] = containers(docker_client, node.hostname) or [before]
    after.reload()
    assert after.id == before.id
    assert after.attrs["State"]["StartedAt"] == started_at  # never restarted
    launch = Launch.objects.get(reservation=r)
    assert (launch.container_id, launch.exit_code, launch.state) == (before.id, 0, "exited")
    assert Launch.objects.filter(reservation=r).count() == 1


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=2, DISPATCH_REQUEUE_MIN_S=5)
def test_lost_server_interrupts_and_requeues_the_rest_of_the_window_on_another_server(agents, docker_client):
    first, second = agents(2)
    proj = project()
    proj.requeue_on_interrupt = True
    proj.save(update_fields=["requeue_on_interrupt"])
    r = book_now(proj, seconds=40, gpus=2)  # 2 GPUs: exactly one server's worth
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING, what="running")
    launch = Launch.objects.select_related("server").get(reservation=r)
    lost, survivor = (first, second) if launch.server.hostname == first.hostname else (second, first)

    lost.stop()  # its heartbeats stop; its container keeps running, as on a partitioned server
    silent_since = timezone.now() - timedelta(seconds=60)
    Server.objects.filter(hostname=lost.hostname).update(last_heartbeat_at=silent_since)
    assert steady_pass(timezone.now()) == 1

    r.refresh_from_db()
    assert r.state == ReservationState.INTERRUPTED
    assert r.events.filter(to_state=ReservationState.INTERRUPTED).exists()
    assert Launch.objects.get(pk=launch.pk).state == "lost"
    follow_up = Requeue.objects.get(interrupted=r).follow_up
    assert follow_up.ends_at == r.ends_at
    assert {a.gpu.server.hostname for a in follow_up.allocations.select_related("gpu__server")} == {survivor.hostname}
    wait_for(
        lambda: Reservation.objects.get(pk=follow_up.pk).state == ReservationState.RUNNING,
        timeout=20,
        what="the follow-up running on the other server",
    )
    [moved] = containers(docker_client, survivor.hostname)
    new_launch = Launch.objects.get(reservation=follow_up)
    assert moved.labels[LABEL_LAUNCH] == new_launch.launch_id
    assert new_launch.generation == 2


# -- fencing on the control plane's side ----------------------------------------------------------------------

FENCED = "fenced: no reply from the control plane for 10.0 s (lease 10 s)"
DEFAULTS = {
    "FLEET_OFFLINE_AFTER_INTERVALS": 3,
    "FLEET_FENCE_AFTER_INTERVALS": 2,
    "DISPATCH_STOP_GRACE_S": 30,
    "FLEET_REQUEUE_MARGIN_S": 10.0,
}


def running_on_one_of_two_servers() -> tuple[Reservation, Launch]:
    """A requeue-on-interrupt reservation of 2 GPUs running on one of two 2-GPU servers (5 s heartbeats)."""
    h100 = gpu_model()
    server(h100, gpus=2)
    server(h100, gpus=2)
    proj = project()
    proj.requeue_on_interrupt = True
    proj.save(update_fields=["requeue_on_interrupt"])
    r = book(proj, h100, count=2, seconds=3600)
    [launch] = services.reservation_open(reservation_id=r.pk)
    started = timezone.now() - timedelta(seconds=30)
    Server.objects.filter(pk=launch.server_id).update(last_heartbeat_at=started)
    reports.containers_reported(
        server=launch.server, now=started, reports=[report(launch, "running", started_at=started)]
    )
    r.refresh_from_db()
    assert r.state == ReservationState.RUNNING
    return r, Launch.objects.select_related("server").get(pk=launch.pk)


@override_settings(**DEFAULTS)
def test_node_loss_requeues_only_once_the_agent_has_had_its_lease_and_grace():
    r, launch = running_on_one_of_two_servers()
    last = timezone.now()
    Server.objects.filter(pk=launch.server_id).update(last_heartbeat_at=last)

    assert steady_pass(last + timedelta(seconds=16)) == 1
    assert Server.objects.get(pk=launch.server_id).state == ServerState.OFFLINE
    # Offline, but its agent may still be stopping the container: nothing is started elsewhere yet.
    assert Launch.objects.get(pk=launch.pk).state == LaunchState.RUNNING
    assert Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING
    assert steady_pass(last + timedelta(seconds=49)) == 0
    assert not Requeue.objects.exists()

    assert steady_pass(last + timedelta(seconds=51)) == 1
    lost = Launch.objects.get(pk=launch.pk)
    assert lost.state == LaunchState.LOST and lost.finished_at == last  # charged up to the last heartbeat
    assert Reservation.objects.get(pk=r.pk).state == ReservationState.INTERRUPTED
    follow_up = Requeue.objects.get(interrupted=r).follow_up
    [moved] = Launch.objects.filter(reservation=follow_up)
    assert moved.server_id != launch.server_id and moved.generation == 2
    assert steady_pass(last + timedelta(seconds=60)) == 0  # done once


@override_settings(**DEFAULTS)
def test_a_fenced_stop_reported_on_return_interrupts_and_requeues_at_once():
    r, launch = running_on_one_of_two_servers()
    now = timezone.now()
    finished = now - timedelta(seconds=2)
    fenced = report(launch, "stopping", started_at=launch.started_at, fenced=True, error=FENCED)
    reports.containers_reported(server=launch.server, now=now, reports=[fenced])
    # Still in its grace: not gone, so not started anywhere else yet.
    assert Launch.objects.get(pk=launch.pk).state == LaunchState.STOPPING
    assert Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING
    assert not Requeue.objects.exists()

    gone = report(
        launch, "exited", started_at=launch.started_at, finished_at=finished, exit_code=137, fenced=True, error=FENCED
    )
    reports.containers_reported(server=launch.server, now=now, reports=[gone])
    lost = Launch.objects.get(pk=launch.pk)
    assert (lost.state, lost.error, lost.exit_code, lost.finished_at) == (LaunchState.LOST, FENCED, 137, finished)
    r.refresh_from_db()
    assert r.state == ReservationState.INTERRUPTED
    interrupted = r.events.get(from_state=ReservationState.RUNNING, to_state=ReservationState.INTERRUPTED)
    assert f"stopped the container itself ({FENCED})" in interrupted.reason
    follow_up = Requeue.objects.get(interrupted=r).follow_up
    # A new launch (generation 2), anywhere healthy: its old container is known to be gone, so this server,
    # back and ready, may get it too; a new launch id, never the fenced one restarted.
    [again] = Launch.objects.filter(reservation=follow_up)
    assert again.generation == 2 and again.launch_id != launch.launch_id
    # The same report again (the agent repeats it until the launch is forgotten) changes nothing.
    reports.containers_reported(server=launch.server, now=now, reports=[gone])
    assert Requeue.objects.count() == 1


@override_settings(**DEFAULTS)
def test_a_fenced_stop_reported_after_node_loss_only_fills_in_what_the_launch_lacked():
    r, launch = running_on_one_of_two_servers()
    last = timezone.now() - timedelta(seconds=60)
    Server.objects.filter(pk=launch.server_id).update(last_heartbeat_at=last)
    assert steady_pass(timezone.now()) == 1
    assert Requeue.objects.count() == 1

    gone = report(launch, "exited", started_at=launch.started_at, finished_at=last, exit_code=137, fenced=True)
    reports.containers_reported(server=launch.server, now=timezone.now(), reports=[gone])
    lost = Launch.objects.get(pk=launch.pk)
    assert lost.state == LaunchState.LOST and lost.exit_code == 137
    assert "stopped sending heartbeats" in lost.error
    assert Requeue.objects.count() == 1 and Reservation.objects.get(pk=r.pk).state == ReservationState.INTERRUPTED
