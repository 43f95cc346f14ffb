"""What dispatch asks of apps above it, filled in by those apps' ``AppConfig.ready()``.

Dispatch builds each node's desired state; the SSH keys a gateway must accept for a launch belong to the
access app, which sits above dispatch and registers the reader here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from nodeagent.schema import AuthorizedKey, VolumeMount

AuthorizedKeysReader = Callable[[Collection[int]], dict[int, list[AuthorizedKey]]]

_authorized_keys: AuthorizedKeysReader | None = None


def register_authorized_keys(reader: AuthorizedKeysReader) -> None:
    global _authorized_keys
    _authorized_keys = reader


def authorized_keys(project_ids: Collection[int]) -> dict[int, list[AuthorizedKey]]:
    """Per project id, the keys its gateways accept (its owners' and members'); empty without the access app."""
    if _authorized_keys is None or not project_ids:
        return {}
    return _authorized_keys(project_ids)


# What each reservation's container mounts and which Docker network its egress joins, as of now: the access
# app reads the volumes' current size limits and the projects' egress networks (docs/volumes.md).
ContainerMountsReader = Callable[[Sequence[Any]], dict[int, tuple[list[VolumeMount], str | None]]]
_container_mounts: ContainerMountsReader | None = None


def register_container_mounts(reader: ContainerMountsReader) -> None:
    global _container_mounts
    _container_mounts = reader


def container_mounts(reservations: Sequence[Any]) -> dict[int, tuple[list[VolumeMount], str | None]]:
    """Per reservation id: its mounts (with each volume's ``limit_bytes``) and its egress network's name (None:
    no egress). Only reservations that mount something or ask for egress are asked about; without the access
    app, none."""
    wanted = [r for r in reservations if r.volumes or r.network != "none"]
    if _container_mounts is None or not wanted:
        return {}
    return _container_mounts(wanted)
