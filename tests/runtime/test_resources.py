"""What a container gets of the server besides its GPUs, on a real engine: its CPUs (on its GPUs' NUMA node, apart
from its neighbours'), /dev/shm, ulimits, a memory limit without extra swap, and the report of a container the
kernel killed for its memory."""

from __future__ import annotations

import logging
import os
import resource
import time
from datetime import timedelta

import docker
import pytest

from nodeagent import schema
from nodeagent.runtime import resources
from nodeagent.runtime.containers import LABEL_CPUSET
from nodeagent.runtime.docker import DockerRuntime

from .support import T0, ours, wait_for

MIB = 1024 * 1024
STACK_64MB = 64 * MIB
MEMLOCK_HARD = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
# NVIDIA's recommendation for its framework containers: memlock unlimited, a 64 MB stack.
TRAINING = schema.ContainerResources(
    cpus=1,
    shm_size_mib=256,
    ulimits=[
        schema.Ulimit(name="memlock", soft=-1, hard=-1),
        schema.Ulimit(name="stack", soft=STACK_64MB, hard=STACK_64MB),
    ],
)
# CPUs and /dev/shm only: runs on any engine (raising memlock needs a daemon that may).
CPUS_ONLY = schema.ContainerResources(cpus=1, shm_size_mib=128)
PRINT_LIMITS_AND_SLEEP = [
    "sh",
    "-c",
    "echo memlock=$(ulimit -l) stack=$(ulimit -s); df -k /dev/shm | tail -n 1; "
    "echo cpus=$(cat /sys/fs/cgroup/cpuset/cpuset.cpus 2>/dev/null || cat /sys/fs/cgroup/cpuset.cpus.effective); "
    "exec sleep 3600",
]


def host_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def needs_two_cpus() -> list[int]:
    cpus = host_cpus()
    if len(cpus) < 2:
        pytest.skip("needs a host with at least two CPUs to place containers apart")
    return cpus


def report_for(runtime: DockerRuntime, launch_id: str) -> schema.ContainerReport:
    [found] = [r for r in runtime.report() if r.launch_id == launch_id]
    return found


def container_of(docker_client, node: str, launch_id: str):  # type: ignore[no-untyped-def]
    [found] = [c for c in ours(docker_client, node) if c.labels["gpucp.launch_id"] == launch_id]
    found.reload()
    return found


def running_output(container, needle: str) -> str:  # type: ignore[no-untyped-def]
    return wait_for(
        lambda: (out := container.logs().decode()) and needle in out and out,
        what=f"{needle!r} in the output",
        timeout=30.0,  # a loaded engine may take a while to start it
    )


# -- the choice of CPUs, as a function ---------------------------------------------------------------------------


def test_cpu_lists_read_and_write_as_linux_does() -> None:
    assert resources.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert resources.parse_cpulist(" 5, 2-3 ,2") == [2, 3, 5]
    assert resources.format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert resources.format_cpulist([]) == ""
    with pytest.raises(ValueError):
        resources.parse_cpulist("3-1")


def test_cpus_are_picked_on_the_local_node_then_free_remote_ones_then_the_least_shared() -> None:
    node0, node1 = list(range(0, 4)), list(range(4, 8))
    everything = node0 + node1
    # Free CPUs of the GPUs' node first, lowest numbers first.
    assert resources.pick_cpus(2, local=node1, all_cpus=everything, taken={}) == [4, 5]
    # Apart from the neighbours where the node has enough.
    assert resources.pick_cpus(2, local=node1, all_cpus=everything, taken={4: 1, 5: 1}) == [6, 7]
    # Not enough free on the node: free CPUs of the other node before sharing one.
    assert resources.pick_cpus(3, local=node1, all_cpus=everything, taken={4: 1, 5: 1}) == [0, 6, 7]
    # Nothing free anywhere: the least shared, local before remote.
    full = {cpu: 1 for cpu in everything} | {6: 2}
    assert resources.pick_cpus(2, local=node1, all_cpus=everything, taken=full) == [4, 5]
    # NUMA unknown: from all CPUs; never more than the host has.
    assert resources.pick_cpus(3, local=None, all_cpus=everything, taken={0: 1}) == [1, 2, 3]
    assert resources.pick_cpus(99, local=node0, all_cpus=everything, taken={}) == everything
    # Deterministic: the same question, the same CPUs.
    assert {tuple(resources.pick_cpus(3, local=node0, all_cpus=everything, taken={1: 1})) for _ in range(5)} == {
        (0, 2, 3)
    }


def test_the_oom_reason_says_the_limit_in_mib() -> None:
    assert resources.oom_message(512 * MIB) == (
        "out of memory: a process of the container went over its memory limit of 512 MiB and the kernel killed it"
    )
    assert resources.oom_message(0).startswith("out of memory: ")


# -- on the engine -----------------------------------------------------------------------------------------------


def engine_can_raise_memlock(docker_client, image: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether this engine may lift a container's memlock limit (its daemon needs CAP_SYS_RESOURCE, or a hard
    limit of its own high enough; some sandboxes give it neither)."""
    try:
        docker_client.containers.run(
            image, ["true"], ulimits=[docker.types.Ulimit(name="memlock", soft=-1, hard=-1)], remove=True
        )
    except (docker.errors.APIError, docker.errors.ContainerError):
        return False
    return True


@pytest.mark.docker
def test_shm_ulimits_cpus_and_memory_match_the_resources(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    cpus = needs_two_cpus()
    gpu = "GPU-numa1-aaaa"
    runtime = make_runtime(numa_cpus={"0": str(cpus[0]), "1": str(cpus[1])}, gpu_numa={gpu: 1})
    spec = make_desired(gpu_uuids=[gpu], resources=TRAINING, memory_limit_mib=128, command=PRINT_LIMITS_AND_SLEEP)

    # Created ahead of its window: what the engine was told, before anything runs.
    runtime.reconcile([spec], [], T0 - timedelta(seconds=10))
    assert runtime.wait_idle(30)
    runtime.reconcile([spec], [], T0 - timedelta(seconds=5))
    container = container_of(docker_client, node, spec.launch_id)
    assert container.status == "created"
    host = container.attrs["HostConfig"]
    assert host["ShmSize"] == 256 * MIB
    assert sorted((u["Name"], u["Soft"], u["Hard"]) for u in host["Ulimits"]) == [
        ("memlock", -1, -1),
        ("stack", STACK_64MB, STACK_64MB),
    ]
    # One CPU, the one of its GPU's NUMA node.
    assert host["CpusetCpus"] == str(cpus[1])
    assert container.labels[LABEL_CPUSET] == str(cpus[1])
    # The memory limit, and no swap beyond it.
    assert host["Memory"] == 128 * MIB
    assert host["MemorySwap"] == 128 * MIB

    runtime.reconcile([spec], [], T0)
    if not engine_can_raise_memlock(docker_client, spec.image):
        # The policy cannot be applied here (a daemon without the privilege): the job runs with the engine's own
        # memlock rather than not at all; the node's facts say so, and the agent remembers it across restarts.
        deadline = time.monotonic() + 60
        while report_for(runtime, spec.launch_id).state != "running":
            assert time.monotonic() < deadline, report_for(runtime, spec.launch_id)
            assert report_for(runtime, spec.launch_id).state != "failed", report_for(runtime, spec.launch_id)
            runtime.wait_idle(5)
            runtime.reconcile([spec], [], T0 + timedelta(seconds=1))
        container = container_of(docker_client, node, spec.launch_id)
        host = container.attrs["HostConfig"]
        assert [(u["Name"], u["Hard"]) for u in host["Ulimits"]] == [("stack", STACK_64MB)]
        assert "cannot raise the memlock ulimit" in (runtime.facts().detail or "")
        assert "memlock" in make_runtime().facts().detail  # a restarted agent knows it already
        output = running_output(container, "cpus=")
        assert "stack=65536" in output and f"cpus={cpus[1]}" in output
        return
    output = running_output(container, "cpus=")
    assert "memlock=unlimited stack=65536" in output
    assert f"cpus={cpus[1]}" in output
    assert report_for(runtime, spec.launch_id).state == "running"


@pytest.mark.docker
def test_the_job_sees_its_ulimits_shm_and_cpus(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    cpus = needs_two_cpus()
    gpu = "GPU-numa1-bbbb"
    # memlock as high as this engine may set it: unlimited where it can, else its own hard limit.
    memlock = -1 if engine_can_raise_memlock(docker_client, "gpucp-busybox:test") else MEMLOCK_HARD
    wanted = TRAINING.model_copy(
        update={
            "ulimits": [
                schema.Ulimit(name="memlock", soft=memlock, hard=memlock),
                schema.Ulimit(name="stack", soft=STACK_64MB, hard=STACK_64MB),
            ]
        }
    )
    runtime = make_runtime(numa_cpus={"0": str(cpus[0]), "1": str(cpus[1])}, gpu_numa={gpu: 1})
    spec = make_desired(gpu_uuids=[gpu], resources=wanted, memory_limit_mib=128, command=PRINT_LIMITS_AND_SLEEP)

    runtime.reconcile([spec], [], T0)

    container = container_of(docker_client, node, spec.launch_id)
    output = running_output(container, "cpus=")
    expected = "unlimited" if memlock == -1 else str(memlock // 1024)
    assert f"memlock={expected} stack=65536" in output
    shm_kib = int(next(line for line in output.splitlines() if "/dev/shm" in line).split()[1])
    assert shm_kib == 256 * 1024
    assert f"cpus={cpus[1]}" in output
    assert report_for(runtime, spec.launch_id).state == "running"


@pytest.mark.docker
def test_two_containers_on_one_node_get_disjoint_cpus_and_share_only_when_there_are_not_enough(
    make_runtime, make_desired, docker_client, node, caplog
):  # type: ignore[no-untyped-def]
    cpus = needs_two_cpus()
    gpus = ["GPU-pair-0001", "GPU-pair-0002", "GPU-pair-0003"]
    runtime = make_runtime(numa_cpus={"0": resources.format_cpulist(cpus)}, gpu_numa=dict.fromkeys(gpus, 0))
    one = resources.format_cpulist(cpus[: len(cpus) // 2])
    share = CPUS_ONLY.model_copy(update={"cpus": len(cpus) // 2})
    first = make_desired(gpu_uuids=[gpus[0]], resources=share)
    second = make_desired(gpu_uuids=[gpus[1]], resources=share)

    # Both created in one reconcile, in parallel workers: still apart.
    runtime.reconcile([first, second], [], T0)

    a = container_of(docker_client, node, first.launch_id).attrs["HostConfig"]["CpusetCpus"]
    b = container_of(docker_client, node, second.launch_id).attrs["HostConfig"]["CpusetCpus"]
    assert a == one
    assert set(resources.parse_cpulist(a)).isdisjoint(resources.parse_cpulist(b))
    assert len(resources.parse_cpulist(b)) == len(cpus) // 2

    # A third when none is free shares the least shared CPUs, and says so.
    third = make_desired(gpu_uuids=[gpus[2]], resources=CPUS_ONLY)
    with caplog.at_level(logging.INFO, logger="nodeagent"):
        runtime.reconcile([first, second, third], [], T0)
    c = container_of(docker_client, node, third.launch_id).attrs["HostConfig"]["CpusetCpus"]
    assert c == str(cpus[0])
    assert f"sharing {cpus[0]} with other containers" in caplog.text

    # A restarted runtime knows which CPUs its adopted containers hold.
    runtime.close()
    again = make_runtime(numa_cpus={"0": resources.format_cpulist(cpus)}, gpu_numa=dict.fromkeys(gpus, 0))
    runtime_cpusets = {launch.launch_id: launch.cpuset for launch in again._launches.values()}
    assert runtime_cpusets == {first.launch_id: a, second.launch_id: b, third.launch_id: c}


@pytest.mark.docker
def test_without_numa_the_cpus_come_from_all_of_the_hosts(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()  # no NUMA map at all: the engine's CPU count
    spec = make_desired(resources=CPUS_ONLY)
    runtime.reconcile([spec], [], T0)
    cpuset = container_of(docker_client, node, spec.launch_id).attrs["HostConfig"]["CpusetCpus"]
    assert cpuset == "0"


@pytest.mark.docker
def test_without_resources_the_container_is_as_before(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime(numa_cpus={"0": "0"}, gpu_numa={"GPU-plain-0": 0})
    spec = make_desired(gpu_uuids=["GPU-plain-0"], memory_limit_mib=64)
    runtime.reconcile([spec], [], T0)

    container = container_of(docker_client, node, spec.launch_id)
    host = container.attrs["HostConfig"]
    assert host["CpusetCpus"] == "0"  # its NUMA node's CPUs, as before
    assert LABEL_CPUSET not in container.labels
    assert host["ShmSize"] == 64 * MIB  # the engine's default
    assert not host.get("Ulimits")
    assert host["Memory"] == host["MemorySwap"] == 64 * MIB


def memory_is_enforced(docker_client) -> bool:  # type: ignore[no-untyped-def]
    return bool(docker_client.info().get("MemoryLimit", True))


@pytest.mark.docker
def test_a_container_killed_for_its_memory_is_reported_out_of_memory(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    if not memory_is_enforced(docker_client):
        pytest.skip("this engine's cgroups do not enforce memory limits (docker info: MemoryLimit false)")
    runtime = make_runtime()
    # dd allocates its 100 MB block at once: far over a 32 MiB limit with no swap to spill into.
    spec = make_desired(memory_limit_mib=32, command=["sh", "-c", "exec dd if=/dev/zero of=/dev/null bs=100M count=1"])
    runtime.reconcile([spec], [], T0)

    report = wait_for(
        lambda: (r := report_for(runtime, spec.launch_id)).state == "exited" and r,
        what="the container's exit",
        timeout=30.0,
    )
    assert report.oom_killed is True
    assert report.exit_code == 137
    assert report.error == (
        "out of memory: a process of the container went over its memory limit of 32 MiB and the kernel killed it"
    )
    assert container_of(docker_client, node, spec.launch_id).attrs["State"]["OOMKilled"] is True
    # On the wire, and kept as the launch's final report (a restarted agent repeats it).
    assert '"oom_killed":true' in report.model_dump_json()
    runtime.report()
    runtime.close()
    again = make_runtime()
    [kept] = [r for r in again.report() if r.launch_id == spec.launch_id]
    assert kept.oom_killed is True and kept.error == report.error


@pytest.mark.docker
def test_a_job_whose_child_was_killed_for_memory_says_so_even_when_it_exits_cleanly(
    make_runtime, make_desired, docker_client, node
):  # type: ignore[no-untyped-def]
    if not memory_is_enforced(docker_client):
        pytest.skip("this engine's cgroups do not enforce memory limits (docker info: MemoryLimit false)")
    runtime = make_runtime()
    spec = make_desired(
        memory_limit_mib=32,
        command=["sh", "-c", "dd if=/dev/zero of=/dev/null bs=100M count=1; echo the main process lives on"],
    )
    runtime.reconcile([spec], [], T0)

    report = wait_for(
        lambda: (r := report_for(runtime, spec.launch_id)).state == "exited" and r,
        what="the container's exit",
        timeout=30.0,
    )
    assert report.exit_code == 0
    assert report.oom_killed is True
    assert report.error is not None and report.error.startswith("out of memory: ")
    assert "the main process lives on" in (report.log_tail or "")


@pytest.mark.docker
def test_a_clean_exit_is_not_out_of_memory(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(memory_limit_mib=32, command=["sh", "-c", "head -c 1000000 /dev/zero | wc -c"])
    runtime.reconcile([spec], [], T0 + timedelta(seconds=1))
    report = wait_for(
        lambda: (r := report_for(runtime, spec.launch_id)).state == "exited" and r,
        what="the container's exit",
        timeout=30.0,
    )
    assert report.exit_code == 0 and report.oom_killed is False and report.error is None


@pytest.mark.docker
def test_a_launch_created_before_the_refusal_was_known_still_runs(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    # Both created ahead of their windows with memlock unlimited, before the runtime knows its engine cannot grant
    # it; the first start finds out, and the second, starting a second later from its old container, runs too.
    if engine_can_raise_memlock(docker_client, "gpucp-busybox:test"):
        pytest.skip("this engine may raise memlock: nothing is refused")
    runtime = make_runtime()
    first = make_desired(resources=TRAINING, command=["sleep", "60"])
    second = make_desired(resources=TRAINING, command=["sleep", "60"], window_start=T0 + timedelta(seconds=1))
    runtime.reconcile([first, second], [], T0 - timedelta(seconds=10))
    assert runtime.wait_idle(30)
    runtime.reconcile([first, second], [], T0 - timedelta(seconds=5))
    ahead = {c.labels["gpucp.launch_id"]: c for c in ours(docker_client, node)}
    assert {u["Name"] for u in ahead[second.launch_id].attrs["HostConfig"]["Ulimits"]} == {"memlock", "stack"}

    def settle(now):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 60
        while True:
            runtime.reconcile([first, second], [], now)
            runtime.wait_idle(5)
            states = {r.launch_id: r.state for r in runtime.report()}
            assert "failed" not in states.values(), runtime.report()
            if states.get(first.launch_id) == "running" and (
                now < second.window_start or states.get(second.launch_id) == "running"
            ):
                return
            assert time.monotonic() < deadline, runtime.report()

    settle(T0)  # the first start meets the refusal and runs without memlock
    assert "memlock" in (runtime.facts().detail or "")
    settle(T0 + timedelta(seconds=1))  # the second's container still asks for it: created again, and it runs
