"""What the reservation API asks of apps above it, filled in by those apps' ``AppConfig.ready()``.

The detail of a reservation shows how to reach it (``access``: the SSH command and host key of each server it
runs on). That depends on launches and on the agents' gateways, which live above this app; the access app
registers the reader here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

AccessReader = Callable[[Any], dict[str, Any]]

_access: AccessReader | None = None


def register_access(reader: AccessReader) -> None:
    global _access
    _access = reader


def access_for(reservation: Any) -> dict[str, Any]:
    """The reservation's ``access`` block; without the access app, nothing to connect to."""
    if _access is None:
        return {"ready": False, "message": "SSH access is not part of this installation.", "ssh": []}
    return _access(reservation)
