"""Dispatch: open reservations' windows into launches, follow what the agents report, close what ended.

Two roads lead to every agent, and either alone is enough:

* **push** (fast): after a launch commits, a Celery task POSTs the node's desired state, signed, to the
  agent's command listener;
* **heartbeat** (certain): every heartbeat reply carries the same desired state, and a heartbeat also opens
  the windows of its own server that are due, so a launch happens even with no broker, beat or worker.

Lock order everywhere: server row (the heartbeat holds it), then project, then reservation; the same order
the reservation services use, so dispatch never deadlocks with a booking or a cancel.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import requests
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, DateTimeField, Exists, ExpressionWrapper, F, OuterRef, Subquery
from django.utils import timezone

from controlplane.core.broker import broker_guard
from controlplane.dispatch import hooks
from controlplane.dispatch.choices import LIVE_LAUNCH_STATES, LaunchState
from controlplane.dispatch.models import Launch
from controlplane.fleet.models import NodeCredential
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Gpu, Server
from controlplane.ledger.services import lock_project
from controlplane.reservations import resources
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.services import reservation_finish, reservation_mark
from controlplane.reservations.specs import port_auth_env
from controlplane.vault import services as vault
from nodeagent import commands, schema

log = logging.getLogger(__name__)

ACTOR = "system:dispatch"
# States in which the container must run (inside the window); any live launch outside them is stopped.
RUN_STATES = (ReservationState.STARTING, ReservationState.RUNNING)
# How many items one pass of a periodic reconciler handles; the next pass (a second later) takes the rest.
BATCH = 100
# A non-zero exit this close to the window's end counts as the stop at the end, not as a failure.
END_TOLERANCE = timedelta(seconds=2)


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


def lead_time() -> timedelta:
    """How long before its window a launch is sent, so the agent starts it on its own clock at the start."""
    return timedelta(seconds=_setting("DISPATCH_LEAD_S", 2.0))


class PushFailed(Exception):
    """The agent's listener did not take the command; worth retrying."""


# -- opening ----------------------------------------------------------------------------------------------


def dispatch_open_due(*, now: datetime | None = None) -> int:
    """Open every scheduled reservation whose window starts within the lead time; how many were opened."""
    now = now or timezone.now()
    due = list(
        Reservation.objects.filter(state=ReservationState.SCHEDULED, starts_at__lte=now + lead_time())
        .order_by("starts_at")
        .values_list("pk", flat=True)[:BATCH]
    )
    return sum(1 for pk in due if reservation_open(reservation_id=pk, now=now))


@transaction.atomic
def reservation_open(*, reservation_id: int, now: datetime | None = None, generation: int = 1) -> list[Launch]:
    """Create one launch per server of a scheduled reservation, mark it starting, and push once committed.

    Idempotent: a reservation that is no longer scheduled (another worker, the heartbeat, or a cancel got
    there first) is left alone and nothing is returned.
    """
    now = now or timezone.now()
    project_id = Reservation.objects.filter(pk=reservation_id).values_list("project_id", flat=True).first()
    if project_id is None:
        return []
    lock_project(project_id=project_id)
    reservation = Reservation.objects.select_for_update().get(pk=reservation_id)
    if reservation.state != ReservationState.SCHEDULED:
        return []
    if reservation.ends_at <= now:
        reservation_finish(
            reservation=reservation,
            to=ReservationState.FAILED,
            ended_at=reservation.ends_at,
            actor_label=ACTOR,
            reason="the window closed before dispatch could open it",
            used_gpu_seconds_by_gpu={},
        )
        return []
    by_server: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    # A slice booking's container gets its MIG devices' uuids, not the parent GPU's (docs/fractional.md).
    for server_id, index, start, gpu_uuid, mig_uuid in reservation.allocations.filter(active=True).values_list(
        "gpu__server_id", "gpu__index", "slice_start", "gpu__uuid", "mig_device__uuid"
    ):
        by_server[server_id].append((index, start, mig_uuid or gpu_uuid))
    if not by_server:
        return []
    launches = Launch.objects.bulk_create(
        [
            Launch(
                reservation=reservation,
                server_id=server_id,
                generation=generation,
                created_at=now,
                updated_at=now,
                gpu_uuids=[uuid for _, _, uuid in sorted(gpus)],
            )
            for server_id, gpus in sorted(by_server.items())
        ]
    )
    hosts = dict(Server.objects.filter(pk__in=list(by_server)).values_list("pk", "hostname"))
    reservation_mark(
        reservation=reservation,
        from_states=[ReservationState.SCHEDULED],
        to=ReservationState.STARTING,
        actor_label=ACTOR,
        at=now,
        reason=f"window opening: launch sent to {len(launches)} server(s)",
        data={"launches": {launch.launch_id: hosts[launch.server_id] for launch in launches}},
    )
    enqueue_pushes([launch.launch_id for launch in launches])
    return launches


def publish_once(task: Any, **options: Any) -> None:
    """Hand a task to the broker with one connection attempt, or raise. Celery's own publish, even with
    ``retry=False``, first reconnects for up to the broker connection timeout (about 6 s measured, per task),
    which a dead broker would add to the booking request or heartbeat that opened a window."""
    from controlplane.core.celeryapp import app

    if app.conf.task_always_eager:
        task.apply_async(**options)
        return
    # A broker that hangs costs one socket timeout, then fails the next publishes at once for a moment.
    with broker_guard(str(app.conf.broker_url)), app.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=0)
        task.apply_async(producer=producer, retry=False, **options)


def enqueue_pushes(launch_ids: Sequence[str]) -> None:
    """Push each launch once the surrounding transaction commits. A broker outage only delays: the next
    heartbeat carries the same desired state."""
    if not launch_ids:
        return
    ids = list(launch_ids)

    def send() -> None:
        from controlplane.dispatch.tasks import push_launch

        for n, launch_id in enumerate(ids):
            try:
                publish_once(push_launch, args=[launch_id])
            except Exception as exc:
                # The broker is down: trying the other launches would only add connect attempts.
                log.warning(
                    "could not enqueue the push of launch %s (%s), nor of %d more; the next heartbeat delivers them",
                    launch_id,
                    exc,
                    len(ids) - n - 1,
                )
                return

    transaction.on_commit(send)


def dispatch_reservation_booked(*, reservation: Reservation, now: datetime | None = None) -> None:
    """Call inside the booking transaction: a window starting now opens as soon as it commits; a window
    starting within the broker's visibility timeout is scheduled for its start. The 1 s beat is the backstop."""
    now = now or timezone.now()
    pk = reservation.pk
    opens_at = reservation.starts_at - lead_time()
    horizon = timedelta(seconds=_setting("DISPATCH_ETA_HORIZON_S", 3000.0))

    def send() -> None:
        from controlplane.dispatch.tasks import open_reservation

        try:
            if opens_at <= now:
                publish_once(open_reservation, args=[pk])
            elif opens_at - now <= horizon:
                publish_once(open_reservation, args=[pk], eta=opens_at)
        except Exception as exc:
            log.warning("could not enqueue the opening of reservation %s (%s); the beat opens it", pk, exc)

    transaction.on_commit(send)


def dispatch_reservation_changed(*, reservation: Reservation) -> None:
    """Call inside a cancel/release/extend transaction: re-push the desired state of its servers on commit."""
    ids = list(
        Launch.objects.filter(reservation=reservation, state__in=LIVE_LAUNCH_STATES).values_list("launch_id", flat=True)
    )
    enqueue_pushes(ids)


# -- the desired state --------------------------------------------------------------------------------------


def _desired_container(
    launch: Launch,
    *,
    ssh_keys: list[schema.AuthorizedKey] | None = None,
    mounts: tuple[list[schema.VolumeMount], str | None] | None = None,
    material: vault.LaunchMaterial | None = None,
    resources: tuple[schema.ContainerResources, int | None] | None = None,
) -> schema.DesiredContainer:
    # Deferred: recovery (node loss) builds on these services, and holds the one rule of replaceable work.
    from controlplane.dispatch.recovery import replaceable

    reservation = launch.reservation
    volumes, network_name = mounts or ([], None)
    return schema.DesiredContainer(
        launch_id=launch.launch_id,
        reservation=str(reservation.public_id),
        project=reservation.project.slug,
        image=reservation.image,
        command=list(reservation.command or []),
        # With the signing-in port's token (JUPYTER_TOKEN: docs/proxy.md), which no answer of the API shows.
        env={
            **{str(k): str(v) for k, v in (reservation.env or {}).items()},
            **port_auth_env(str(reservation.public_id), reservation.ports),
        },
        gpu_uuids=list(launch.gpu_uuids),
        window_start=reservation.starts_at,
        window_end=reservation.ends_at,
        # A window cut short (reservations.services.reservation_yield) warns its own notice before the new end.
        warn_before_s=(
            reservation.yield_notice_seconds
            if reservation.yield_notice_seconds is not None
            else int(_setting("DISPATCH_WARN_BEFORE_S", 300))
        ),
        notice_reason=reservation.yield_reason or None,
        stop_grace_s=int(_setting("DISPATCH_STOP_GRACE_S", 30)),
        ssh_keys=ssh_keys or [],
        volumes=volumes,
        # Egress only while the project still has its network: one withdrawn since booking means none.
        network="egress" if reservation.network == "egress" and network_name else "none",
        network_name=network_name if reservation.network == "egress" else None,
        replaceable=replaceable(reservation),
        # The project's credential for the image's registry and the secrets' values, as of this launch.
        registry_auth=material.registry_auth if material else None,
        secrets=material.secrets if material else [],
        # CPUs, /dev/shm, ulimits and host memory by the operator's policy (reservations/resources.py).
        resources=None if resources is None else resources[0],
        memory_limit_mib=None if resources is None else resources[1],
    )


def node_desired_state(
    *, server: Server, now: datetime | None = None
) -> tuple[list[schema.DesiredContainer], list[str]]:
    """What must run on ``server`` now (or within the lead time), and the launch ids it must stop now."""
    now = now or timezone.now()
    desired: list[schema.DesiredContainer] = []
    stop: list[str] = []
    live = (
        Launch.objects.filter(server=server, state__in=LIVE_LAUNCH_STATES)
        .select_related("reservation__project")
        .order_by("created_at", "id")
    )
    running = []
    for launch in live:
        reservation = launch.reservation
        if reservation.state in RUN_STATES and now < reservation.ends_at:
            running.append(launch)
        else:
            stop.append(launch.launch_id)
    # One read for the keys of every project running here (access registers the reader: dispatch.hooks).
    keys = hooks.authorized_keys({launch.reservation.project_id for launch in running})
    mounts = hooks.container_mounts([launch.reservation for launch in running])
    # One read for the registry credentials and secrets of every launch here (docs/images.md).
    material = vault.launch_material({launch.reservation_id: launch.reservation for launch in running}.values())
    shares = _container_resources(server, running)
    for launch in running:
        desired.append(
            _desired_container(
                launch,
                ssh_keys=keys.get(launch.reservation.project_id),
                mounts=mounts.get(launch.reservation_id),
                material=material.get(launch.reservation_id),
                resources=shares.get(launch.reservation_id),
            )
        )
    return desired, stop


def _container_resources(
    server: Server, running: list[Launch]
) -> dict[int, tuple[schema.ContainerResources, int | None]]:
    """Per reservation, what its container gets on ``server`` (reservations/resources.py), for an agent that
    applies it (``NodeFacts.pulls``); an older agent is sent none. One read for every launch: the memory slices
    each holds here, and the server's GPU count beside them."""
    facts = server.facts or {}
    if not running or not facts.get("pulls"):
        return {}
    count = (
        Gpu.objects.filter(server_id=server.pk, present=True)
        .order_by()
        .values("server_id")
        .annotate(n=Count("id"))
        .values("n")[:1]
    )
    rows = (
        Allocation.objects.filter(
            reservation_id__in=[launch.reservation_id for launch in running], server_id=server.pk, active=True
        )
        .order_by()
        .annotate(server_gpus=Subquery(count))
        .values_list("reservation_id", "slice_start", "slice_end", "server_gpus")
    )
    held: dict[int, int] = {}
    server_gpus = 0
    for reservation_id, start, end, gpus in rows:
        held[reservation_id] = held.get(reservation_id, 0) + (end - start)
        server_gpus = gpus or 0
    rules = resources.policy()
    return {
        reservation_id: resources.container_resources(
            held_slices=slices, server_gpus=server_gpus, facts=facts, rules=rules
        )
        for reservation_id, slices in held.items()
    }


@functools.cache
def _dispatch_work_sql() -> str:
    qn = connection.ops.quote_name
    launch = qn(Launch._meta.db_table)
    reservation = qn(Reservation._meta.db_table)
    allocation = qn(Allocation._meta.db_table)
    gpu = qn(Gpu._meta.db_table)
    live = ", ".join(["%s"] * len(LIVE_LAUNCH_STATES))
    # Both branches are index lookups (launch_server_state; the GPUs of one server, then their active
    # allocations); LIMIT 1 stops at the first row found.
    return (
        f"SELECT 1 FROM {launch} WHERE server_id = %s AND state IN ({live}) "  # noqa: S608 - identifiers from metadata
        f"UNION ALL SELECT 1 FROM {allocation} a "
        f"JOIN {gpu} g ON g.id = a.gpu_id JOIN {reservation} r ON r.id = a.reservation_id "
        "WHERE g.server_id = %s AND a.active = %s AND r.state = %s AND r.starts_at <= %s LIMIT 1"
    )


def dispatch_work_probe(*, server_id: int, now: datetime) -> tuple[str, list[Any]]:
    """The probe's statement: a row when ``server`` has a live launch, or a scheduled reservation on its GPUs
    that is due to open. The heartbeat may run it with its own writes (one round trip) and pass the answer to
    ``desired_state_for`` as ``has_work``."""
    params: list[Any] = [server_id, *sorted(LIVE_LAUNCH_STATES)]
    params += [server_id, True, ReservationState.SCHEDULED, connection.ops.adapt_datetimefield_value(now + lead_time())]
    return _dispatch_work_sql(), params


def _has_dispatch_work(*, server_id: int, now: datetime) -> bool:
    """True when ``server`` has a live launch, or a scheduled reservation on its GPUs that is due to open."""
    with connection.cursor() as cursor:
        cursor.execute(*dispatch_work_probe(server_id=server_id, now=now))
        return cursor.fetchone() is not None


def desired_state_for(
    *, server: Server, now: datetime | None = None, has_work: bool | None = None
) -> tuple[list[schema.DesiredContainer], list[str]]:
    """The heartbeat's answer. It first opens this server's due windows itself, so a launch never waits on
    the broker, beat or a worker: a heartbeat after any outage is enough.

    Most heartbeats find nothing to open and nothing live: one indexed probe answers that, and the reply is
    empty without building either query below. ``has_work`` is the probe's answer when the caller already ran
    ``dispatch_work_probe`` at ``now`` in this transaction."""
    now = now or timezone.now()
    if has_work is None:
        has_work = _has_dispatch_work(server_id=server.pk, now=now)
    if not has_work:
        return [], []
    due = (
        Reservation.objects.filter(
            state=ReservationState.SCHEDULED,
            starts_at__lte=now + lead_time(),
            allocations__active=True,
            allocations__gpu__server=server,
        )
        .values_list("pk", flat=True)
        .distinct()
    )
    for pk in list(due):
        reservation_open(reservation_id=pk, now=now)
    return node_desired_state(server=server, now=now)


# -- moving reservations on ---------------------------------------------------------------------------------


def _gpu_seconds(reservation: Reservation, launches: Iterable[Launch], now: datetime) -> dict[str, float]:
    """GPU-seconds measured from what ran: container start to exit as the agent saw them, inside the window."""
    out: dict[str, float] = {}
    for launch in launches:
        if launch.started_at is None:
            continue
        start = max(launch.started_at, reservation.starts_at)
        end = min(launch.finished_at or now, reservation.ends_at)
        seconds = max(0.0, (end - start).total_seconds())
        for uuid in launch.gpu_uuids:
            out[uuid] = out.get(uuid, 0.0) + seconds
    return out


def _finish(reservation: Reservation, launches: list[Launch], *, to: str, reason: str, now: datetime) -> bool:
    data_launches = {launch.launch_id: {"state": launch.state, "exit_code": launch.exit_code} for launch in launches}
    log.info("reservation %s -> %s: %s (%s)", reservation.public_id, to, reason, data_launches)
    return reservation_finish(
        reservation=reservation,
        to=to,
        ended_at=min(now, reservation.ends_at),
        actor_label=ACTOR,
        reason=reason,
        used_gpu_seconds_by_gpu=_gpu_seconds(reservation, launches, now),
    )


def _host(launch: Launch) -> str:
    return str(Server.objects.filter(pk=launch.server_id).values_list("hostname", flat=True).first())


@transaction.atomic
def settle(*, reservation_id: int, now: datetime | None = None) -> str | None:
    """Move a dispatched reservation to the state its launches say; the new state, or None if unchanged.

    starting -> running once every launch runs; -> failed when a launch failed or exited non-zero inside the
    window; -> completed when every container exited at or after the end, or with code 0; running -> ending
    once the window closed.
    """
    now = now or timezone.now()
    reservation = Reservation.objects.filter(pk=reservation_id).first()
    if reservation is None or reservation.state not in (*RUN_STATES, ReservationState.ENDING):
        return None
    launches = list(Launch.objects.filter(reservation=reservation).order_by("id"))
    if not launches:
        return None
    live = [launch for launch in launches if launch.state in LIVE_LAUNCH_STATES]
    previous = reservation.state
    if reservation.state in RUN_STATES:
        broken = [launch for launch in launches if launch.state in (LaunchState.FAILED, LaunchState.LOST)]
        if broken:
            first = broken[0]
            to = ReservationState.INTERRUPTED if first.state == LaunchState.LOST else ReservationState.FAILED
            what = first.error or "the launch failed"
            _finish(reservation, launches, to=to, now=now, reason=f"launch on {_host(first)} failed: {what}")
            return to
        if reservation.state == ReservationState.STARTING and all(launch.started_at is not None for launch in launches):
            reservation_mark(
                reservation=reservation,
                from_states=[ReservationState.STARTING],
                to=ReservationState.RUNNING,
                actor_label=ACTOR,
                at=now,
                reason=f"container running on {len(launches)} server(s)",
                data={
                    "started_at": {
                        launch.launch_id: launch.started_at.isoformat() for launch in launches if launch.started_at
                    }
                },
            )
        if live and now >= reservation.ends_at:
            reservation_mark(
                reservation=reservation,
                from_states=list(RUN_STATES),
                to=ReservationState.ENDING,
                actor_label=ACTOR,
                at=now,
                reason="the window closed; stopping the container",
            )
            return ReservationState.ENDING
    if live:
        reservation.refresh_from_db(fields=["state"])
        return reservation.state if reservation.state != previous else None
    # Every launch is final.
    if reservation.state == ReservationState.ENDING:
        return _finish_as(
            reservation, launches, ReservationState.COMPLETED, "containers stopped at the end of the window", now
        )
    early = [
        launch
        for launch in launches
        if launch.state == LaunchState.EXITED
        and launch.exit_code
        and launch.finished_at
        and launch.finished_at < reservation.ends_at - END_TOLERANCE
    ]
    if early:
        first = early[0]
        return _finish_as(
            reservation,
            launches,
            ReservationState.FAILED,
            f"the container on {_host(first)} exited with code {first.exit_code}"
            # The engine's kill for the memory limit, in the agent's words (docs/runtime.md, "Resources").
            + (f": {first.error}" if first.oom_killed and first.error else ""),
            now,
        )
    return _finish_as(
        reservation,
        launches,
        ReservationState.COMPLETED,
        "the container exited"
        + (" with code 0 before the window closed" if now < reservation.ends_at else " at the end of the window"),
        now,
    )


def _finish_as(reservation: Reservation, launches: list[Launch], to: str, reason: str, now: datetime) -> str | None:
    return to if _finish(reservation, launches, to=to, reason=reason, now=now) else None


# -- the periodic closer ------------------------------------------------------------------------------------


def dispatch_close_due(*, now: datetime | None = None) -> int:
    """The backstop for everything the reports did not move: windows that closed, stops not yet pushed,
    launches that never started, reservations whose stop was never confirmed. Returns the items handled."""
    now = now or timezone.now()
    handled = 0
    # Windows that closed while their containers run: ending (the agent stops them on its own clock).
    for pk in Reservation.objects.filter(state__in=RUN_STATES, ends_at__lte=now).values_list("pk", flat=True)[:BATCH]:
        handled += settle(reservation_id=pk, now=now) is not None
    # Scheduled and never opened (the whole system was down across the window).
    for pk in Reservation.objects.filter(state=ReservationState.SCHEDULED, ends_at__lte=now).values_list(
        "pk", flat=True
    )[:BATCH]:
        reservation_open(reservation_id=pk, now=now)  # finishes it as failed, naming why
        handled += 1
    # Live launches whose reservation no longer wants them (cancel, release, failure elsewhere): push the stop.
    stale = (
        Launch.objects.filter(state__in=LIVE_LAUNCH_STATES, stop_requested_at__isnull=True)
        .exclude(reservation__state__in=RUN_STATES)
        .values_list("pk", "launch_id", "state", "reservation__state")[:BATCH]
    )
    for pk, launch_id, state, reservation_state in stale:
        handled += _request_stop(pk=pk, launch_id=launch_id, state=state, reservation_state=reservation_state, now=now)
    handled += _close_stuck(now=now)
    return handled


@transaction.atomic
def _request_stop(*, pk: int, launch_id: str, state: str, reservation_state: str, now: datetime) -> bool:
    fields: dict[str, object] = {"stop_requested_at": now, "updated_at": now}
    if state == LaunchState.PENDING and reservation_state in (
        ReservationState.CANCELLED,
        ReservationState.FAILED,
        ReservationState.COMPLETED,
    ):
        # It never started, and never will: nothing for an agent to report any more.
        fields.update(
            state=LaunchState.CANCELLED, error=f"the reservation was {reservation_state} before the container started"
        )
    if Launch.objects.filter(pk=pk, state=state, stop_requested_at__isnull=True).update(**fields) != 1:
        return False
    enqueue_pushes([launch_id])
    return True


def _close_stuck(*, now: datetime) -> int:
    handled = 0
    start_timeout = timedelta(seconds=_setting("DISPATCH_START_TIMEOUT_S", 600.0))
    stop_timeout = timedelta(seconds=_setting("DISPATCH_STOP_GRACE_S", 30) + _setting("DISPATCH_STOP_TIMEOUT_S", 60))
    never_started = (
        Launch.objects.filter(
            state=LaunchState.PENDING,
            reservation__state=ReservationState.STARTING,
            reservation__starts_at__lte=now - start_timeout,
        )
        .exclude(server__state=ServerState.OFFLINE)
        # Judged only once its agent was heard after the start was due: one silent since (an outage, ours or its
        # network's) may have started it from the desired state it holds, and its replayed reports will say so.
        .exclude(server__last_heartbeat_at__lt=F("reservation__starts_at") + start_timeout)
        .values_list("pk", "reservation_id")[:BATCH]
    )
    for pk, reservation_id in never_started:
        error = f"the agent did not start the container within {start_timeout.total_seconds():g} s of the start"
        if (
            Launch.objects.filter(pk=pk, state=LaunchState.PENDING).update(
                state=LaunchState.FAILED, error=error, updated_at=now
            )
            == 1
        ):
            settle(reservation_id=reservation_id, now=now)
            handled += 1
    # An agent not heard from since its stop was due has not been able to confirm it: it is silent (its node,
    # our network or our own outage), and keeps work running to the window's end on its own. Its reports, replayed
    # when it is back, say when the container really stopped, or node loss gives the launch up at its release
    # time (fleet.fencing): settling now would charge a guess. (docs/fleet.md, "Outages and node loss")
    stop_due = ExpressionWrapper(OuterRef("ends_at") + stop_timeout, output_field=DateTimeField())
    unheard = Launch.objects.filter(
        reservation=OuterRef("pk"), state__in=LIVE_LAUNCH_STATES, server__last_heartbeat_at__lt=stop_due
    )
    unconfirmed = Reservation.objects.filter(state=ReservationState.ENDING, ends_at__lte=now - stop_timeout).exclude(
        Exists(unheard)
    )
    for reservation in unconfirmed[:BATCH]:
        handled += _give_up_waiting(reservation_id=reservation.pk, now=now)
    return handled


@transaction.atomic
def _give_up_waiting(*, reservation_id: int, now: datetime) -> bool:
    reservation = Reservation.objects.get(pk=reservation_id)
    if reservation.state != ReservationState.ENDING:
        return False
    launches = list(Launch.objects.filter(reservation=reservation))
    # The GPUs are free from the window's end whatever the agent says; its late reports still fill the launch.
    return _finish(
        reservation,
        launches,
        to=ReservationState.COMPLETED,
        now=now,
        reason="the agent did not confirm the stop; closed at the end of the window",
    )


# -- push -------------------------------------------------------------------------------------------------


def push_launch(*, launch_id: str, now: datetime | None = None) -> str:
    """POST the desired state of the launch's server, signed, to its agent. Idempotent: the agent keys
    containers by launch id. Raises ``PushFailed`` for what a retry may fix."""
    now = now or timezone.now()
    launch = Launch.objects.select_related("server").filter(launch_id=launch_id).first()
    if launch is None:
        return "unknown"
    server = launch.server
    url = (server.facts or {}).get("command_url")
    if not url:
        return "no_listener"  # the heartbeat delivers it
    key = NodeCredential.objects.filter(server=server, revoked_at__isnull=True).values_list("digest", flat=True).first()
    if not key:
        return "no_credential"
    desired, stop = node_desired_state(server=server, now=now)
    command = commands.new_command(
        server=server.hostname, desired=desired, stop=stop, reason=f"launch {launch_id}", now=now
    )
    body, headers = commands.signed_request(key=key, command=command)
    Launch.objects.filter(pk=launch.pk).update(push_attempts=F("push_attempts") + 1)
    try:
        response = requests.post(url, data=body, headers=headers, timeout=_setting("DISPATCH_PUSH_TIMEOUT_S", 3.0))
    except requests.RequestException as exc:
        raise PushFailed(f"{server.hostname}: {exc.__class__.__name__}: {exc}") from exc
    if response.status_code >= 500:
        raise PushFailed(f"{server.hostname}: HTTP {response.status_code}: {response.text[:200]}")
    if response.status_code >= 400:
        # Refused (a signature or clock problem): retrying the same will not help; the heartbeat still delivers.
        log.warning(
            "agent of %s refused launch %s: HTTP %s %s",
            server.hostname,
            launch_id,
            response.status_code,
            response.text[:200],
        )
        return "refused"
    Launch.objects.filter(pk=launch.pk, pushed_at__isnull=True).update(pushed_at=timezone.now())
    return "pushed"
