"""Project volumes and datasets on a real Docker engine: shared between nodes, read-only where they must be,
and refused (with the reason) when they cannot be mounted safely."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent import schema
from nodeagent.runtime.containers import LABEL_NODE
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.volumes import VOLUME_MODE, VolumeStore

from .support import T0, ours, wait_for

pytestmark = pytest.mark.docker

MiB = 1024 * 1024


@pytest.fixture
def other_node(docker_client) -> Iterator[str]:  # type: ignore[no-untyped-def]
    name = f"test-b-{uuid.uuid4().hex[:10]}"
    yield name
    for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={name}"}):
        container.remove(force=True)


@pytest.fixture
def volume_root(tmp_path: Path) -> Path:
    root = tmp_path / "shared-storage"
    root.mkdir()
    return root


@pytest.fixture(scope="module")
def non_root_image(docker_client, busybox_image: str) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """The busybox image running as uid 1234, as many real job images run: committed locally, no registry."""
    tag = f"gpucp-busybox-nonroot:{uuid.uuid4().hex[:8]}"
    base = docker_client.containers.create(busybox_image, command=["true"])
    try:
        repository, _, version = tag.partition(":")
        base.commit(repository=repository, tag=version, changes=["USER 1234:1234"])
    finally:
        base.remove(force=True)
    yield tag
    docker_client.images.remove(tag, force=True)


def volume(name: str = "work", path: str = "/workspace", **fields) -> schema.VolumeMount:  # type: ignore[no-untyped-def]
    return schema.VolumeMount(kind="volume", project="proj-a", name=name, path=path, **fields)


def dataset(name: str, path: str = "/data") -> schema.VolumeMount:
    return schema.VolumeMount(kind="dataset", name=name, path=path)


def run_to_the_end(runtime: DockerRuntime, spec: schema.DesiredContainer) -> schema.ContainerReport:
    runtime.reconcile([spec], [], T0)
    runtime.wait_idle(30)

    def finished() -> schema.ContainerReport | None:
        runtime.reconcile([spec], [], T0)
        [report] = [r for r in runtime.report() if r.launch_id == spec.launch_id]
        return report if report.state in ("exited", "failed") else None

    return wait_for(finished, what=f"{spec.launch_id} to finish")


def test_a_file_written_on_one_node_is_read_on_another_sharing_the_root(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, node, other_node, volume_root, tmp_path, non_root_image
):
    # Two servers: each its own agent, state and Docker label, one shared storage root.
    runtime_a = make_runtime(volumes=VolumeStore(volume_root))
    runtime_b = make_runtime(node=other_node, state_dir=tmp_path / "agent-b", volumes=VolumeStore(volume_root))
    write = make_desired(
        image=non_root_image,
        command=["sh", "-c", "id -u; echo 'written on A' > /workspace/result.txt"],
        volumes=[volume()],
    )
    read = make_desired(command=["cat", "/workspace/result.txt"], volumes=[volume(read_only=True)])

    written = run_to_the_end(runtime_a, write)
    assert (written.state, written.exit_code) == ("exited", 0), written
    assert written.log_tail is not None and written.log_tail.split() == ["1234"]  # a non-root user wrote it
    reread = run_to_the_end(runtime_b, read)

    assert (reread.state, reread.exit_code) == ("exited", 0), reread
    assert reread.log_tail == "written on A\n"
    host_dir = volume_root / "proj-a" / "work"
    assert stat.S_IMODE(os.lstat(host_dir).st_mode) == VOLUME_MODE
    assert (host_dir / "result.txt").stat().st_uid == 1234


def test_a_read_only_volume_and_a_dataset_refuse_writes(make_runtime, make_desired, volume_root, docker_client, node):  # type: ignore[no-untyped-def]
    (volume_root / ".datasets" / "imagenet").mkdir(parents=True)
    (volume_root / ".datasets" / "imagenet" / "README").write_text("the operator's data\n")
    runtime = make_runtime(volumes=VolumeStore(volume_root))
    script = (
        "cat /data/README; "
        "echo x > /data/new && echo DATASET-WRITTEN; "
        "echo x > /workspace/new && echo VOLUME-WRITTEN; "
        "echo end"
    )
    spec = make_desired(
        command=["sh", "-c", script], volumes=[volume(read_only=True), dataset("imagenet", path="/data")]
    )

    report = run_to_the_end(runtime, spec)

    assert report.state == "exited", report
    assert report.log_tail is not None
    assert "the operator's data" in report.log_tail
    assert "WRITTEN" not in report.log_tail
    assert report.log_tail.count("Read-only file system") == 2
    assert "end" in report.log_tail.splitlines()  # the script went on past both refusals
    assert not (volume_root / ".datasets" / "imagenet" / "new").exists()
    assert not (volume_root / "proj-a" / "work" / "new").exists()
    [container] = ours(docker_client, node)
    mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
    assert mounts["/data"]["RW"] is False and mounts["/workspace"]["RW"] is False
    assert {mounts[p]["Propagation"] for p in ("/data", "/workspace")} <= {"rslave", "rprivate"}


def test_a_missing_dataset_refuses_the_launch(make_runtime, make_desired, volume_root, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime(volumes=VolumeStore(volume_root))
    spec = make_desired(volumes=[volume(), dataset("no-such-data")])

    report = run_to_the_end(runtime, spec)

    assert report.state == "failed"
    assert report.error == (
        "dataset no-such-data does not exist on this node; an operator puts datasets under the dataset root"
    )
    assert ours(docker_client, node) == []
    # Refused for good: the next reconcile does not try again.
    runtime.reconcile([spec], [], T0)
    runtime.wait_idle(10)
    assert ours(docker_client, node) == []


def test_a_node_without_a_volume_root_refuses_a_launch_with_mounts(make_runtime, make_desired, docker_client, node):  # type: ignore[no-untyped-def]
    runtime = make_runtime()
    spec = make_desired(volumes=[volume()])

    report = run_to_the_end(runtime, spec)

    assert report.state == "failed"
    assert report.error is not None and report.error.startswith("this node has no volume root")
    assert ours(docker_client, node) == []


def test_a_volume_over_its_limit_refuses_the_launch_and_a_raised_limit_runs(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, volume_root, docker_client, node
):
    store = VolumeStore(volume_root)
    runtime = make_runtime(volumes=store)
    host_dir = volume_root / "proj-a" / "work"
    host_dir.mkdir(parents=True)
    (host_dir / "weights.bin").write_bytes(os.urandom(3 * MiB))
    os.sync()

    refused = run_to_the_end(runtime, make_desired(volumes=[volume(limit_bytes=2 * MiB)]))

    assert refused.state == "failed"
    assert refused.error == (
        "volume proj-a/work: volume data is over its limit: 3 MiB used of 2 MiB; "
        "free space or raise the limit, then book again"
    )
    assert ours(docker_client, node) == []
    # The measurement made at launch goes to the control plane with the next heartbeat.
    [usage] = store.unsent()
    assert (usage.project, usage.name, usage.used_bytes) == ("proj-a", "work", 3 * MiB)

    allowed = run_to_the_end(
        runtime, make_desired(command=["du", "-sk", "/workspace"], volumes=[volume(limit_bytes=4 * MiB)])
    )
    assert (allowed.state, allowed.exit_code) == ("exited", 0), allowed


def test_a_volume_that_is_a_symlink_out_of_the_root_is_refused(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, volume_root, tmp_path, docker_client, node
):
    outside = tmp_path / "host-secrets"
    outside.mkdir()
    (outside / "key").write_text("secret\n")
    (volume_root / "proj-a").mkdir()
    (volume_root / "proj-a" / "work").symlink_to(outside)
    runtime = make_runtime(volumes=VolumeStore(volume_root))

    report = run_to_the_end(runtime, make_desired(command=["cat", "/workspace/key"], volumes=[volume()]))

    assert report.state == "failed"
    assert report.error == "volume proj-a/work is a symbolic link on this node; only real directories are mounted"
    assert ours(docker_client, node) == []


def test_two_volumes_mount_beside_the_agents_own_warning_mount(
    make_runtime, make_desired, volume_root, docker_client, node
):  # type: ignore[no-untyped-def]
    runtime = make_runtime(volumes=VolumeStore(volume_root))
    spec = make_desired(
        command=["sh", "-c", "ls -d /run/gpucp /workspace /scratch"], volumes=[volume(), volume("tmp", "/scratch")]
    )

    report = run_to_the_end(runtime, spec)

    assert (report.state, report.exit_code) == ("exited", 0), report
    assert report.log_tail is not None and sorted(report.log_tail.split()) == ["/run/gpucp", "/scratch", "/workspace"]
    assert (volume_root / "proj-a" / "tmp").is_dir()
