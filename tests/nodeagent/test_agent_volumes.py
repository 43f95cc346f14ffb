"""Volume usage on the agent's heartbeats, against a control plane double on a real socket: reported, resent
after a heartbeat that was not answered, and taken off the queue only once one is."""

from __future__ import annotations

import os
import time
import uuid
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
from nodeagent.runtime.base import ContainerRuntime, NullRuntime
from nodeagent.volumes import VolumeStore

MiB = 1024 * 1024


def make_agent(
    control_plane: ControlPlaneDouble,
    clock: FakeClock,
    tmp_path: Path,
    *,
    volumes: VolumeStore | None,
    runtime: ContainerRuntime | None = None,
) -> Agent:
    runtime = runtime or NullRuntime()
    return Agent(
        client=ControlPlaneClient(control_plane.url, timeout=5),
        backend=SimulatedBackend("1xH100-80GB", hostname="node-a", seed=1, busy_source=runtime.busy_gpus),
        runtime=runtime,
        state=AgentState(tmp_path / "state"),
        host=HostCollector(hostname="node-a"),
        join_token="join-token-123",
        clock=clock,
        backoff=Backoff(base_s=1, cap_s=8, rng=lambda: 1.0),
        volumes=volumes,
    )


def usage_sent(heartbeat: dict) -> list[tuple[str, str, int]]:  # type: ignore[type-arg]
    return [(u["project"], u["name"], u["used_bytes"]) for u in heartbeat.get("volumes", [])]


def write_volume(root: Path, name: str, size: int) -> None:
    path = root / "proj-a" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "data.bin").write_bytes(os.urandom(size))
    os.sync()


def mount(name: str) -> schema.VolumeMount:
    return schema.VolumeMount(kind="volume", project="proj-a", name=name, path="/workspace")


def desired(clock: FakeClock, *mounts: schema.VolumeMount, **fields) -> schema.DesiredContainer:  # type: ignore[no-untyped-def]
    values: dict[str, Any] = {
        "launch_id": "launch-vol",
        "reservation": "res-vol",
        "project": "proj-a",
        "image": "gpucp-busybox:test",
        "gpu_uuids": ["GPU-00000000-0000-0000-0000-000000000001"],
        "window_start": clock.now(),
        "window_end": clock.now() + timedelta(hours=1),
        "volumes": list(mounts),
    }
    values.update(fields)
    return schema.DesiredContainer(**values)


def test_a_node_with_a_volume_root_says_so_and_one_without_says_nothing(control_plane, clock, tmp_path):  # type: ignore[no-untyped-def]
    root = tmp_path / "storage"
    root.mkdir()
    make_agent(control_plane, clock, tmp_path / "a", volumes=VolumeStore(root, clock=clock.now)).step()
    make_agent(control_plane, clock, tmp_path / "b", volumes=None).step()

    with_root, without = control_plane.accepted
    assert with_root["node"]["volumes"] is True
    assert "volumes" not in without["node"] and "volumes" not in without


def test_usage_is_reported_resent_after_an_unanswered_heartbeat_and_then_not_again(control_plane, clock, tmp_path):  # type: ignore[no-untyped-def]
    root = tmp_path / "storage"
    root.mkdir()
    store = VolumeStore(root, measure_interval_s=60, clock=clock.now)
    write_volume(root, "work", MiB)
    store.track([desired(clock, mount("work"))])
    store.measure_due()
    agent = make_agent(control_plane, clock, tmp_path, volumes=store)

    agent.step()
    [first] = control_plane.accepted
    assert usage_sent(first) == [("proj-a", "work", MiB)]
    assert first["volumes"][0]["measured_at"].startswith("2026-05-01T12:00:00")

    clock.advance(5)
    agent.step()
    assert usage_sent(control_plane.accepted[-1]) == []  # answered once: not sent again

    write_volume(root, "work", 2 * MiB)
    clock.advance(60)
    store.measure_due()
    control_plane.fail(1)  # the control plane does not take this heartbeat
    agent.step()
    failed = control_plane.received[-1].body
    assert usage_sent(failed) == [("proj-a", "work", 2 * MiB)]
    assert len(control_plane.accepted) == 2

    clock.advance(1)  # the backoff
    agent.step()
    assert usage_sent(control_plane.accepted[-1]) == [("proj-a", "work", 2 * MiB)]
    clock.advance(5)
    agent.step()
    assert usage_sent(control_plane.accepted[-1]) == []


@pytest.mark.docker
def test_a_launch_with_a_volume_reports_its_usage_from_the_launch_and_the_periodic_measurement(  # type: ignore[no-untyped-def]
    control_plane, clock, tmp_path, docker_client
):
    from nodeagent.runtime.containers import LABEL_NODE
    from nodeagent.runtime.docker import DockerRuntime
    from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

    ensure_busybox_image(docker_client, DEFAULT_TAG)
    root = tmp_path / "storage"
    root.mkdir()
    node = f"test-agent-vol-{uuid.uuid4().hex[:8]}"
    store = VolumeStore(root, measure_interval_s=60, clock=clock.now)
    runtime = DockerRuntime(
        state_dir=tmp_path / "runtime", client=docker_client, node=node, nvidia_runtime=False, volumes=store
    )
    limited = schema.VolumeMount(kind="volume", project="proj-a", name="work", path="/workspace", limit_bytes=64 * MiB)
    job = desired(clock, limited, command=["dd", "if=/dev/urandom", "of=/workspace/out", "bs=1M", "count=3"])
    control_plane.desired = [job.model_dump(mode="json")]
    agent = make_agent(control_plane, clock, tmp_path, volumes=store, runtime=runtime)
    try:
        agent.step()  # enroll, heartbeat, the reply's launch: created, measured against its limit, started
        runtime.wait_idle(30)
        clock.advance(5)
        agent.step()
        assert usage_sent(control_plane.accepted[-1]) == [("proj-a", "work", 0)]

        deadline = time.monotonic() + 30
        while not any(r.state == "exited" for r in runtime.report()):
            assert time.monotonic() < deadline, runtime.report()
            time.sleep(0.05)
        os.sync()
        clock.advance(60)
        assert store.measure_due() == 1  # what the background thread does every interval
        agent.step()
        assert usage_sent(control_plane.accepted[-1]) == [("proj-a", "work", 3 * MiB)]
    finally:
        runtime.close()
        for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={node}"}):
            container.remove(force=True)


def test_run_with_a_volume_root_that_is_not_there_exits_2_naming_it(control_plane, tmp_path, capsys):  # type: ignore[no-untyped-def]
    from nodeagent.__main__ import main

    missing = tmp_path / "nfs-not-mounted"
    argv = ["run", "--server", control_plane.url, "--runtime", "docker", "--volume-root", str(missing)]
    code = main([*argv, "--no-listen", "--simulate", "1xH100-80GB", "--state-dir", str(tmp_path / "state")])

    assert code == 2
    assert f"the volume root {missing} is not a directory" in capsys.readouterr().err
    assert not missing.exists()
    assert control_plane.received == []
