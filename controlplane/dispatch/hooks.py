"""What dispatch asks of apps above it, filled in by those apps' ``AppConfig.ready()``.

Dispatch builds each node's desired state; the SSH keys a gateway must accept for a launch belong to the
access app, which sits above dispatch and registers the reader here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from nodeagent.schema import AuthorizedKey

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
