"""The node's image cache against the real engine: over its disk budget the least recently used image the agent
pulled goes first, but never one an upcoming launch needs, one a container uses, or an operator's own image; the
last-used times survive a restart of the agent."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from docker.errors import ImageNotFound

from nodeagent import schema
from nodeagent.runtime.images import make_puller

from .image_support import push_distinct, remove_image, remove_repository, sized_image, unique
from .support import T0

pytestmark = pytest.mark.docker

MiB = 1024 * 1024


def present(client, image: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        client.images.get(image)
    except ImageNotFound:
        return False
    return True


def reader(registry) -> schema.RegistryAuth:  # type: ignore[no-untyped-def]
    return schema.RegistryAuth(registry=registry.host, username="reader", password=registry.users["reader"])


@pytest.fixture
def three_images(docker_client, oci_registry, busybox_image) -> Iterator[list[str]]:  # type: ignore[no-untyped-def]
    """Three images of their own, 1 MiB of random bytes each over the test image, only in the registry."""
    repositories = [unique(f"team/cache-{letter}") for letter in "abc"]
    images = [
        push_distinct(docker_client, oci_registry, busybox_image, repo, size_bytes=MiB)[0] for repo in repositories
    ]
    yield images
    for repo in repositories:
        remove_repository(docker_client, f"{oci_registry.host}/{repo}")


def test_eviction_keeps_the_image_an_upcoming_launch_needs_and_removes_the_least_recently_used(  # type: ignore[no-untyped-def]
    make_runtime, make_desired, docker_client, oci_registry, three_images
):
    a, b, c = three_images
    # Each image is about 3 MiB (the test image and its 1 MiB layer); the budget holds two of them.
    base = docker_client.images.get("gpucp-busybox:test").attrs["Size"]
    runtime = make_runtime(image_cache_bytes=2 * (base + MiB) + MiB // 2)
    registry_auth = reader(oci_registry)
    runtime.images.ensure(a, registry_auth)  # the oldest
    runtime.images.ensure(b, registry_auth)
    # A launch an hour away needs a: the desired state protects it, though it is the least recently used.
    upcoming = make_desired(image=a, window_start=T0 + timedelta(hours=1), window_end=T0 + timedelta(hours=2))
    runtime.reconcile([upcoming], [], T0)
    assert runtime.report()[0].state == "pending"

    runtime.images.ensure(c, registry_auth)  # over the budget now

    assert present(docker_client, a), "the image an upcoming launch needs was removed"
    assert not present(docker_client, b), "the least recently used image stayed over the budget"
    assert present(docker_client, c)
    assert set(runtime.images.cache.images()) == {a, c}


def test_an_image_in_use_and_an_operators_own_image_are_never_removed(  # type: ignore[no-untyped-def]
    docker_client, oci_registry, busybox_image, three_images, tmp_path, node
):
    a, b, c = three_images
    registry_auth = reader(oci_registry)
    # The operator's own image, present before the agent was asked for it: never the cache's.
    own = sized_image(docker_client, busybox_image, f"{unique('gpucp-operator-own')}:v1", MiB)
    base = docker_client.images.get(busybox_image).attrs["Size"]
    puller = make_puller(docker_client, state_dir=tmp_path / "state", cache_bytes=base + MiB + MiB // 2)
    container = None
    try:
        assert puller.ensure(own).pulled is False
        puller.ensure(a, registry_auth)
        # A container (of anyone's) uses a: eviction must pass it by.
        container = docker_client.containers.create(a, name=unique("gpucp-cache-user"), labels={"gpucp.node": node})
        puller.ensure(b, registry_auth)
        assert present(docker_client, a) and present(docker_client, b)
        assert present(docker_client, own)

        container.remove(force=True)
        container = None
        puller.ensure(c, registry_auth)  # a is the least recently used, and in use no more

        assert not present(docker_client, a)
        assert present(docker_client, own)
        assert own not in puller.cache.images()
    finally:
        if container is not None:
            container.remove(force=True)
        remove_image(docker_client, own)


def test_last_used_times_survive_a_restart_and_decide_what_goes(  # type: ignore[no-untyped-def]
    docker_client, oci_registry, three_images, tmp_path
):
    a, b, c = three_images
    registry_auth = reader(oci_registry)
    base = docker_client.images.get("gpucp-busybox:test").attrs["Size"]
    budget = 2 * (base + MiB) + MiB // 2
    first = make_puller(docker_client, state_dir=tmp_path / "state", cache_bytes=budget)
    first.ensure(a, registry_auth)
    first.ensure(b, registry_auth)
    first.cache.touch(a)  # a launch of a ran since: b is now the least recently used
    recorded = first.cache.images()

    restarted = make_puller(docker_client, state_dir=tmp_path / "state", cache_bytes=budget)
    assert restarted.cache.images() == recorded
    assert "reader-pw" not in (tmp_path / "state" / "images.json").read_text()
    restarted.ensure(c, registry_auth)

    assert present(docker_client, a) and present(docker_client, c)
    assert not present(docker_client, b)
