"""A container's network on a real Docker engine: loopback only by default, the operator's network for
egress, and a refusal (with the reason) when that network is missing or is the host's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from nodeagent import schema
from nodeagent.runtime.docker import DockerRuntime

from .support import T0, ours, wait_for

pytestmark = pytest.mark.docker


@pytest.fixture
def egress_network(docker_client) -> Iterator[str]:  # type: ignore[no-untyped-def]
    name = f"gpucp-test-egress-{uuid.uuid4().hex[:10]}"
    network = docker_client.networks.create(name, driver="bridge")
    yield name
    network.reload()
    for container in network.containers:  # only this test's: the name is unique
        container.remove(force=True)
    network.remove()


def run_to_the_end(runtime: DockerRuntime, spec: schema.DesiredContainer) -> schema.ContainerReport:
    runtime.reconcile([spec], [], T0)
    runtime.wait_idle(30)

    def finished() -> schema.ContainerReport | None:
        runtime.reconcile([spec], [], T0)
        [report] = [r for r in runtime.report() if r.launch_id == spec.launch_id]
        return report if report.state in ("exited", "failed") else None

    return wait_for(finished, what=f"{spec.launch_id} to finish")


def interfaces(report: schema.ContainerReport) -> list[str]:
    assert (report.state, report.exit_code) == ("exited", 0), report
    assert report.log_tail is not None
    return sorted(report.log_tail.split())


def test_network_none_has_only_loopback(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["ls", "/sys/class/net"])
    assert spec.network == "none"

    report = run_to_the_end(runtime, spec)

    assert interfaces(report) == ["lo"]
    [container] = ours(docker_client, node)
    assert container.attrs["HostConfig"]["NetworkMode"] == "none"


def test_egress_joins_the_operators_network(make_runtime, make_desired, docker_client, node, egress_network):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["ls", "/sys/class/net"], network="egress", network_name=egress_network)

    report = run_to_the_end(runtime, spec)

    names = interfaces(report)
    assert "lo" in names and len(names) == 2, names
    [container] = ours(docker_client, node)
    assert container.attrs["HostConfig"]["NetworkMode"] == egress_network
    assert set(container.attrs["NetworkSettings"]["Networks"]) == {egress_network}


def test_a_missing_network_refuses_the_launch(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    missing = f"gpucp-test-absent-{uuid.uuid4().hex[:10]}"
    spec = make_desired(network="egress", network_name=missing)

    report = run_to_the_end(runtime, spec)

    assert report.state == "failed"
    assert report.error == (
        f"the egress network {missing} does not exist on this node's Docker engine; "
        f"an operator creates it (docker network create {missing})"
    )
    assert ours(docker_client, node) == []


def test_the_hosts_network_is_never_an_egress_network(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()

    report = run_to_the_end(runtime, make_desired(network="egress", network_name="host"))

    assert report.state == "failed"
    assert report.error == "the network host (driver host) cannot be a project's egress network"
    assert ours(docker_client, node) == []
