"""Delivery when the queue fails, on the real Docker engine with a real Redis broker and real Celery workers:
a Redis outage across a window opening, and a worker killed with SIGKILL in the middle of a push.

The broker is a redis-server of the test's own (so it can be stopped and started again on the same port), the
workers are `celery -A controlplane worker --pool solo` processes on the test's PostgreSQL database (a worker
in another process cannot reach SQLite's test database, hence PostgreSQL only), and the agent is the real one
(Agent + DockerRuntime + simulated GPUs + command listener) in a thread, talking HTTP to the live server.
"""

from __future__ import annotations

import base64
import json
import logging
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests as http
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.core import broker as broker_module
from controlplane.dispatch import tasks
from controlplane.dispatch.models import Launch
from controlplane.dispatch.services import publish_once
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
from tests.conftest import service_missing
from tests.dispatch.support import CeleryWorker, PrivateRedis, celery_broker
from tests.dispatch.test_end_to_end import book_now, containers, wait_for
from tests.reservations.fleet import project

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# Short enough to watch a redelivery, and restore sweeps every second instead of every 100 s.
TRANSPORT = {"visibility_timeout": 3, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
DISPATCH_LOG = "controlplane.dispatch.services"


class FrontedChannel(CommandChannel):
    """The agent's real listener, advertised to the control plane at another address (the test's front)."""

    front_url: str | None = None

    @property
    def url(self) -> str | None:
        return self.front_url or CommandChannel.url.fget(self)  # type: ignore[attr-defined]


class HoldingFront:
    """A front for an agent's command listener. It never answers the first push (the sender stays mid-POST
    for as long as it lives) and forwards every later one to the listener, answering with its reply."""

    def __init__(self, target: Callable[[], str]) -> None:
        self.target = target
        self.bodies: list[bytes] = []
        self.first_seen = threading.Event()
        self.first_closed = threading.Event()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._closing = False
        threading.Thread(target=self._accept, name="holding-front", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.getsockname()[1]}/"

    def close(self) -> None:
        self._closing = True
        self._server.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head, body = self._read(conn)
            with self._lock:
                self.bodies.append(body)
                first = len(self.bodies) == 1
            if first:
                self.first_seen.set()
                conn.settimeout(60)
                try:
                    while conn.recv(4096):  # held until the sender goes away
                        pass
                except OSError:
                    pass
                self.first_closed.set()
                return
            headers = {k: v for k, v in head.items() if k.lower().startswith("x-gpucp-") or k.lower() == "content-type"}
            reply = http.post(self.target(), data=body, headers=headers, timeout=10)
            conn.sendall(
                f"HTTP/1.1 {reply.status_code} Forwarded\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(reply.content)}\r\nConnection: close\r\n\r\n".encode()
                + reply.content
            )

    @staticmethod
    def _read(conn: socket.socket) -> tuple[dict[str, str], bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        raw_head, _, body = data.partition(b"\r\n\r\n")
        head = {}
        for line in raw_head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            head[name.strip()] = value.strip()
        length = int(head.get("Content-Length", head.get("content-length", "0")))
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head, body


class Broker:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.redis = PrivateRedis(log_path=tmp_path / "redis.log")
        self.workers: list[CeleryWorker] = []

    def worker(self) -> CeleryWorker:
        worker = CeleryWorker(
            broker_url=self.redis.url,
            transport_options=TRANSPORT,
            log_path=self.tmp_path / f"worker-{len(self.workers) + 1}.log",
        )
        self.workers.append(worker)
        return worker

    def unacked(self) -> list[bytes]:
        return list(self.redis.client().hvals("unacked"))

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path.name}\n{w.log()[-3000:]}" for w in self.workers)


@pytest.fixture
def broker(transactional_db, live_server, tmp_path: Path) -> Iterator[Broker]:  # type: ignore[no-untyped-def]
    if shutil.which("redis-server") is None:
        service_missing("redis-server (for a private Celery broker)")
    b = Broker(tmp_path)
    b.redis.start()
    try:
        with celery_broker(b.redis.url, TRANSPORT):
            yield b
    finally:
        for worker in b.workers:
            worker.stop()  # a warm shutdown closes its database connections before the test database goes
        b.redis.stop()


@pytest.fixture
def node(transactional_db, live_server, docker_client, tmp_path: Path) -> Iterator[Callable[..., dict[str, Any]]]:  # type: ignore[no-untyped-def]
    """Starts one real agent; ``front`` puts a HoldingFront before its listener."""
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    started: list[tuple[Agent, threading.Thread, CommandChannel, str, HoldingFront | None]] = []

    def start(*, front: bool = False, heartbeat_s: float = 1.0) -> dict[str, Any]:
        hostname = f"dlv-{uuid.uuid4().hex[:8]}"
        _, join_token = fleet.join_token_create(actor=None, note="delivery")
        holder: dict[str, Agent] = {}
        channel = FrontedChannel(
            credential=lambda: holder["a"].credential, server_name=lambda: holder["a"].server_name
        ).start()
        holding = HoldingFront(lambda: CommandChannel.url.fget(channel)) if front else None  # type: ignore[attr-defined]
        if holding is not None:
            channel.front_url = holding.url
        runtime = DockerRuntime(
            state_dir=tmp_path / hostname / "runtime", client=docker_client, node=hostname, nvidia_runtime=False
        )
        agent = holder["a"] = Agent(
            client=ControlPlaneClient(live_server.url, timeout=10),
            backend=SimulatedBackend("2xH100-80GB", hostname=hostname, busy_source=runtime.busy_gpus),
            runtime=runtime,
            state=AgentState(tmp_path / hostname / "agent"),
            host=HostCollector(hostname=hostname),
            join_token=join_token,
            interval=0.5,
            commands=channel,
        )
        thread = threading.Thread(target=agent.run, name=f"agent-{hostname}", daemon=True)
        thread.start()
        started.append((agent, thread, channel, hostname, holding))
        server = wait_for(
            lambda: Server.objects.filter(hostname=hostname, gpus__isnull=False).first(), what="enrollment"
        )
        Server.objects.filter(pk=server.pk).update(state=ServerState.READY, heartbeat_interval_s=heartbeat_s)
        wait_for(lambda: Server.objects.get(pk=server.pk).facts.get("command_url"), what="the command URL")
        return {"server": server, "hostname": hostname, "front": holding}

    yield start
    for agent, thread, channel, hostname, holding in started:
        agent.stop()
        thread.join(timeout=10)
        channel.close()
        if holding is not None:
            holding.close()
        for container in containers(docker_client, hostname):
            container.remove(force=True)


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=2)
def test_redis_down_across_a_window_opening_launches_by_heartbeat_and_nothing_doubles_when_it_returns(
    broker, node, docker_client, caplog
):
    caplog.set_level(logging.WARNING, logger=DISPATCH_LOG)
    worker = broker.worker()
    worker.wait_ready()
    n = node(heartbeat_s=1.0)
    owner = get_user_model().objects.create_user("owner", password="x")
    proj = project(owner=owner)

    broker.redis.stop()  # the outage: nothing can be queued from here on

    start = timezone.now() + timedelta(seconds=4)
    api = APIClient()
    api.force_authenticate(owner)
    response = api.post(
        "/api/v1/reservations/",
        {
            "project": proj.slug,
            "name": "through-an-outage",
            "spec": {"min_memory_mib": 1024, "gpu_count": 1},
            "window": {"start": start.isoformat(), "end": (start + timedelta(seconds=14)).isoformat()},
            "container": {
                "image": DEFAULT_TAG,
                "command": ["sh", "-c", 'trap "exit 0" TERM; while true; do sleep 0.1; done'],
            },
        },
        format="json",
    )
    assert response.status_code == 201, response.data  # the booking commits; the broker is not its business
    r = Reservation.objects.get(public_id=response.data["id"])
    assert f"could not enqueue the opening of reservation {r.pk}" in caplog.text

    # The window opens and the container starts with no broker at all: the server's own heartbeat opened the
    # window (its push could not be queued) and its reply carried the launch.
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING, what="running")
    launch = Launch.objects.get(reservation=r)
    assert f"could not enqueue the push of launch {launch.launch_id}" in caplog.text
    assert (launch.pushed_at, launch.push_attempts) == (None, 0)
    [container] = containers(docker_client, n["hostname"])
    started_at = container.attrs["State"]["StartedAt"]

    broker.redis.start()  # the same address, empty, as a restarted Redis without persistence
    # A publish that failed less than RETRY_AFTER_S ago makes the next one skip the broker at once (by design):
    # let that window pass, as any later push would.
    time.sleep(broker_module.RETRY_AFTER_S + 0.1)

    # The worker reconnects by itself and a late push of the same launch (a retry, a re-push after a change)
    # reaches the agent: it meets the running container and makes no second one.
    publish_once(tasks.push_launch, args=[launch.launch_id])
    wait_for(
        lambda: Launch.objects.get(pk=launch.pk).pushed_at is not None,
        timeout=30,
        what=f"the worker's push after Redis returned\n{broker.logs()}",
    )
    [same] = containers(docker_client, n["hostname"])
    same.reload()
    assert (same.id, same.attrs["State"]["StartedAt"]) == (container.id, started_at)

    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.COMPLETED, timeout=30, what="done")
    launch.refresh_from_db()
    assert (launch.state, launch.exit_code, launch.container_id) == ("exited", 0, container.id)
    assert Launch.objects.filter(reservation=r).count() == 1


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=2)
def test_worker_killed_mid_push_is_redelivered_to_the_next_worker_and_launches_once(broker, node, docker_client):
    first = broker.worker()
    first.wait_ready()
    n = node(front=True, heartbeat_s=1.0)
    front: HoldingFront = n["front"]

    r = book_now(project(), seconds=12, gpus=1)  # queues open_reservation; opening queues push_launch
    assert front.first_seen.wait(20), f"no push reached the agent's front\n{broker.logs()}"
    launch = Launch.objects.get(reservation=r)
    assert launch.launch_id.encode() in front.bodies[0]

    first.kill()  # SIGKILL while its push_launch waits for the agent's answer
    assert front.first_closed.wait(10)
    # acks_late: the message the dead worker was running is still in Redis, delivered and not acknowledged.
    [held] = broker.unacked()
    message = json.loads(held)[0]
    task_id = message["headers"]["id"]
    assert message["headers"]["task"] == "controlplane.dispatch.tasks.push_launch"
    assert launch.launch_id.encode() in base64.b64decode(message["body"])
    assert Launch.objects.get(pk=launch.pk).pushed_at is None

    second = broker.worker()  # after the visibility timeout its sweep puts the message back, and it runs it
    wait_for(
        lambda: Launch.objects.get(pk=launch.pk).pushed_at is not None,
        timeout=30,
        what=f"the redelivered push\n{broker.logs()}",
    )
    assert len(front.bodies) == 2 and launch.launch_id.encode() in front.bodies[1]
    assert Launch.objects.get(pk=launch.pk).push_attempts == 2
    # The same message (same task id), not a new one: the second worker ran what the first was killed in.
    assert f"push_launch[{task_id}] succeeded" in second.log()
    assert f"push_launch[{task_id}] received" in first.log() and f"push_launch[{task_id}] succeeded" not in first.log()
    assert broker.unacked() == []

    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING, what="running")
    [container] = containers(docker_client, n["hostname"])
    assert container.labels[LABEL_LAUNCH] == launch.launch_id
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.COMPLETED, timeout=30, what="done")
    launch.refresh_from_db()
    assert (launch.state, launch.exit_code) == ("exited", 0)
    assert len(containers(docker_client, n["hostname"])) <= 1
    assert Launch.objects.filter(reservation=r).count() == 1
