"""Real agents for end-to-end tests: an Agent + DockerRuntime + SSH gateway + volume store per node, simulated
GPUs, in threads talking HTTP to pytest-django's live server; and a tenant with a token, a key pair and gpucp's
own config directory. Shared by the SSH and the web proxy tests."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from tests.factories import ApiTokenFactory
from tests.runtime import support

wait_for = functools.partial(support.wait_for, timeout=30.0, interval=0.1)
GPUCP = str(Path(os.environ.get("VIRTUAL_ENV") or Path(__file__).resolve().parents[2] / ".venv") / "bin" / "gpucp")


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


def start_nodes(live_server: Any, docker_client: Any, tmp_path: Path, count: int = 2) -> Iterator[list[Node]]:
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    seed_catalog()  # so discovery files the simulated H100s under H100-80GB, as in the demo
    root = tmp_path / "volumes"
    root.mkdir()
    made: list[Node] = []
    try:
        for name in "abcdefgh"[:count]:
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
    return Reservation.objects.get(public_id=json.loads(result.stdout)["id"])


def running(r: Reservation) -> Reservation:
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == ReservationState.RUNNING, what="running")
    wait_for(lambda: Launch.objects.filter(reservation=r, state="running").exists(), what="the launch reported running")
    return Reservation.objects.get(pk=r.pk)
