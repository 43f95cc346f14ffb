"""The whole road on the real Docker engine: booking -> signed push -> agent -> container on exactly its GPUs ->
warning -> stop at the end -> completed, with exit code and log tail through the API.

The agent is the real one (Agent + DockerRuntime + simulated GPUs + command listener) in a thread, talking HTTP
to pytest-django's live server; Celery runs eagerly in the test's thread.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests as http
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.celery import app as celery_app
from controlplane.dispatch import services
from controlplane.dispatch.models import Launch
from controlplane.fleet import services as fleet
from controlplane.fleet.models import NodeCredential
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Server
from controlplane.reservations import services as reservations
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window
from nodeagent import commands
from nodeagent.agent import Agent, AgentState
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.client import ControlPlaneClient
from nodeagent.collectors import HostCollector
from nodeagent.commands import CommandChannel
from nodeagent.runtime.containers import LABEL_NODE
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image
from tests.factories import member_of
from tests.reservations.fleet import project
from tests.runtime import support

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]

# Prints its GPUs, says when warned (SIGUSR1) and exits 0 on SIGTERM.
JOB = [
    "sh",
    "-c",
    'echo "gpus=$NVIDIA_VISIBLE_DEVICES"; trap "echo warned; cat /run/gpucp/warning" USR1; '
    'trap "echo stopping; exit 0" TERM; while true; do sleep 0.1; done',
]


# The agent's loop and the broker add their own latency: wait a little longer, poll a little faster.
wait_for = functools.partial(support.wait_for, timeout=20.0, interval=0.05)


@pytest.fixture
def eager_celery() -> Iterator[None]:
    before = celery_app.conf.task_always_eager
    # Both names: Celery before 5.7 reads the Django settings' CELERY_ name before the plain one.
    celery_app.conf.update(task_always_eager=True, CELERY_TASK_ALWAYS_EAGER=True)
    yield
    celery_app.conf.update(task_always_eager=before, CELERY_TASK_ALWAYS_EAGER=before)


@pytest.fixture
def agent_node(transactional_db, live_server, docker_client, tmp_path: Path, eager_celery) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    hostname = f"e2e-{uuid.uuid4().hex[:8]}"
    _, join_token = fleet.join_token_create(actor=None, note="e2e")
    state = AgentState(tmp_path / "agent")
    holder: dict[str, Any] = {}
    channel = CommandChannel(
        credential=lambda: holder["agent"].credential, server_name=lambda: holder["agent"].server_name
    ).start()
    runtime = DockerRuntime(state_dir=tmp_path / "runtime", client=docker_client, node=hostname, nvidia_runtime=False)
    backend = SimulatedBackend("4xH100-80GB", hostname=hostname, busy_source=runtime.busy_gpus)
    agent = Agent(
        client=ControlPlaneClient(live_server.url, timeout=10),
        backend=backend,
        runtime=runtime,
        state=state,
        host=HostCollector(hostname=hostname),
        join_token=join_token,
        interval=0.5,
        commands=channel,
    )
    holder["agent"] = agent
    thread = threading.Thread(target=agent.run, name="agent", daemon=True)
    thread.start()
    server = wait_for(
        lambda: Server.objects.filter(hostname=hostname, gpus__isnull=False).first(),
        what="enrollment and GPU discovery",
    )
    # A slow heartbeat: the push, not the heartbeat, must be what starts the container quickly.
    Server.objects.filter(pk=server.pk).update(state=ServerState.READY, heartbeat_interval_s=3.0)
    wait_for(lambda: Server.objects.get(pk=server.pk).facts.get("command_url"), what="the command URL")
    try:
        yield {"server": server, "agent": agent, "hostname": hostname}
    finally:
        agent.stop()
        thread.join(timeout=10)
        channel.close()
        for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={hostname}"}):
            container.remove(force=True)


def book_now(proj: Any, *, seconds: float, gpus: int = 2) -> Reservation:
    now = timezone.now()
    # reservation_create hands the booking to dispatch itself, inside its transaction.
    with transaction.atomic():
        r = reservations.reservation_create(
            project=proj,
            name="e2e",
            spec=GpuSpec(min_memory_mib=1024, gpu_count=gpus),
            window=Window(now, now + timedelta(seconds=seconds)),
            container=ContainerSpec(image=DEFAULT_TAG, command=JOB),
            actor=None,
            now=now,
        )
    return r


def containers(docker_client, hostname: str) -> list:  # type: ignore[no-untyped-def]
    return docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={hostname}"})


@override_settings(DISPATCH_WARN_BEFORE_S=3, DISPATCH_STOP_GRACE_S=2)
def test_booked_window_runs_on_exactly_its_gpus_is_warned_stopped_and_completed(agent_node, docker_client):
    from django.contrib.auth import get_user_model

    owner = get_user_model().objects.create_user("owner", password="x")
    proj = project(owner=owner)
    outsider = member_of(project())
    r = book_now(proj, seconds=7)
    launch = wait_for(lambda: Launch.objects.filter(reservation=r).first(), what="the launch")
    [container] = wait_for(lambda: containers(docker_client, agent_node["hostname"]), timeout=10, what="the container")
    env = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(launch.gpu_uuids)
    assert len(launch.gpu_uuids) == 2
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING, what="running")
    assert Launch.objects.get(pk=launch.pk).pushed_at is not None

    # A redelivered push (a worker killed after the POST) and two racing deliveries never start a second
    # container. The commands are built here; only the HTTP runs in threads (SQLite's test connection is ours).
    services.push_launch(launch_id=launch.launch_id)
    desired, stop = services.node_desired_state(server=agent_node["server"])
    key = NodeCredential.objects.get(server=agent_node["server"], revoked_at__isnull=True).digest
    url = Server.objects.get(pk=agent_node["server"].pk).facts["command_url"]
    requests_ = [
        commands.signed_request(
            key=key, command=commands.new_command(server=agent_node["hostname"], desired=desired, stop=stop)
        )
        for _ in range(2)
    ]
    threads = [
        threading.Thread(target=http.post, args=(url,), kwargs={"data": body, "headers": headers, "timeout": 5})
        for body, headers in requests_
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.5)
    assert len(containers(docker_client, agent_node["hostname"])) == 1

    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.COMPLETED, timeout=20, what="completed")
    launch.refresh_from_db()
    assert launch.exit_code == 0
    assert "warned" in launch.log_tail and "stopping" in launch.log_tail
    assert f"gpus={','.join(launch.gpu_uuids)}" in launch.log_tail

    api = APIClient()
    api.force_authenticate(owner)
    body = api.get(f"/api/v1/reservations/{r.public_id}/launches/").json()
    [item] = body["results"] if isinstance(body, dict) else body
    assert (item["state"], item["exit_code"]) == ("exited", 0)
    assert "warned" in item["log_tail"]
    api.force_authenticate(outsider)
    assert api.get(f"/api/v1/reservations/{r.public_id}/launches/").status_code == 404
    assert api.get(f"/api/v1/launches/{launch.launch_id}/").status_code == 404


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=2)
def test_release_mid_window_stops_the_container(agent_node, docker_client):
    r = book_now(project(), seconds=120, gpus=1)
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING, what="running")
    reservations.reservation_release(reservation=r, actor=None, reason="done")
    services.dispatch_close_due()  # what the 1 s beat does: pushes the stop
    wait_for(
        lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.COMPLETED,
        timeout=15,
        what="completed after release",
    )
    assert "stopping" in Launch.objects.get(reservation=r).log_tail
