"""Into a rented GPU, the whole road: a tenant's key registered through the API, a booking, two real agents
(Agent + DockerRuntime + SSH gateway + volume store, simulated GPUs) in threads talking HTTP to the live
server, and the installed `gpucp` and Debian's OpenSSH client as processes.

Covers what a tenant does (issue 11's proof): `gpucp ssh` writes the host key and gets a shell that sees
exactly the reservation's GPUs, passes exit codes back, is recorded as a session event; a viewer's key is
refused; and a file written to /workspace in one reservation is read by a later one on the other server,
which shares the volume root.
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.celery import app as celery_app
from controlplane.dispatch.models import Launch
from controlplane.fleet import services as fleet
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Server
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from controlplane.system.management.demo import seed_catalog
from nodeagent.agent import Agent, AgentState
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.client import ControlPlaneClient
from nodeagent.collectors import HostCollector
from nodeagent.gateway import SshGateway
from nodeagent.runtime.containers import LABEL_NODE
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image
from nodeagent.volumes import VolumeStore
from tests.factories import ApiTokenFactory, UserFactory
from tests.reservations.fleet import project
from tests.runtime import support

pytestmark = [pytest.mark.docker, pytest.mark.faults, pytest.mark.django_db(transaction=True)]

wait_for = functools.partial(support.wait_for, timeout=30.0, interval=0.1)
GPUCP = str(Path(os.environ.get("VIRTUAL_ENV") or Path(__file__).resolve().parents[2] / ".venv") / "bin" / "gpucp")


@pytest.fixture
def eager_celery() -> Iterator[None]:
    before = celery_app.conf.task_always_eager
    celery_app.conf.update(task_always_eager=True, CELERY_TASK_ALWAYS_EAGER=True)
    yield
    celery_app.conf.update(task_always_eager=before, CELERY_TASK_ALWAYS_EAGER=before)


class Node:
    def __init__(self, *, url: str, docker_client: Any, directory: Path, volume_root: Path) -> None:
        self.hostname = f"e2e-ssh-{uuid.uuid4().hex[:8]}"
        _, join_token = fleet.join_token_create(actor=None, note="e2e ssh")
        self.runtime_volumes = VolumeStore(volume_root, measure_interval_s=5.0)
        self.runtime = DockerRuntime(
            state_dir=directory / "runtime",
            client=docker_client,
            node=self.hostname,
            nvidia_runtime=False,
            volumes=self.runtime_volumes,
        )
        self.gateway = SshGateway(
            state_dir=directory / "agent",
            node=self.hostname,
            docker_client=docker_client,
            bind=("127.0.0.1", 0),
            address="127.0.0.1",
            tick_s=0.2,
        )
        self.gateway.start()
        backend = SimulatedBackend("1xH100-80GB", hostname=self.hostname, busy_source=self.runtime.busy_gpus)
        self.agent = Agent(
            client=ControlPlaneClient(url, timeout=10),
            backend=backend,
            runtime=self.runtime,
            state=AgentState(directory / "agent"),
            host=HostCollector(hostname=self.hostname),
            join_token=join_token,
            interval=0.5,
            gateway=self.gateway,
            volumes=self.runtime_volumes,
        )
        self.gateway.on_session = self.agent.post_event
        self.runtime_volumes.start()
        self.thread = threading.Thread(target=self.agent.run, name=self.hostname, daemon=True)
        self.thread.start()
        self.server = wait_for(
            lambda: Server.objects.filter(hostname=self.hostname, gpus__isnull=False).first(), what="enrollment"
        )
        Server.objects.filter(pk=self.server.pk).update(state=ServerState.READY, heartbeat_interval_s=0.5)

    def close(self, docker_client: Any) -> None:
        self.agent.stop()
        self.thread.join(timeout=10)
        self.gateway.close()
        self.runtime_volumes.close()
        for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={self.hostname}"}):
            container.remove(force=True)


@pytest.fixture
def nodes(transactional_db, live_server, docker_client, tmp_path: Path, eager_celery) -> Iterator[list[Node]]:  # type: ignore[no-untyped-def]
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    seed_catalog()  # so discovery files the simulated H100s under H100-80GB, as in the demo
    root = tmp_path / "volumes"
    root.mkdir()
    made: list[Node] = []
    try:
        for name in ("a", "b"):
            made.append(
                Node(url=live_server.url, docker_client=docker_client, directory=tmp_path / name, volume_root=root)
            )
        yield made
    finally:
        for node in made:
            node.close(docker_client)


class Tenant:
    """A user with a token, a key pair made by ssh-keygen, and gpucp's own config directory."""

    def __init__(self, directory: Path, url: str, user: Any) -> None:
        self.user = user
        self.url = url
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = directory / "id_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", user.username, "-f", str(self.key)], check=True
        )
        self.token = ApiTokenFactory(user=user).plaintext
        self.env = {
            **os.environ,
            "GPUCP_SERVER": url,
            "GPUCP_TOKEN": self.token,
            "XDG_CONFIG_HOME": str(directory / "config"),
            "HOME": str(directory),
        }

    def gpucp(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [GPUCP, *args], env=self.env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    def ssh(self, reservation: Reservation, *command: str) -> subprocess.CompletedProcess[str]:
        # As with any ssh, the words of the command are joined by spaces and run by the container's shell.
        return self.gpucp("ssh", "-i", str(self.key), "-o", "BatchMode=yes", str(reservation.public_id), "--", *command)


def book(tenant: Tenant, *, slug: str, minutes: float = 10, extra: tuple[str, ...] = ()) -> Reservation:
    result = tenant.gpucp(
        "--json", "book", "--project", slug, "--model", "H100-80GB", "--hours", str(minutes / 60),
        "--image", DEFAULT_TAG, *extra, "--", "sleep", "3600",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    import json

    return Reservation.objects.get(public_id=json.loads(result.stdout)["id"])


def running(r: Reservation) -> Reservation:
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING, what="running")
    wait_for(lambda: Launch.objects.filter(reservation=r, state="running").exists(), what="the launch reported running")
    return Reservation.objects.get(pk=r.pk)


@pytest.fixture
def team(nodes: list[Node], live_server: Any, tmp_path: Path) -> dict[str, Any]:
    owner, viewer, outsider = UserFactory(username="alice"), UserFactory(username="vera"), UserFactory(username="otto")
    proj = project(owner=owner, viewer=viewer, slug="demo")
    project(owner=outsider, slug="elsewhere")
    people = {name: Tenant(tmp_path / name, live_server.url, user) for name, user in
              (("alice", owner), ("vera", viewer), ("otto", outsider))}  # fmt: skip
    for tenant in people.values():
        added = tenant.gpucp("keys", "add", str(tenant.key) + ".pub")
        assert added.returncode == 0, added.stderr
    return {"project": proj, **people}


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=1)
def test_gpucp_ssh_reaches_exactly_the_reservations_gpus_and_is_recorded(team: dict[str, Any]) -> None:
    alice, vera, otto = team["alice"], team["vera"], team["otto"]
    r = running(book(alice, slug="demo"))
    launch = Launch.objects.get(reservation=r, state="running")

    shown = alice.ssh(r, 'echo "gpus=$NVIDIA_VISIBLE_DEVICES"; tr "\\0" " " < /proc/1/cmdline')
    assert shown.returncode == 0, shown.stderr
    assert f"gpus={','.join(launch.gpu_uuids)}\n" in shown.stdout
    assert shown.stdout.rstrip().endswith("sleep 3600")  # the container's init, not the host's
    known = Path(alice.env["XDG_CONFIG_HOME"]) / "gpucp" / "known_hosts"
    assert known.read_text().strip().endswith(launch.server.facts["ssh"]["host_key"])

    assert alice.ssh(r, "exit 7").returncode == 7

    # A viewer's key is refused with the gateway's one-line reason; another tenant does not even get the access
    # block, and its key is refused at the gateway all the same.
    refused = vera.ssh(r, "true")
    assert refused.returncode == 255 and "is not authorized for reservation" in refused.stderr
    assert otto.gpucp("ssh", "--print", str(r.public_id)).returncode == 4
    port = str(launch.server.facts["ssh"]["port"])
    direct = subprocess.run(
        ["ssh", "-p", port, "-i", str(otto.key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
         "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", f"{r.public_id}@127.0.0.1", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert direct.returncode == 255 and "is not authorized for reservation" in direct.stderr

    # Each session is an event on the reservation: who, which key, from where.
    fingerprint = alice.gpucp("--json", "keys", "ls")
    events = wait_for(
        lambda: list(Reservation.objects.get(pk=r.pk).events.filter(data__kind="ssh_session", data__phase="close")),
        what="the session events",
    )
    assert events[0].data["user"] == "alice"
    assert events[0].data["fingerprint"] in fingerprint.stdout
    assert events[0].data["source"].startswith("127.0.0.1:")


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=1)
def test_a_volume_written_on_one_server_is_read_on_the_other(team: dict[str, Any], nodes: list[Node]) -> None:
    alice = team["alice"]
    created = alice.gpucp("volumes", "create", "data", "--size-gib", "1", "--project", "demo")
    assert created.returncode == 0, created.stderr + created.stdout

    first = running(book(alice, slug="demo", extra=("--volume", "data")))
    assert alice.ssh(first, "echo written-by-the-first > /workspace/note.txt").returncode == 0
    first_server = Launch.objects.get(reservation=first, state="running").server
    assert alice.gpucp("cancel", str(first.public_id)).returncode == 0
    wait_for(lambda: Reservation.objects.get(pk=first.pk).state in ("completed", "cancelled"), what="the first ended")
    # The next one must land on the other server: the first one's is drained.
    Server.objects.filter(pk=first_server.pk).update(state=ServerState.DRAINING)

    second = running(book(alice, slug="demo", extra=("--volume", "data")))
    assert Launch.objects.get(reservation=second, state="running").server_id != first_server.pk
    read = alice.ssh(second, "cat", "/workspace/note.txt")
    assert (read.returncode, read.stdout) == (0, "written-by-the-first\n")


@override_settings(DISPATCH_WARN_BEFORE_S=6, DISPATCH_STOP_GRACE_S=1)
def test_an_open_session_is_warned_and_closed_when_the_window_ends(team: dict[str, Any]) -> None:
    alice = team["alice"]
    r = running(book(alice, slug="demo", minutes=0.25))  # a 15 s window
    remaining = (Reservation.objects.get(pk=r.pk).ends_at - timezone.now()).total_seconds()
    assert remaining > 6, "the window must still be open past the warning"
    session = alice.ssh(r, "sleep", "120")  # blocks until the gateway closes it
    assert session.returncode != 0
    assert "ends in" in session.stderr or "ends in" in session.stdout
    assert timezone.now() >= Reservation.objects.get(pk=r.pk).ends_at - timedelta(seconds=1)
