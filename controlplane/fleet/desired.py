"""Hooks between the heartbeat and dispatch. Dispatch fills them in; the fleet only calls them.

They run inside the heartbeat's (or node-loss detection's) transaction, with the server row locked.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from controlplane.inventory.models import Server
from nodeagent.schema import ContainerReport, DesiredContainer


def desired_state_for(server: Server) -> tuple[list[DesiredContainer], list[str]]:
    """What must run on ``server`` now, and the launch ids it must stop now."""
    from controlplane.dispatch import services

    return services.desired_state_for(server=server)


def containers_reported(server: Server, reports: Sequence[ContainerReport], now: datetime) -> None:
    """The containers the agent says it runs or ran, as Docker saw them."""
    from controlplane.dispatch import services

    services.containers_reported(server=server, reports=reports, now=now)


def server_lost(server: Server, now: datetime) -> None:
    """``server`` was just marked offline by node-loss detection."""
    from controlplane.dispatch import services

    services.server_lost(server=server, now=now)
