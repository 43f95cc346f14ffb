"""Hooks between the heartbeat and dispatch. Dispatch fills them in; the fleet only calls them.

They run inside the heartbeat's (or node-loss detection's) transaction, with the server row locked.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from controlplane.inventory.models import Server
from nodeagent.schema import ContainerReport, DesiredContainer


def desired_state_for(
    server: Server, *, now: datetime | None = None, has_work: bool | None = None
) -> tuple[list[DesiredContainer], list[str]]:
    """What must run on ``server`` now, and the launch ids it must stop now. ``has_work`` is the answer of
    ``work_probe(server, now)`` when the caller ran it already in this transaction."""
    from controlplane.dispatch import services

    return services.desired_state_for(server=server, now=now, has_work=has_work)


def work_probe(server: Server, now: datetime) -> tuple[str, list[Any]]:
    """Dispatch's probe as a statement (a row when there is anything to open or anything live on ``server``),
    for the heartbeat to send with its own writes."""
    from controlplane.dispatch import services

    return services.dispatch_work_probe(server_id=server.pk, now=now)


def containers_reported(server: Server, reports: Sequence[ContainerReport], now: datetime) -> None:
    """The containers the agent says it runs or ran, as Docker saw them."""
    from controlplane.dispatch import reports as dispatch_reports

    dispatch_reports.containers_reported(server=server, reports=reports, now=now)


def server_lost(server: Server, now: datetime) -> int:
    """``server`` has been offline long enough for its agent to have fenced itself (``fleet.fencing``): its
    launches are lost. How many were."""
    from controlplane.dispatch import recovery

    return recovery.server_lost(server=server, now=now)
