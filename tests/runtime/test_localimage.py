"""The local busybox image the tests and the demo run, built without a registry."""

from __future__ import annotations

import io
import tarfile

import pytest

from nodeagent.runtime.localimage import VERSION_LABEL, build_rootfs, ensure_busybox_image, find_busybox

pytestmark = pytest.mark.docker


def test_rootfs_holds_busybox_its_applets_and_the_job_script() -> None:
    with tarfile.open(fileobj=io.BytesIO(build_rootfs(find_busybox()))) as tar:
        members = {m.name: m for m in tar.getmembers()}

    assert members["bin/busybox"].isfile() and members["bin/busybox"].mode & 0o111
    for applet in ("sh", "sleep", "echo", "cat", "env", "kill"):
        assert members[f"bin/{applet}"].issym() and members[f"bin/{applet}"].linkname == "busybox"
    assert members["usr/local/bin/gpucp-job"].mode & 0o111
    assert members["tmp"].mode == 0o1777


def test_building_twice_reuses_the_image(docker_client, busybox_image) -> None:  # type: ignore[no-untyped-def]
    first = ensure_busybox_image(docker_client, busybox_image)
    again = ensure_busybox_image(docker_client, busybox_image)

    assert first == again
    assert docker_client.images.get(busybox_image).labels[VERSION_LABEL]


def test_image_runs_a_shell_without_network(docker_client, busybox_image) -> None:  # type: ignore[no-untyped-def]
    out = docker_client.containers.run(
        busybox_image, ["sh", "-c", "echo hello from $(uname -s)"], network_mode="none", remove=True
    )
    assert out.decode().strip() == "hello from Linux"
