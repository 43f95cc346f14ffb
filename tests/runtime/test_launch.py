"""Launching on a real Docker engine: the right GPUs, the limits, exactly once, never a GPU twice."""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import pytest

from nodeagent.runtime.containers import (
    LABEL_GPUS,
    LABEL_LAUNCH,
    LABEL_PROJECT,
    LABEL_RESERVATION,
    LABEL_WINDOW_END,
    MOUNT_POINT,
    WARN_FILE,
    container_name,
)
from nodeagent.runtime.docker import DockerRuntime

from .support import T0, logs_of, ours, status_of, wait_for

pytestmark = pytest.mark.docker


def env_of(container) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])


def report_for(runtime: DockerRuntime, launch_id: str):  # type: ignore[no-untyped-def]
    found = [r for r in runtime.report() if r.launch_id == launch_id]
    assert len(found) == 1, found
    return found[0]


def test_launch_binds_its_gpus_by_uuid_with_labels_limits_and_no_privileges(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    cpus = sorted(os.sched_getaffinity(0))
    pinned = str(cpus[-1])
    gpus = ["GPU-11111111-aaaa", "GPU-22222222-bbbb"]
    runtime = make_runtime(
        numa_cpus={"0": str(cpus[0]), "1": pinned},
        gpu_numa={gpus[0]: 1, gpus[1]: 1, "GPU-other": 0},
        default_memory_limit_mib=96,
        default_pids_limit=128,
    )
    spec = make_desired(gpu_uuids=gpus, env={"MY_SETTING": "42"})

    runtime.reconcile([spec], [], T0)

    [container] = ours(docker_client, node)
    assert container.name == container_name(spec.launch_id)
    assert status_of(container) == "running"
    env = env_of(container)
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus)
    assert env["GPUCP_RESERVATION"] == spec.reservation
    assert env["GPUCP_WINDOW_END"] == "2030-01-01T12:10:00Z"
    assert env["GPUCP_WARN_FILE"] == WARN_FILE
    assert env["MY_SETTING"] == "42"
    labels = container.labels
    assert labels[LABEL_LAUNCH] == spec.launch_id
    assert labels[LABEL_RESERVATION] == spec.reservation
    assert labels[LABEL_PROJECT] == "proj-a"
    assert labels[LABEL_GPUS] == ",".join(gpus)
    assert labels[LABEL_WINDOW_END] == "2030-01-01T12:10:00Z"
    host = container.attrs["HostConfig"]
    assert host["Privileged"] is False
    assert host["NetworkMode"] == "none"
    assert host["CpusetCpus"] == pinned
    assert host["Memory"] == 96 * 1024 * 1024
    assert host["PidsLimit"] == 128
    assert "no-new-privileges" in host["SecurityOpt"]
    assert not host.get("DeviceRequests")
    [mount] = [m for m in container.attrs["Mounts"] if m["Destination"] == MOUNT_POINT]
    assert mount["RW"] is False

    report = report_for(runtime, spec.launch_id)
    assert report.state == "running"
    assert report.container_id == container.id
    assert report.gpu_uuids == gpus
    assert report.started_at is not None and report.finished_at is None
    assert runtime.busy_gpus() == set(gpus)


def test_limits_from_the_desired_container_beat_the_runtime_defaults(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime(default_memory_limit_mib=512, default_pids_limit=4096)
    runtime.reconcile([make_desired(memory_limit_mib=64, pids_limit=32)], [], T0)

    [container] = ours(docker_client, node)
    assert container.attrs["HostConfig"]["Memory"] == 64 * 1024 * 1024
    assert container.attrs["HostConfig"]["PidsLimit"] == 32


def test_cpus_are_not_pinned_when_a_gpus_numa_node_is_unknown(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime(numa_cpus={"0": "0"}, gpu_numa={"GPU-known-0": 0})
    runtime.reconcile([make_desired(gpu_uuids=["GPU-known-0", "GPU-unknown"])], [], T0)

    [container] = ours(docker_client, node)
    assert container.attrs["HostConfig"]["CpusetCpus"] == ""


def test_tenant_env_cannot_widen_the_visible_gpus(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(env={"NVIDIA_VISIBLE_DEVICES": "all", "GPUCP_RESERVATION": "someone-else"})
    runtime.reconcile([spec], [], T0)

    [container] = ours(docker_client, node)
    env = env_of(container)
    assert env["NVIDIA_VISIBLE_DEVICES"] == spec.gpu_uuids[0]
    assert env["GPUCP_RESERVATION"] == spec.reservation


def test_job_sees_its_reservation_and_gpus(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired()
    runtime.reconcile([spec], [], T0)

    [container] = ours(docker_client, node)
    wait_for(lambda: "job start" in logs_of(container), what="the job to start")
    assert f"reservation={spec.reservation} gpus={spec.gpu_uuids[0]}" in logs_of(container)


def test_redelivered_launch_keeps_one_container(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired()

    runtime.reconcile([spec], [], T0)
    first = ours(docker_client, node)[0].id
    runtime.reconcile([spec], [], T0 + timedelta(seconds=5))
    runtime.reconcile([spec, spec.model_copy()], [], T0 + timedelta(seconds=10))

    assert [c.id for c in ours(docker_client, node)] == [first]


def test_two_runtimes_racing_on_one_launch_start_one_container(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    # Both runtimes look before either creates, so at least one of them meets Docker's name conflict.
    first, second = make_runtime(), make_runtime()
    spec = make_desired()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(runtime: DockerRuntime) -> None:
        try:
            barrier.wait(timeout=10)
            runtime.reconcile([spec], [], T0)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rt,)) for rt in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert errors == []
    containers = ours(docker_client, node)
    assert len(containers) == 1
    assert status_of(containers[0]) == "running"
    assert report_for(first, spec.launch_id).container_id == containers[0].id
    assert report_for(second, spec.launch_id).container_id == containers[0].id
    assert report_for(second, spec.launch_id).state == "running"


def test_gpu_bound_to_another_launch_is_refused_until_it_is_free(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    holder = make_desired(launch_id="holder", gpu_uuids=["GPU-shared", "GPU-a"], stop_grace_s=5)
    latecomer = make_desired(launch_id="latecomer", gpu_uuids=["GPU-b", "GPU-shared"])

    runtime.reconcile([holder], [], T0)
    runtime.reconcile([holder, latecomer], [], T0 + timedelta(seconds=1))

    assert [c.labels[LABEL_LAUNCH] for c in ours(docker_client, node)] == ["holder"]
    refused = report_for(runtime, "latecomer")
    assert refused.state == "pending"  # transient: it waits for the GPU, it has not failed
    assert refused.error == "GPU GPU-shared is already bound to launch holder"
    assert refused.container_id is None
    assert runtime.busy_gpus() == {"GPU-shared", "GPU-a"}

    # The holder leaves the desired state; once its container has exited the GPU is free again.
    runtime.reconcile([latecomer], [], T0 + timedelta(seconds=2))
    [held] = [c for c in ours(docker_client, node) if c.labels[LABEL_LAUNCH] == "holder"]
    wait_for(lambda: status_of(held) == "exited", what="the holder to stop")
    runtime.reconcile([latecomer], [], T0 + timedelta(seconds=3))

    assert report_for(runtime, "latecomer").state == "running"
    assert runtime.busy_gpus() == {"GPU-b", "GPU-shared"}


def test_two_new_launches_on_one_gpu_start_only_the_first_listed(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    first = make_desired(launch_id="first", gpu_uuids=["GPU-x"])
    second = make_desired(launch_id="second", gpu_uuids=["GPU-x"])

    runtime.reconcile([first, second], [], T0)

    assert [c.labels[LABEL_LAUNCH] for c in ours(docker_client, node)] == ["first"]
    assert report_for(runtime, "second").state == "pending"
    assert report_for(runtime, "second").error == "GPU GPU-x is already bound to launch first"


def test_missing_image_is_pulled_and_an_unreachable_registry_fails_the_launch_with_the_reason(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, docker_client, node
):
    runtime = make_runtime()
    # Nothing listens on port 9 of the loopback: the pull is refused at once.
    spec = make_desired(image="127.0.0.1:9/gpucp/no-such-image:1")

    for second in range(3):
        runtime.reconcile([spec], [], T0 + timedelta(seconds=second))
        runtime.wait_idle(30)
    runtime.reconcile([spec], [], T0 + timedelta(seconds=5))

    assert ours(docker_client, node) == []
    report = report_for(runtime, spec.launch_id)
    assert report.state == "failed"
    assert report.error is not None
    assert report.error.startswith("registry unreachable: the node could not reach the registry of 127.0.0.1:9/")


def test_start_refused_by_the_engine_is_a_failure_with_its_reason(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(command=["/bin/no-such-program"])

    runtime.reconcile([spec], [], T0)

    report = report_for(runtime, spec.launch_id)
    assert report.state == "failed"
    assert report.error.startswith("the container did not start:")
    assert "no-such-program" in report.error
    # It never ran, so it holds no GPU and is not retried.
    assert ours(docker_client, node) == []
    assert runtime.busy_gpus() == set()
    runtime.reconcile([spec], [], T0 + timedelta(seconds=5))
    assert ours(docker_client, node) == []


def test_launch_waits_for_its_window_and_never_starts_after_it(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    early = make_desired(launch_id="early", window_start=T0 + timedelta(minutes=1))
    late = make_desired(launch_id="late", gpu_uuids=["GPU-late"], window_end=T0 - timedelta(seconds=1))

    runtime.reconcile([early, late], [], T0)

    assert ours(docker_client, node) == []
    assert report_for(runtime, "early").state == "pending"
    assert report_for(runtime, "late").state == "failed"
    assert report_for(runtime, "late").error == "the window ended before the container could start"

    runtime.reconcile([early, late], [], T0 + timedelta(minutes=1))
    assert [c.labels[LABEL_LAUNCH] for c in ours(docker_client, node)] == ["early"]


def test_a_pending_launch_dropped_from_the_desired_state_is_forgotten(make_runtime, make_desired):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(window_start=T0 + timedelta(minutes=1))
    runtime.reconcile([spec], [], T0)
    assert [r.state for r in runtime.report()] == ["pending"]

    runtime.reconcile([], [], T0 + timedelta(seconds=1))
    assert runtime.report() == []


def test_facts_say_gpus_are_not_isolated_without_the_nvidia_runtime(make_runtime, docker_client):  # type: ignore[no-untyped-def]
    runtime = make_runtime(nvidia_runtime=None)  # ask the engine
    facts = runtime.facts()

    has_nvidia = "nvidia" in (docker_client.info().get("Runtimes") or {})
    assert facts.kind == "docker"
    assert facts.version == docker_client.version()["Version"]
    assert facts.nvidia_runtime is has_nvidia
    if not has_nvidia:
        assert facts.gpu_mode == "env-only"
        assert "no NVIDIA container runtime" in facts.detail
        assert "not isolated" in facts.detail


def test_with_the_nvidia_runtime_gpus_are_requested_by_uuid(make_runtime, make_desired):  # type: ignore[no-untyped-def]
    runtime = make_runtime(nvidia_runtime=True)
    spec = make_desired(gpu_uuids=["GPU-aaaa-1", "GPU-bbbb-2"])

    args = runtime._create_args(spec, runtime.state_dir)

    [request] = args["device_requests"]
    assert request["Driver"] == "nvidia"
    assert request["DeviceIDs"] == ["GPU-aaaa-1", "GPU-bbbb-2"]
    assert request["Capabilities"] == [["gpu"]]
    assert args["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa-1,GPU-bbbb-2"
    assert runtime.facts().gpu_mode == "nvidia"


def test_nvidia_request_on_an_engine_without_it_fails_instead_of_running_unisolated(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime")
    runtime = make_runtime(nvidia_runtime=True)
    spec = make_desired()

    runtime.reconcile([spec], [], T0)

    report = report_for(runtime, spec.launch_id)
    assert report.state == "failed"
    assert report.error.startswith("the container did not start:")
    assert ours(docker_client, node) == []


def test_docker_runtime_is_a_container_runtime(make_runtime):  # type: ignore[no-untyped-def]
    from nodeagent.runtime.base import ContainerRuntime

    assert isinstance(make_runtime(), ContainerRuntime)
