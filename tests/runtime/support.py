"""Helpers for the runtime tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from nodeagent.runtime.containers import LABEL_NODE

# Windows are placed on a fake timeline: the runtime compares them only with the ``now`` it is handed.
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def wait_for(
    predicate: Callable[[], Any], *, timeout: float = 15.0, what: str = "condition", interval: float = 0.1
) -> Any:
    """Poll in real time: the container's process runs on the wall clock whatever the runtime's clock says."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def logs_of(container) -> str:  # type: ignore[no-untyped-def]
    return container.logs(stdout=True, stderr=True).decode()


def status_of(container) -> str:  # type: ignore[no-untyped-def]
    container.reload()
    return str(container.attrs["State"]["Status"])


def ours(docker_client, node: str) -> list:  # type: ignore[no-untyped-def]
    return docker_client.containers.list(all=True, filters={"label": f"{LABEL_NODE}={node}"})
