"""The node's volume store on a real file system: paths kept inside the root, usage counted as du counts it,
and the measurement queue that feeds the heartbeats."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from control_plane_double import FakeClock

from nodeagent import schema
from nodeagent.volumes import (
    PROJECT_MODE,
    VOLUME_MODE,
    VolumeRefused,
    VolumeStore,
    disk_usage,
    format_bytes,
    over_limit_reason,
)

KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024


def volume(name: str = "work", project: str = "proj-a", **fields) -> schema.VolumeMount:  # type: ignore[no-untyped-def]
    return schema.VolumeMount(kind="volume", project=project, name=name, path="/workspace", **fields)


def desired_with(*mounts: schema.VolumeMount) -> schema.DesiredContainer:
    clock = FakeClock()
    return schema.DesiredContainer(
        launch_id="l-1",
        reservation="r-1",
        project="proj-a",
        image="busybox",
        gpu_uuids=["GPU-1"],
        window_start=clock.now(),
        window_end=clock.now() + timedelta(hours=1),
        volumes=list(mounts),
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "storage"
    path.mkdir()
    return path


def test_a_volume_is_created_on_first_mount_writable_by_any_user_whatever_the_umask(root: Path) -> None:
    old = os.umask(0o077)
    try:
        [mount] = VolumeStore(root).prepare([volume()])
    finally:
        os.umask(old)

    assert mount.source == root / "proj-a" / "work"
    assert (mount.target, mount.read_only) == ("/workspace", False)
    assert stat.S_IMODE(os.lstat(root / "proj-a" / "work").st_mode) == VOLUME_MODE
    assert stat.S_IMODE(os.lstat(root / "proj-a").st_mode) == PROJECT_MODE


def test_an_existing_volume_keeps_its_mode(root: Path) -> None:
    (root / "proj-a" / "work").mkdir(parents=True, mode=0o700)
    os.chmod(root / "proj-a" / "work", 0o700)

    VolumeStore(root).prepare([volume(read_only=True)])

    assert stat.S_IMODE(os.lstat(root / "proj-a" / "work").st_mode) == 0o700


def test_a_dataset_is_read_only_and_never_created(root: Path, tmp_path: Path) -> None:
    store = VolumeStore(root, dataset_root=tmp_path / "datasets")
    data = schema.VolumeMount(kind="dataset", name="imagenet", path="/data")

    with pytest.raises(VolumeRefused, match="dataset imagenet does not exist on this node"):
        store.prepare([data])
    assert not (tmp_path / "datasets").exists()

    (tmp_path / "datasets" / "imagenet").mkdir(parents=True)
    [mount] = store.prepare([data])
    assert (mount.source, mount.read_only) == (tmp_path / "datasets" / "imagenet", True)


@pytest.mark.parametrize("link", ["project", "volume", "dataset"])
def test_a_symlink_anywhere_on_the_way_is_refused_and_nothing_is_made_through_it(
    root: Path, tmp_path: Path, link: str
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    if link == "project":
        (root / "proj-a").symlink_to(outside)
    elif link == "volume":
        (root / "proj-a").mkdir()
        (root / "proj-a" / "work").symlink_to(outside)
    else:
        (root / ".datasets").mkdir()
        (root / ".datasets" / "imagenet").symlink_to(outside)
    mount = schema.VolumeMount(kind="dataset", name="imagenet", path="/data") if link == "dataset" else volume()

    with pytest.raises(VolumeRefused, match="is a symbolic link on this node"):
        VolumeStore(root).prepare([mount])
    assert list(outside.iterdir()) == []


def test_a_dataset_root_that_is_a_link_is_followed_once_at_start(root: Path, tmp_path: Path) -> None:
    # The operator's own configuration may point through a link; it is resolved when the agent starts, and the
    # check then holds every dataset inside where it points.
    real = tmp_path / "real-datasets"
    (real / "imagenet").mkdir(parents=True)
    (tmp_path / "datasets-link").symlink_to(real)

    store = VolumeStore(root, dataset_root=tmp_path / "datasets-link")

    [mount] = store.prepare([schema.VolumeMount(kind="dataset", name="imagenet", path="/data")])
    assert mount.source == real / "imagenet"


def test_a_missing_volume_root_is_not_created(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        VolumeStore(tmp_path / "not-mounted")
    assert not (tmp_path / "not-mounted").exists()


def test_usage_counts_allocated_blocks_hard_links_once_and_never_follows_links(root: Path, tmp_path: Path) -> None:
    path = root / "proj-a" / "work"
    path.mkdir(parents=True)
    assert disk_usage(path) == 0  # the volume's own directory is not its data
    (path / "data.bin").write_bytes(os.urandom(MiB))
    os.link(path / "data.bin", path / "same-data.bin")
    with open(path / "sparse.bin", "wb") as sparse:
        sparse.truncate(GiB)
    big = tmp_path / "big-outside"
    big.write_bytes(os.urandom(2 * MiB))
    (path / "link-out").symlink_to(big)
    (path / "dir-link-out").symlink_to(tmp_path)
    os.sync()

    used = disk_usage(path)

    du = int(subprocess.run(["du", "-sxB1", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])
    top = os.lstat(path).st_blocks * 512
    assert used == du - top
    assert MiB <= used < MiB + 64 * KiB


def test_usage_does_not_enter_another_file_system(root: Path) -> None:
    path = root / "proj-a" / "work"
    (path / "mnt").mkdir(parents=True)
    (path / "own.bin").write_bytes(os.urandom(64 * KiB))
    if subprocess.run(["mount", "-t", "tmpfs", "none", str(path / "mnt")], capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        (path / "mnt" / "big").write_bytes(os.urandom(2 * MiB))
        os.sync()
        # Like du -x: the mount point is seen on the other file system, so neither it nor what is under it counts.
        assert disk_usage(path) == os.lstat(path / "own.bin").st_blocks * 512
    finally:
        subprocess.run(["umount", str(path / "mnt")], check=True)


def test_the_over_limit_reason_says_how_much_and_what_to_do() -> None:
    assert format_bytes(int(10.4 * GiB)) == "10.4 GiB"
    assert format_bytes(10 * GiB) == "10 GiB"
    assert format_bytes(512) == "512 B"
    assert over_limit_reason("proj-a", "work", int(10.4 * GiB), 10 * GiB) == (
        "volume proj-a/work: volume data is over its limit: 10.4 GiB used of 10 GiB; "
        "free space or raise the limit, then book again"
    )
    # Just over: rounding would read as equal, so the bytes are given.
    assert "10737418241 bytes used of 10737418240 bytes" in over_limit_reason("p", "v", 10 * GiB + 1, 10 * GiB)


def test_a_volume_at_its_limit_is_not_over_it(root: Path) -> None:
    path = root / "proj-a" / "work"
    path.mkdir(parents=True)
    (path / "data").write_bytes(os.urandom(64 * KiB))
    os.sync()
    used = disk_usage(path)
    store = VolumeStore(root)

    store.prepare([volume(limit_bytes=used)])
    with pytest.raises(VolumeRefused, match="over its limit"):
        VolumeStore(root).prepare([volume(limit_bytes=used - 1)])


def test_a_recent_measurement_is_reused_at_launch_and_a_stale_one_is_not(root: Path) -> None:
    clock = FakeClock()
    store = VolumeStore(root, measure_interval_s=60, clock=clock.now)
    store.prepare([volume(limit_bytes=MiB)])
    (root / "proj-a" / "work" / "data").write_bytes(os.urandom(2 * MiB))
    os.sync()

    clock.advance(59)
    store.prepare([volume(limit_bytes=MiB)])  # the 0-byte measurement of a minute ago still stands

    clock.advance(1)
    with pytest.raises(VolumeRefused, match="2 MiB used of 1 MiB"):
        store.prepare([volume(limit_bytes=MiB)])


def test_the_queue_keeps_the_latest_per_volume_until_sent_and_a_newer_one_survives_a_send(root: Path) -> None:
    clock = FakeClock()
    store = VolumeStore(root, measure_interval_s=60, clock=clock.now)
    store.prepare([volume("a"), volume("b")])
    store.track([desired_with(volume("a"), volume("b"))])

    assert store.measure_due() == 2
    first = store.unsent()
    assert [(u.name, u.measured_at) for u in first] == [("a", clock.now()), ("b", clock.now())]
    assert store.measure_due() == 0  # nothing is due within the interval

    clock.advance(60)
    store.measure("proj-a", "a")  # measured again while the first heartbeat is in flight
    store.sent(first)

    [left] = store.unsent()
    assert (left.name, left.measured_at) == ("a", clock.now())
    store.sent([left])
    assert store.unsent() == []


def test_only_the_volumes_of_desired_launches_are_measured(root: Path) -> None:
    store = VolumeStore(root, clock=FakeClock().now)
    store.prepare([volume("kept"), volume("dropped")])
    store.track([desired_with(volume("kept"), schema.VolumeMount(kind="dataset", name="imagenet", path="/data"))])

    store.measure_due()

    assert [u.name for u in store.unsent()] == ["kept"]


def test_the_background_thread_measures_tracked_volumes(root: Path) -> None:
    store = VolumeStore(root, measure_interval_s=0.05)
    store.prepare([volume()])
    store.track([desired_with(volume())])
    store.start()
    try:
        deadline = time.monotonic() + 10
        while not store.unsent() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        store.close()
    [usage] = store.unsent()
    assert (usage.project, usage.name, usage.used_bytes) == ("proj-a", "work", 0)
