"""What the agents saw: their container reports fold into launches, and the reservations move on."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from controlplane.dispatch import recovery
from controlplane.dispatch.choices import FINAL_LAUNCH_STATES, LaunchState
from controlplane.dispatch.models import Launch
from controlplane.dispatch.services import settle
from controlplane.inventory.models import Server
from nodeagent import schema

_RANK = {LaunchState.PENDING: 0, LaunchState.RUNNING: 1, LaunchState.STOPPING: 2}
_REPORTED = {
    "pending": LaunchState.PENDING,
    "creating": LaunchState.PENDING,
    "running": LaunchState.RUNNING,
    "stopping": LaunchState.STOPPING,
    "exited": LaunchState.EXITED,
    "failed": LaunchState.FAILED,
    "missing": LaunchState.FAILED,
}


def _reported_state(report: schema.ContainerReport) -> LaunchState:
    if report.fenced and report.state in ("exited", "failed", "missing"):
        # Stopped by the agent's own fence, not by the job or by us: node loss for this launch. Only once it is
        # gone; a fenced container still in its grace is "stopping" and may not be started anywhere else yet.
        return LaunchState.LOST
    # A launch waiting for a GPU the previous container still holds (its stop grace) comes as "pending" with
    # the reason in ``error``: transient, the runtime starts it once the GPU is free.
    return _REPORTED[report.state]


def _apply_report(launch: Launch, report: schema.ContainerReport, now: datetime) -> bool:
    """Fold one report into its launch with a conditional update; True when something changed."""
    target = _reported_state(report)
    current = LaunchState(launch.state)
    fields: dict[str, object] = {}
    for name in ("started_at", "finished_at", "exit_code"):
        value = getattr(report, name)
        if value is not None and getattr(launch, name) != value:
            fields[name] = value
    if report.container_id and report.container_id != launch.container_id:
        fields["container_id"] = report.container_id
    if report.log_tail and report.log_tail != launch.log_tail:
        fields["log_tail"] = report.log_tail
    if report.error and report.error != launch.error:
        fields["error"] = report.error
    if report.image_digest and report.image_digest != launch.image_digest:
        fields["image_digest"] = report.image_digest
    if report.oom_killed and not launch.oom_killed:
        fields["oom_killed"] = True
    # The pull for this launch (its image was not on the node at the window): the latest progress while it runs,
    # cleared by the first report without one.
    pull = report.pull.model_dump(mode="json") if report.pull is not None else None
    if pull != launch.pull:
        fields["pull"] = pull
    if report.state == "missing" and not report.error:
        fields["error"] = "the container disappeared from the engine"
    if target == LaunchState.RUNNING and current == LaunchState.PENDING and launch.error and not report.error:
        fields["error"] = ""  # the wait for a GPU is over; the reason no longer applies
    if current in FINAL_LAUNCH_STATES:
        # Final is final; a late report may still bring the exit code or the log tail it lacked.
        fields = {k: v for k, v in fields.items() if getattr(launch, k) in (None, "", False) and k != "pull"}
        if launch.pull is not None:
            fields["pull"] = None
        target = current
    elif target not in FINAL_LAUNCH_STATES and _RANK[target] < _RANK[current]:
        target = current  # never backwards: an old "pending" cannot undo a seen "running"
    if target == current and not fields:
        return False
    changed = Launch.objects.filter(pk=launch.pk, state=current).update(state=target, updated_at=now, **fields)
    if changed != 1:
        # Another writer (node-loss detection, the closer) moved it first; the next heartbeat reports again.
        return False
    for name, value in fields.items():
        setattr(launch, name, value)
    launch.state = target
    return True


def containers_reported(*, server: Server, reports: Sequence[schema.ContainerReport], now: datetime) -> None:
    """Fold the agent's container reports into launches and move their reservations on.

    Only launches on ``server`` are touched: an agent cannot speak for another node's launch.
    """
    by_id = {report.launch_id: report for report in reports}
    touched: set[int] = set()
    fenced: list[Launch] = []
    for launch in Launch.objects.filter(server=server, launch_id__in=list(by_id)):
        was = launch.state
        if _apply_report(launch, by_id[launch.launch_id], now):
            touched.add(launch.reservation_id)
            if launch.state == LaunchState.LOST and was != LaunchState.LOST:
                fenced.append(launch)
    for launch in fenced:
        recovery.launch_fenced(launch=launch, now=now)
    for reservation_id in sorted(touched - {launch.reservation_id for launch in fenced}):
        settle(reservation_id=reservation_id, now=now)
