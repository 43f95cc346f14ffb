"""Recovery on the real Docker engine: an agent restarted mid-window adopts its container, and a lost server's
reservation is interrupted and its rest requeued on another server's GPUs, launched there by a second agent.

Same setting as test_end_to_end: real agents in threads talking HTTP to the live server, Celery eager.
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
from tests.dispatch.test_end_to_end import book_now, containers, eager_celery, wait_for  # noqa: F401 - fixture
from tests.reservations.fleet import project

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


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=2)
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
    assert fleet.detect_lost_servers(now=timezone.now()) == 1

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
