"""The agent and its SSH gateway: the desired state from a heartbeat reply opens the door (after the runtime
launched the container), the gateway's facts ride on the heartbeat, and session events reach the control plane
through the agent's buffer although the gateway reports them from its own thread."""

from __future__ import annotations

import subprocess
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from control_plane_double import ControlPlaneDouble, FakeClock

from nodeagent import schema
from nodeagent.agent import Agent, AgentState
from nodeagent.backends.simulated import SimulatedBackend
from nodeagent.client import ControlPlaneClient
from nodeagent.collectors import HostCollector


def keygen(directory: Path) -> tuple[Path, str]:
    path = directory / "id_tenant"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path, " ".join(path.with_suffix(".pub").read_text().split()[:2])


@pytest.mark.docker
@pytest.mark.faults
def test_a_converged_reservation_is_reachable_and_its_sessions_are_reported(  # type: ignore[no-untyped-def]
    control_plane: ControlPlaneDouble, clock: FakeClock, tmp_path: Path, docker_client
):
    from nodeagent.gateway import SshGateway
    from nodeagent.runtime.containers import LABEL_NODE
    from nodeagent.runtime.docker import DockerRuntime
    from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

    ensure_busybox_image(docker_client, DEFAULT_TAG)
    node = f"test-agw-{uuid.uuid4().hex[:8]}"
    key_path, public = keygen(tmp_path)
    runtime = DockerRuntime(state_dir=tmp_path / "state", client=docker_client, node=node, nvidia_runtime=False)
    gateway = SshGateway(state_dir=tmp_path / "state", node=node, docker_client=docker_client,
                         bind=("127.0.0.1", 0), address="127.0.0.1", clock=clock.now, tick_s=0.1)  # fmt: skip
    agent = Agent(
        client=ControlPlaneClient(control_plane.url, timeout=5),
        backend=SimulatedBackend("1xH100-80GB", hostname=node, seed=1, busy_source=runtime.busy_gpus),
        runtime=runtime,
        state=AgentState(tmp_path / "state"),
        host=HostCollector(hostname=node),
        join_token="join-token-123",
        clock=clock,
        gateway=gateway,
    )
    gateway.on_session = agent.post_event
    gateway.start()
    spec = schema.DesiredContainer(
        launch_id="launch-gw", reservation="res-gw", project="p", image=DEFAULT_TAG, command=["sleep", "600"],
        gpu_uuids=[agent.gpus.facts(clock.now())[0].uuid], window_start=clock.now() - timedelta(minutes=1),
        window_end=clock.now() + timedelta(hours=1),
        ssh_keys=[schema.AuthorizedKey(user="tenant", public_key=public, fingerprint="SHA256:tenant")],
    )  # fmt: skip
    control_plane.desired = [spec.model_dump(mode="json")]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{gateway.port} {gateway.host_key_line}\n")
    ssh = ["ssh", "-p", str(gateway.port), "-i", str(key_path), "-F", "/dev/null", "-o", "BatchMode=yes",
           "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}",
           "res-gw@127.0.0.1"]  # fmt: skip
    try:
        before = subprocess.run([*ssh, "echo in"], capture_output=True, timeout=30, check=False)
        assert b"no reservation res-gw runs on this server" in before.stderr  # not converged yet

        agent.step()  # enroll, heartbeat: the reply launches the container and tells the gateway
        [first] = control_plane.accepted
        assert first["node"]["ssh"] == {"port": gateway.port, "host_key": gateway.host_key_line, "address": "127.0.0.1"}
        inside = subprocess.run([*ssh, "echo $GPUCP_RESERVATION"], capture_output=True, timeout=30, check=False)
        assert inside.stdout == b"res-gw\n", inside.stderr

        clock.advance(agent.interval)
        for _ in range(50):  # the close event comes from the gateway's thread once the client is gone
            agent.step()
            events = [e for e in control_plane.accepted_events() if e["kind"] == "session"]
            if len(events) == 2:
                break
            clock.advance(agent.interval)
        opened, closed = (e["session"] for e in events)
        assert (opened["phase"], closed["phase"]) == ("open", "close")
        assert opened["user"] == "tenant" and opened["session_id"] == closed["session_id"]
        assert closed["kinds"] == ["exec"] and closed["reason"] == "client disconnected"
        assert all(e["reservation"] == "res-gw" for e in events)
    finally:
        gateway.close()
        runtime.close()
        for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={node}"}):
            container.remove(force=True)


@pytest.mark.parametrize("value", ["nope", "127.0.0.1:x", "127.0.0.1:70000"])
def test_a_bad_ssh_listen_address_stops_the_agent_with_a_message(value, capsys, tmp_path):  # type: ignore[no-untyped-def]
    from nodeagent.__main__ import main

    assert main(["run", "--server", "http://127.0.0.1:9", "--state-dir", str(tmp_path), "--ssh-listen", value]) == 2
    assert "--ssh-listen" in capsys.readouterr().err
