"""A real gateway in front of real containers: ``DockerRuntime.reconcile`` launches them (the agent's own path),
the gateway listens on 127.0.0.1:0, and Debian's OpenSSH client connects with keys made by ssh-keygen.

The standard world (``world``, one per test module) holds five reservations on one node label:
``res-a`` (running; alice and bob hold keys), ``res-b`` (another project's, running; carol's key), ``res-c``
(its window opens in an hour), ``res-d`` (its window closed an hour ago) and ``res-f`` (window open, but its
container was never started). Every container carrying the node label is removed at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from nodeagent import schema
from nodeagent.gateway import SshGateway
from nodeagent.runtime.containers import LABEL_LAUNCH, LABEL_NODE
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

from .support import FakeClock, Keypair, OpenSsh, keygen, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.faults]

GPUS_A = ["GPU-aaaa1111-0001", "GPU-aaaa2222-0002"]
# A web page on the container's loopback only: the container runs on ``network: none``.
SERVE_AND_SLEEP = [
    "sh", "-c",
    "mkdir -p /www && echo hello-from-container > /www/index.html && httpd -p 127.0.0.1:8888 -h /www "
    "&& exec sleep 3600",
]  # fmt: skip


@dataclass
class World:
    node: str
    directory: Path
    client: Any
    runtime: DockerRuntime
    clock: FakeClock
    keys: dict[str, Keypair]
    specs: dict[str, schema.DesiredContainer]
    gateway: SshGateway | None = None
    ssh: OpenSsh | None = None
    events: list[schema.AgentEvent] = field(default_factory=list)

    def start_gateway(self, **kwargs: Any) -> SshGateway:
        kwargs.setdefault("tick_s", 0.1)
        gateway = SshGateway(
            state_dir=self.directory / "agent-state",
            node=self.node,
            docker_client=self.client,
            bind=("127.0.0.1", 0),
            address="127.0.0.1",
            clock=self.clock,
            on_session=self.events.append,
            **kwargs,
        )
        gateway.start()
        gateway.update(list(self.specs.values()), [], self.clock())
        self.gateway = gateway
        self.ssh = OpenSsh(port=gateway.port, host_key_line=gateway.host_key_line, directory=self.directory)
        return gateway

    def container(self, reservation: str) -> Any:
        launch_id = self.specs[reservation].launch_id
        [found] = self.client.containers.list(
            filters={"label": [f"{LABEL_LAUNCH}={launch_id}", f"{LABEL_NODE}={self.node}"]}
        )
        return found

    def sessions(self, phase: str | None = None) -> list[schema.SessionInfo]:
        return [e.session for e in list(self.events) if e.session is not None and phase in (None, e.session.phase)]


def make_spec(name: str, clock: FakeClock, **overrides: Any) -> schema.DesiredContainer:
    values: dict[str, Any] = {
        "launch_id": f"launch-{name}-{uuid.uuid4().hex[:6]}",
        "reservation": f"res-{name}",
        "project": "proj-a",
        "image": DEFAULT_TAG,
        "command": SERVE_AND_SLEEP,
        "gpu_uuids": [f"GPU-{name}-{uuid.uuid4().hex[:8]}"],
        "window_start": clock() - timedelta(minutes=1),
        "window_end": clock() + timedelta(hours=1),
        "stop_grace_s": 1,
    }
    values.update(overrides)
    return schema.DesiredContainer(**values)


@pytest.fixture(scope="session")
def busybox_image(docker_client) -> str:  # type: ignore[no-untyped-def]
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    return DEFAULT_TAG


@pytest.fixture(scope="module")
def make_world(docker_client, busybox_image, tmp_path_factory) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """Build a world from specs: launch the ``running`` ones, tell the gateway about all of them."""
    made: list[World] = []

    def make(build: Any, *, running: list[str], key_names: tuple[str, ...] = ("alice", "bob", "carol", "mallory")):
        directory = tmp_path_factory.mktemp("gateway")
        node = f"test-gw-{uuid.uuid4().hex[:10]}"
        clock = FakeClock()
        keys = {name: keygen(directory, name) for name in key_names}
        specs = build(clock, keys)
        runtime = DockerRuntime(
            state_dir=directory / "agent-state", client=docker_client, node=node, nvidia_runtime=False
        )
        world = World(node=node, directory=directory, client=docker_client, runtime=runtime, clock=clock, keys=keys,
                      specs=specs)  # fmt: skip
        made.append(world)
        runtime.reconcile([specs[name] for name in running], [], clock())
        for name in running:
            wait_for(lambda name=name: world.container(name).status == "running", what=f"{name} running")
        world.start_gateway()
        return world

    yield make
    for world in made:
        if world.gateway is not None:
            world.gateway.close()
        world.runtime.close()
        for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={world.node}"}):
            container.remove(force=True)


def standard_specs(clock: FakeClock, keys: dict[str, Keypair]) -> dict[str, schema.DesiredContainer]:
    team = [keys["alice"].authorized("alice"), keys["bob"].authorized("bob")]
    hour = timedelta(hours=1)
    return {
        "a": make_spec("a", clock, gpu_uuids=GPUS_A, ssh_keys=team),
        "b": make_spec("b", clock, project="proj-b", ssh_keys=[keys["carol"].authorized("carol")]),
        "c": make_spec("c", clock, ssh_keys=team, window_start=clock() + hour, window_end=clock() + 2 * hour),
        "d": make_spec("d", clock, ssh_keys=team, window_start=clock() - 2 * hour, window_end=clock() - hour),
        "f": make_spec("f", clock, ssh_keys=team),
    }


@pytest.fixture(scope="module")
def world(make_world) -> World:  # type: ignore[no-untyped-def]
    return make_world(standard_specs, running=["a", "b"])  # type: ignore[no-any-return]
