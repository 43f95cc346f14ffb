"""Hooks between the heartbeat and dispatch. Dispatch, above the fleet, fills them in its ``AppConfig.ready()``;
the fleet only calls them, and a heartbeat with no dispatch to answer it fails loudly (``core.hooks``).

They run inside the heartbeat's (or node-loss detection's) transaction, with the server row locked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from controlplane.core.hooks import RequiredHook
from controlplane.inventory.models import Server
from nodeagent.schema import AgentEvent, ContainerReport, DesiredContainer, ImageReport, PrePull, VolumeUsage

DISPATCH = "controlplane.dispatch"
# (server, now, has_work) -> (the containers that must run, the launch ids to stop)
desired_state_hook: RequiredHook[[Server, datetime | None, bool | None], tuple[list[DesiredContainer], list[str]]] = (
    RequiredHook("fleet.desired_state_for", provider=DISPATCH)
)
work_probe_hook: RequiredHook[[Server, datetime], tuple[str, list[Any]]] = RequiredHook(
    "fleet.work_probe", provider=DISPATCH
)
containers_reported_hook: RequiredHook[[Server, Sequence[ContainerReport], datetime], None] = RequiredHook(
    "fleet.containers_reported", provider=DISPATCH
)
# (server, now, seconds of silence as node loss counts them) -> how many launches were given up
server_lost_hook: RequiredHook[[Server, datetime, float], int] = RequiredHook("fleet.server_lost", provider=DISPATCH)
# (server, now) -> the images to pull ahead of upcoming windows on it
prepull_hook: RequiredHook[[Server, datetime], list[PrePull]] = RequiredHook("fleet.prepull_for", provider=DISPATCH)
images_reported_hook: RequiredHook[[Server, Sequence[ImageReport], datetime], None] = RequiredHook(
    "fleet.images_reported", provider=DISPATCH
)


def desired_state_for(
    server: Server, *, now: datetime | None = None, has_work: bool | None = None
) -> tuple[list[DesiredContainer], list[str]]:
    """What must run on ``server`` now, and the launch ids it must stop now. ``has_work`` is the answer of
    ``work_probe(server, now)`` when the caller ran it already in this transaction."""
    return desired_state_hook(server, now, has_work)


def work_probe(server: Server, now: datetime) -> tuple[str, list[Any]]:
    """Dispatch's probe as a statement (a row when there is anything to open or anything live on ``server``),
    for the heartbeat to send with its own writes."""
    return work_probe_hook(server, now)


def containers_reported(server: Server, reports: Sequence[ContainerReport], now: datetime) -> None:
    """The containers the agent says it runs or ran, as Docker saw them."""
    containers_reported_hook(server, reports, now)


def prepull_for(server: Server, now: datetime) -> list[PrePull]:
    """The images ``server``'s agent should pull now for the reservations whose windows open there soon."""
    return prepull_hook(server, now)


def images_reported(server: Server, reports: Sequence[ImageReport], now: datetime) -> None:
    """What the agent says of the images it pulls ahead (progress, digest, failure)."""
    images_reported_hook(server, reports, now)


def server_lost(server: Server, now: datetime, silent_s: float) -> int:
    """``server`` is offline and has been silent for ``silent_s`` (as node loss counts it, never more than since
    its last heartbeat): dispatch gives up the launches whose agent has stopped them by now, by kind of work
    (``fleet.fencing.release_after_s``). How many it gave up."""
    return server_lost_hook(server, now, silent_s)


# -- hooks for apps above the fleet (filled in by their AppConfig.ready()) ---------------------------------

SessionsReported = Callable[[Server, Sequence[AgentEvent], datetime], None]
VolumesReported = Callable[[Server, Sequence[VolumeUsage], datetime], None]
_sessions_reported: list[SessionsReported] = []
_volumes_reported: list[VolumesReported] = []


def register_sessions_reported(hook: SessionsReported) -> None:
    if hook not in _sessions_reported:
        _sessions_reported.append(hook)


def register_volumes_reported(hook: VolumesReported) -> None:
    if hook not in _volumes_reported:
        _volumes_reported.append(hook)


def sessions_reported(server: Server, events: Sequence[AgentEvent], now: datetime) -> None:
    """The gateway's SSH sessions that opened or closed (events of kind "session"), for the access app."""
    for hook in _sessions_reported:
        hook(server, events, now)


def volumes_reported(server: Server, usages: Sequence[VolumeUsage], now: datetime) -> None:
    """Project volumes the agent measured, for the access app."""
    for hook in _volumes_reported:
        hook(server, usages, now)
