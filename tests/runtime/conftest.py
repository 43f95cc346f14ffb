"""Fixtures for the Docker runtime tests: a real engine, the local busybox and Jupyter images, and a fake clock.

Each test gets its own ``gpucp.node`` label, so the tests never see each other's containers, and every
container carrying that label is removed when the test ends, whatever happened.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from nodeagent import schema
from nodeagent.runtime import jupyterimage
from nodeagent.runtime.containers import LABEL_NODE
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.runtime.localimage import DEFAULT_TAG, ensure_busybox_image

from .support import T0

pytestmark = pytest.mark.docker


@pytest.fixture(scope="session")
def busybox_image(docker_client) -> str:  # type: ignore[no-untyped-def]
    ensure_busybox_image(docker_client, DEFAULT_TAG)
    return DEFAULT_TAG


@pytest.fixture(scope="session")
def jupyter_image(docker_client) -> str:  # type: ignore[no-untyped-def]
    """``gpucp-jupyter:test``: built here when CI's ``scripts/build-test-image`` has not (a minute or so)."""
    jupyterimage.ensure_jupyter_image(docker_client, jupyterimage.DEFAULT_TAG)
    return jupyterimage.DEFAULT_TAG


@pytest.fixture
def node(docker_client) -> Iterator[str]:  # type: ignore[no-untyped-def]
    name = f"test-{uuid.uuid4().hex[:10]}"
    yield name
    for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={name}"}):
        container.remove(force=True)


@pytest.fixture
def make_runtime(docker_client, node: str, tmp_path: Path) -> Callable[..., DockerRuntime]:  # type: ignore[no-untyped-def]
    def make(**kwargs: Any) -> DockerRuntime:
        kwargs.setdefault("client", docker_client)
        kwargs.setdefault("node", node)
        kwargs.setdefault("state_dir", tmp_path / "agent-state")
        kwargs.setdefault("nvidia_runtime", False)
        return DockerRuntime(**kwargs)

    return make


@pytest.fixture
def make_desired(busybox_image: str) -> Callable[..., schema.DesiredContainer]:
    counter = {"n": 0}

    def make(**overrides: Any) -> schema.DesiredContainer:
        counter["n"] += 1
        n = counter["n"]
        values: dict[str, Any] = {
            "launch_id": f"launch-{n}",
            "reservation": f"res-{n}",
            "project": "proj-a",
            "image": busybox_image,
            "gpu_uuids": [f"GPU-{n:04d}-aaaa"],
            "window_start": T0,
            "window_end": T0 + timedelta(minutes=10),
            "warn_before_s": 60,
            "stop_grace_s": 10,
        }
        values.update(overrides)
        return schema.DesiredContainer(**values)

    return make
