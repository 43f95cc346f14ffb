"""Node loss: a server that stopped sending heartbeats loses its launches; their reservations are interrupted,
settled for the time used, and requeued as linked follow-ups where the project opted in.

Fencing (docs/fleet.md, "Outages and node loss"): node-loss detection calls ``server_lost`` with the silence it
counts, and a launch is given up only once its agent has had time to stop it itself: replaceable work at its
lease, other work at its outage tolerance (each plus the stop grace and a margin). An agent that stopped work on
its own and came back first reports the stop as ``fenced``, which ``launch_fenced`` treats the same way. Either
way the old container is gone before a follow-up is booked."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Max

from controlplane.core.errors import DomainError
from controlplane.dispatch.choices import LIVE_LAUNCH_STATES, LaunchState
from controlplane.dispatch.models import Launch, Requeue
from controlplane.dispatch.services import ACTOR, RUN_STATES, _finish, _setting, reservation_open
from controlplane.fleet import fencing
from controlplane.inventory.models import Server
from controlplane.reservations.choices import HOLDING_STATES, ReservationState
from controlplane.reservations.models import Reservation
from controlplane.reservations.services import reservation_create, reservation_mark
from controlplane.reservations.specs import (
    ContainerSpec,
    GpuSpec,
    Window,
    mounts_from_stored,
    ports_from_stored,
    secrets_from_stored,
)


def replaceable(reservation: Reservation) -> bool:
    """Work the control plane would place elsewhere if its node were lost: its project opted in to requeue.

    The one rule behind fencing (DESIGN invariants 8 and 12, docs/fleet.md's decision table): replaceable work is
    stopped at its agent's lease (by the agent, or by the lease watchdog inside its container when the agent is
    dead or frozen) before the follow-up starts; other work keeps its GPUs and runs through an outage."""
    return bool(reservation.project.requeue_on_interrupt)


def release_after_s(launch: Launch) -> float:
    """Seconds of silence of its server after which ``launch`` is given up: its agent stopped replaceable work at
    its lease, other work at its outage tolerance (or the window's end, which comes first), and each has had its
    stop grace and the margin since (``fleet.fencing``)."""
    interval = launch.server.heartbeat_interval_s
    return fencing.release_after_s(interval, replaceable=replaceable(launch.reservation))


def server_lost(*, server: Server, now: datetime, silent_s: float) -> int:
    """``server`` is offline and has been silent for ``silent_s``: give up the launches whose agent has stopped
    them by now (``release_after_s``, by kind of work), interrupt their reservations, settle them for the time
    used (up to the last heartbeat: all the control plane can vouch for), and requeue the replaceable ones.
    The other launches stay live and keep their GPUs: their agent keeps them running through the outage.
    Returns how many launches were given up."""
    last_seen = server.last_heartbeat_at or now
    reason = f"server {server.hostname} stopped sending heartbeats"
    if server.last_heartbeat_at is not None:
        reason += f" {(now - server.last_heartbeat_at).total_seconds():.0f} s ago"
    reservation_ids: set[int] = set()
    lost = 0
    live = Launch.objects.filter(server=server, state__in=LIVE_LAUNCH_STATES).select_related(
        "server", "reservation__project"
    )
    for launch in live:
        if silent_s < release_after_s(launch):
            continue
        fields: dict[str, object] = {"state": LaunchState.LOST, "error": reason, "updated_at": now}
        if launch.started_at is not None and launch.finished_at is None:
            fields["finished_at"] = max(launch.started_at, min(last_seen, now))
        if Launch.objects.filter(pk=launch.pk, state=launch.state).update(**fields) == 1:
            reservation_ids.add(launch.reservation_id)
            lost += 1
    for reservation_id in sorted(reservation_ids):
        _interrupt(reservation_id=reservation_id, reason=reason, now=now)
    return lost


def launch_fenced(*, launch: Launch, now: datetime) -> None:
    """The agent of ``launch``'s server stopped its container on its own, because it had no reply from the
    control plane for its lease (the report said ``fenced``; ``launch`` is already lost). The container is known
    to be gone, so its reservation is interrupted and requeued now, as for a lost server, whether or not node-loss
    detection had got that far: the agent will not start it again."""
    host = Server.objects.filter(pk=launch.server_id).values_list("hostname", flat=True).first()
    reason = f"the agent on {host} stopped the container itself ({launch.error or 'fenced'})"
    _interrupt(reservation_id=launch.reservation_id, reason=reason, now=now)


def _interrupt(*, reservation_id: int, reason: str, now: datetime) -> None:
    reservation = Reservation.objects.select_related("project").get(pk=reservation_id)
    previous = reservation.state
    if previous not in HOLDING_STATES:
        return
    launches = list(Launch.objects.filter(reservation=reservation))
    if not _finish(reservation, launches, to=ReservationState.INTERRUPTED, reason=reason, now=now):
        return
    if previous in RUN_STATES and replaceable(reservation):
        requeue(reservation=reservation, now=now)


def _note(reservation: Reservation, reason: str, data: dict[str, object] | None = None) -> None:
    """An event without a state change. Stamped with the wall clock, like reservation_finish's own event,
    so the trail reads in order."""
    reservation.refresh_from_db(fields=["state"])
    reservation_mark(
        reservation=reservation,
        from_states=[reservation.state],
        to=reservation.state,
        actor_label=ACTOR,
        reason=reason,
        data=data,
    )


def requeue(*, reservation: Reservation, now: datetime) -> Reservation | None:
    """Book the rest of an interrupted reservation's window on healthy GPUs as a linked follow-up, and open it.

    A follow-up reservation (not new allocations in the interrupted one) keeps each reservation's ledger and
    audit trail simple: the interrupted one is settled for what ran, the follow-up is booked, quota-checked
    and held like any booking, and ``Requeue`` links the two.
    """
    minimum = timedelta(seconds=_setting("DISPATCH_REQUEUE_MIN_S", 5.0))
    if reservation.ends_at - now < minimum:
        _note(reservation, f"not requeued: less than {minimum.total_seconds():g} s of the window was left")
        return None
    try:
        with transaction.atomic():
            follow_up = reservation_create(
                project=reservation.project,
                name=f"{reservation.name} (requeued)"[:120],
                spec=GpuSpec(
                    gpu_model_id=reservation.gpu_model_id,
                    min_memory_mib=reservation.min_memory_mib,
                    gpu_count=reservation.gpu_count,
                    whole_servers=reservation.whole_servers,
                    mig_profile=reservation.mig_profile or None,  # a slice booking is requeued as slices
                ),
                window=Window(now, reservation.ends_at),
                container=ContainerSpec(
                    image=reservation.image,
                    command=list(reservation.command or []),
                    env=dict(reservation.env or {}),
                    # The same mounts and network, checked again as any booking's are.
                    volumes=mounts_from_stored(list(reservation.volumes or [])),
                    network=reservation.network,
                    secrets=secrets_from_stored(list(reservation.secrets or [])),
                    ports=ports_from_stored(list(reservation.ports or [])),
                ),
                actor=None,
                now=now,
            )
    except DomainError as exc:
        _note(reservation, f"not requeued: {exc.message}", data={"code": exc.code})
        return None
    Requeue.objects.create(interrupted=reservation, follow_up=follow_up, created_at=now)
    _note(reservation, f"requeued as {follow_up.public_id}", data={"follow_up": str(follow_up.public_id)})
    _note(
        follow_up,
        f"requeued from interrupted reservation {reservation.public_id}",
        data={"interrupted": str(reservation.public_id)},
    )
    generation = (Launch.objects.filter(reservation=reservation).aggregate(g=Max("generation"))["g"] or 0) + 1
    reservation_open(reservation_id=follow_up.pk, now=now, generation=generation)
    return follow_up
