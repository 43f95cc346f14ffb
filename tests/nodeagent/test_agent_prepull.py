"""Pre-pulls on the agent, against the real engine and the real registry, with a control plane double on a real
socket: the reply's ``prepull`` is pulled in the background, its ``ImageReport`` rides on the heartbeats until one is
answered, the image is on the node before the window, and the container starts at the window without a pull. A
pre-pull with wrong credentials reports the registry's refusal, and the password goes nowhere."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from control_plane_double import ControlPlaneDouble, FakeClock

from nodeagent import schema
from nodeagent.agent import Agent, AgentState
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.client import Backoff, ControlPlaneClient
from nodeagent.collectors import HostCollector
from tests.runtime.image_support import push_distinct, remove_repository, unique
from tests.runtime.support import wait_for

pytestmark = pytest.mark.docker

GPU = "GPU-00000000-0000-0000-0000-000000000001"


@pytest.fixture
def runtime(docker_client, tmp_path: Path) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    from nodeagent.runtime.containers import LABEL_NODE
    from nodeagent.runtime.docker import DockerRuntime
    from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

    ensure_busybox_image(docker_client, DEFAULT_TAG)
    node = f"test-{uuid.uuid4().hex[:10]}"
    made = DockerRuntime(state_dir=tmp_path / "state", client=docker_client, node=node, nvidia_runtime=False)
    yield made
    made.close()
    for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={node}"}):
        container.remove(force=True)


@pytest.fixture
def pushed(docker_client, oci_registry) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    repository = unique("team/prepull")
    image, digest = push_distinct(docker_client, oci_registry, "gpucp-busybox:test", repository)
    yield image, digest
    remove_repository(docker_client, f"{oci_registry.host}/{repository}")


def make_agent(control_plane: ControlPlaneDouble, clock: FakeClock, tmp_path: Path, runtime: Any) -> Agent:
    return Agent(
        client=ControlPlaneClient(control_plane.url, timeout=5),
        backend=SimulatedBackend("1xH100-80GB", hostname="node-a", seed=1, busy_source=runtime.busy_gpus),
        runtime=runtime,
        state=AgentState(tmp_path / "agent"),
        host=HostCollector(hostname="node-a"),
        join_token="join-token-123",
        clock=clock,
        backoff=Backoff(base_s=1, cap_s=8, rng=lambda: 1.0),
    )


def images_of(heartbeat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["image"]: item for item in heartbeat.get("images", [])}


def test_a_prepulled_image_is_on_the_node_before_the_window_and_starts_there_without_a_pull(  # type: ignore[no-untyped-def]
    control_plane, clock, tmp_path, runtime, docker_client, oci_registry, pushed, caplog
):
    caplog.set_level(logging.DEBUG)
    image, digest = pushed
    auth = {"registry": oci_registry.host, "username": "reader", "password": "reader-pw"}
    window = clock.now() + timedelta(minutes=30)
    control_plane.prepull = [
        {"image": image, "registry_auth": auth, "reservations": ["res-pre"], "needed_at": window.isoformat()}
    ]
    agent = make_agent(control_plane, clock, tmp_path, runtime)

    agent.step()
    [first] = control_plane.accepted
    assert first["node"]["pulls"] is True and "image_cache_bytes" not in first["node"]
    assert agent.prepuller is not None
    wait_for(lambda: agent.prepuller.state(image) == "present", timeout=60, what="the pre-pull")
    assert docker_client.images.get(image).id  # on the node, half an hour before the window

    clock.advance(5)
    agent.step()
    report = images_of(control_plane.accepted[-1])[image]
    assert (report["state"], report["digest"], report["reservations"]) == ("present", digest, ["res-pre"])
    clock.advance(5)
    agent.step()
    assert image not in images_of(control_plane.accepted[-1])  # answered once: not sent again

    # The window comes: the control plane sends the launch ahead of it; the image is already here.
    clock.advance(30 * 60 - 20)
    control_plane.prepull = []
    control_plane.desired = [
        schema.DesiredContainer(
            launch_id="launch-pre",
            reservation="res-pre",
            project="proj-a",
            image=image,
            command=["sleep", "120"],
            gpu_uuids=[GPU],
            window_start=window,
            window_end=window + timedelta(hours=1),
            registry_auth=schema.RegistryAuth(**auth),
        ).model_dump(mode="json")
    ]
    agent.step()  # created ahead of the window
    assert runtime.wait_idle(60)
    [ahead] = [c for c in agent.runtime.report() if c.launch_id == "launch-pre"]
    assert ahead.state == "pending" and ahead.pull is None

    clock.advance(20)  # the window opens
    started = time.monotonic()
    while True:
        agent.step()
        [now] = [c for c in agent.runtime.report() if c.launch_id == "launch-pre"]
        if now.state == "running" or time.monotonic() - started > 5:
            break
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    assert now.state == "running" and elapsed < 1.0, (now.state, elapsed)
    assert now.image_digest == digest and now.pull is None
    # No pull for the launch: the board's record of the image is the pre-pull's, "present" since.
    board = runtime.images.board.get(image)
    assert board is not None and board.state == "present" and board.reservations == ["res-pre"]
    states = [images_of(r.body)[image]["state"] for r in control_plane.received if image in images_of(r.body)]
    assert "present" in states and "pulling" not in states[states.index("present") :]
    sent = json.dumps([r.body for r in control_plane.received])
    assert "reader-pw" not in sent and "reader-pw" not in caplog.text


def test_a_prepull_with_wrong_credentials_reports_unauthorized_until_a_heartbeat_is_answered(  # type: ignore[no-untyped-def]
    control_plane, clock, tmp_path, runtime, docker_client, oci_registry, pushed, caplog
):
    caplog.set_level(logging.DEBUG)
    image, _ = pushed
    password = "wrong-" + uuid.uuid4().hex
    control_plane.prepull = [
        {
            "image": image,
            "registry_auth": {"registry": oci_registry.host, "username": "reader", "password": password},
            "reservations": ["res-bad"],
            "needed_at": (clock.now() + timedelta(minutes=30)).isoformat(),
        }
    ]
    agent = make_agent(control_plane, clock, tmp_path, runtime)
    agent.step()
    assert agent.prepuller is not None
    wait_for(lambda: agent.prepuller.state(image) == "failed", timeout=60, what="the pre-pull to fail")

    control_plane.fail(1)  # this heartbeat is not answered: the report must go again
    clock.advance(5)
    agent.step()
    refused = images_of(control_plane.received[-1].body)[image]
    assert refused["state"] == "failed" and refused["error"].startswith("unauthorized:")
    clock.advance(1)
    agent.step()
    again = images_of(control_plane.accepted[-1])[image]
    assert again["state"] == "failed" and again["reservations"] == ["res-bad"]
    clock.advance(5)
    agent.step()
    assert image not in images_of(control_plane.accepted[-1])

    sent = json.dumps([r.body for r in control_plane.received])
    assert password not in sent and password not in caplog.text
    # A pre-pull's credentials are held in memory only: nothing the agent wrote holds them.
    for path in Path(tmp_path).rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path
