"""Reservation workflows: book, cancel, release, extend, and the two entry points dispatch drives.

Every write runs under the project's row lock (bookings of one project go one at a time, so quota checks
cannot both pass) and, when GPUs are taken, under row locks on those GPUs (ordered by id, so two bookings
never wait on each other for them). On PostgreSQL the exclusion constraint on allocations is the last word: if
anything slipped past the locks, the insert fails and the booking is refused with Conflict. Its check can still
deadlock two bookings that insert overlapping allocations of one GPU at the same instant (it runs after the
index entry is in; no lock order prevents that), so the workflows that insert or move allocations run again
when the database aborts them for it (``retry_on_transient``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Prefetch, prefetch_related_objects
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.core import domain_events, rows
from controlplane.core.db import retry_on_transient
from controlplane.core.errors import Conflict, QuotaExceeded, ValidationFailed
from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu, GpuModel, Server
from controlplane.ledger.services import (
    QuotaNeed,
    actor_label_for,
    check_quota,
    credits,
    ledger_hold,
    ledger_settle,
    lock_project,
)
from controlplane.reservations import capacity, costs, hooks, mig, preemption
from controlplane.reservations.choices import CHANGEABLE_STATES, FINAL_STATES, HOLDING_STATES, ReservationState
from controlplane.reservations.models import Allocation, Reservation, ReservationEvent
from controlplane.reservations.placement import place
from controlplane.reservations.selectors import (
    _BUSY_SQL,
    _G,
    _window_params,
    candidate_servers,
    overlapping,
    usable_whole_sql,
)
from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window
from controlplane.vault import services as vault

# How often a booking re-places after finding that a GPU it chose was taken between its read and its lock.
PLACEMENT_ATTEMPTS = 3


def _hours(seconds: float) -> Decimal:
    return costs.gpu_hours(seconds)


def _user(actor: Any) -> Any:
    return actor if getattr(actor, "pk", None) else None


def _event(
    reservation: Reservation,
    *,
    from_state: str,
    to_state: str,
    actor: Any,
    actor_label: str | None,
    reason: str,
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> ReservationEvent:
    event = ReservationEvent.objects.create(
        reservation=reservation,
        from_state=from_state,
        to_state=to_state,
        actor=_user(actor),
        actor_label=actor_label or actor_label_for(actor),
        reason=reason,
        data=data or {},
        at=at or timezone.now(),
    )
    domain_events.publish("reservation", [event])
    return event


def _lock_gpus(gpu_ids: Iterable[int]) -> dict[int, Gpu]:
    """Lock the GPU rows, in id order, and return them with what placement needs to re-check."""
    rows = (
        Gpu.objects.select_for_update(of=("self",))
        .select_related("server", "model")
        .filter(pk__in=sorted(gpu_ids))
        .order_by("pk")
    )
    return {gpu.pk: gpu for gpu in rows}


def _still_placeable(gpu: Gpu) -> bool:
    return gpu.present and gpu.health == GpuHealth.HEALTHY and gpu.server.state == ServerState.READY


def _peak_concurrent(*, project_id: int, window: Window, extra: int, exclude_reservation_id: int | None = None) -> int:
    """The most GPUs the project would hold at any instant of the window, counting ``extra`` more."""
    qs = overlapping(Allocation.objects.filter(reservation__project_id=project_id), window.starts_at, window.ends_at)
    if exclude_reservation_id is not None:
        qs = qs.exclude(reservation_id=exclude_reservation_id)
    events: list[tuple[datetime, int]] = []
    for a, b in qs.values_list("starts_at", "ends_at"):
        events.append((max(a, window.starts_at), 1))
        events.append((min(b, window.ends_at), -1))
    events.sort(key=lambda e: (e[0], e[1]))  # an end and a start at one instant do not overlap: ends first
    depth = peak = 0
    for _, step in events:
        depth += step
        peak = max(peak, depth)
    return peak + extra


def _share_lock_gpus(gpu_ids: list[int]) -> None:
    """Lock the GPU rows against change (a health report, a drain) until the booking commits, in id order.

    A share lock, not FOR UPDATE: bookings of other windows on the same GPUs, which best-fit placement
    sends to the same servers, go on side by side instead of queueing behind each other's commit; two
    bookings of overlapping windows are kept apart by the exclusion constraint at insert time. SQLite
    has neither; its BEGIN IMMEDIATE runs booking transactions one at a time.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM inventory_gpu WHERE id = ANY(%s) ORDER BY id FOR SHARE", [sorted(gpu_ids)])


# Split around the predicate compiled from ``usable_whole_q`` (a GPU in MIG mode is not bookable whole).
_REREAD_SQL_HEAD = (
    f'SELECT {_G}.id, {_G}.uuid, {_G}."index", {_G}.server_id, s.hostname, {_G}.model_id, m.name, '
    f"m.billing_weight, {_G}.present AND {_G}.health = %s AND s.state = %s AND "
)
_REREAD_SQL_TAIL = (
    f", {_BUSY_SQL} FROM {_G} "
    f"INNER JOIN {Server._meta.db_table} s ON s.id = {_G}.server_id "
    f"INNER JOIN {GpuModel._meta.db_table} m ON m.id = {_G}.model_id WHERE {_G}.id IN "
)


def _reread(gpu_ids: list[int], window: Window) -> tuple[dict[int, Gpu], set[int]]:
    """The chosen GPUs as they are now, with their server and model, and those no longer bookable for the
    window: allocated meanwhile, unhealthy, gone, in MIG mode, or on a server that left ``ready``."""
    whole, whole_params = usable_whole_sql()
    sql = _REREAD_SQL_HEAD + whole + _REREAD_SQL_TAIL + "(" + ", ".join(["%s"] * len(gpu_ids)) + f") ORDER BY {_G}.id"
    params = [GpuHealth.HEALTHY.value, ServerState.READY.value, *whole_params, *_window_params(window), *gpu_ids]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    gpus: dict[int, Gpu] = {}
    taken = set(gpu_ids)
    for gid, uuid, index, server_id, hostname, model_id, model_name, weight, placeable, busy in found:
        # Only what a booking and its answer use is loaded; any other field reads the row when asked for.
        gpu = rows.loaded(Gpu, {"id": gid, "server_id": server_id, "uuid": uuid, "index": index, "model_id": model_id})
        gpu.server = rows.loaded(Server, {"id": server_id, "hostname": hostname})
        gpu.model = rows.loaded(GpuModel, {"id": model_id, "name": model_name, "billing_weight": _weight(weight)})
        gpus[gid] = gpu
        if placeable and not busy:
            taken.discard(gid)
    return gpus, taken


def _weight(value: Any) -> Decimal:
    places = GpuModel._meta.get_field("billing_weight").decimal_places  # type: ignore[union-attr]
    weight = rows.decimal(value, Decimal(1).scaleb(-places))
    assert weight is not None
    return weight


def _place_and_allocate(
    reservation: Reservation, *, spec: GpuSpec, window: Window, now: datetime | None = None, actor: Any = None
) -> tuple[list[Gpu], list[Allocation]]:
    """Choose GPUs, lock them, re-read them and insert the allocations; re-place when another booking got
    one of them first (seen on the re-read, or by the exclusion constraint when it committed meanwhile)."""
    if spec.mig_profile is not None:
        # Slices have their own placement (reservations/mig.py); preemption does not cover them yet.
        return mig.place_and_allocate(reservation, spec=spec, window=window)
    if spec.slices:
        # Slices by memory: the smallest MIG profile that has them free, else whole GPUs of that memory.
        placed = mig.place_by_memory(reservation, spec=spec, window=window)
        if placed is not None:
            return placed
        spec = spec.whole_only
    exclude: set[int] = set()
    preempted = False
    yields_at: datetime | None = None
    for _attempt in range(PLACEMENT_ATTEMPTS + 1):
        servers = candidate_servers(spec, window)
        if exclude:
            servers = [
                s.__class__(
                    s.id,
                    s.hostname,
                    s.total,
                    tuple(g for g in s.free if g.id not in exclude),
                    s.whole and not any(g.id in exclude for g in s.free),
                )
                for s in servers
            ]
        gpu_ids = place(servers, gpu_count=spec.gpu_count, whole_servers=spec.whole_servers)
        if gpu_ids is None and not reservation.preemptible and not preempted and now is not None:
            # Preemption (docs/reservations.md): cut the fewest preemptible reservations short, place again.
            outcome = preemption.preempt_for(
                winner=reservation, spec=spec, window=window, actor=actor, now=now, exclude=exclude
            )
            if outcome.preempted:
                preempted = True
                continue
            yields_at = outcome.yields_at
        if gpu_ids is None:
            raise capacity.no_capacity(spec, window, now=timezone.now(), yields_at=yields_at)
        _share_lock_gpus(gpu_ids)
        # Re-read under the lock, in a new statement: a booking that committed since our read is visible now.
        locked, taken = _reread(gpu_ids, window)
        if taken:
            exclude |= taken
            continue
        gpus: list[Gpu] = [locked[gid] for gid in sorted(locked)]
        allocations = [
            Allocation(
                reservation=reservation,
                gpu=gpu,
                server_id=gpu.server_id,
                starts_at=window.starts_at,
                ends_at=window.ends_at,
            )
            for gpu in gpus
        ]
        try:
            with transaction.atomic():
                rows.insert(allocations)
        except IntegrityError:
            # The exclusion constraint: a booking not yet committed at our re-read holds one of these GPUs
            # for an overlapping period. Which one is not said, so place again without all of them.
            exclude |= set(gpu_ids)
            continue
        return gpus, allocations
    raise Conflict("Other bookings kept taking the chosen GPUs; try again.", code="gpu_taken")


@retry_on_transient
def reservation_create(
    *,
    project: Project,
    name: str,
    spec: GpuSpec,
    window: Window,
    container: ContainerSpec,
    actor: Any,
    now: datetime | None = None,
    preemptible: bool = False,
    notice_seconds: int = 0,
    credit_multiplier: Decimal = Decimal(1),
    template: str = "",
) -> Reservation:
    """Book GPUs for a window: place, check the quota, allocate, hold the credits. All or nothing.

    ``template``: the launch template the request was written out from (docs/templates.md), kept by name.

    ``preemptible``, ``notice_seconds`` and ``credit_multiplier`` are the booker's class (the queue's,
    docs/scheduling.md), kept on the reservation. A non-preemptible booking that finds its GPUs held only by
    preemptible reservations cuts the fewest of them short (``preemption``), in this transaction.

    Raises ValidationFailed for a bad request, Conflict (code ``no_capacity`` or ``gpu_taken``) when the
    GPUs are not free, QuotaExceeded when a quota would break.
    """
    now = now or timezone.now()
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("name: This field is required.", fields={"name": ["This field is required."]})
    spec.validate()
    window.validate(now=now)
    container.validate()

    lock_project(project_id=project.pk)
    # Under the project's lock: two bookings of one non-shared volume cannot both find it free.
    mounts = hooks.resolve_mounts(
        project=project, volumes=list(container.volumes), network=container.network, window=window
    )
    # Under the same lock: a secret cannot be deleted between this check and the booking's commit.
    missing = vault.missing_secrets(project=project, names=[s.name for s in container.secrets])
    if missing:
        raise ValidationFailed("; ".join(f"{k}: {v[0]}" for k, v in missing.items()), fields=missing)
    # Created straight in "scheduled": placement and quota are settled below, in this transaction, and both
    # steps stay on the record as events. The row comes first so the allocations can be inserted as soon
    # as GPUs are chosen.
    reservation = Reservation(
        project=project,
        created_by=_user(actor),
        name=name,
        gpu_model_id=spec.gpu_model_id,
        min_memory_mib=spec.min_memory_mib,
        mig_profile=spec.mig_profile or "",
        gpu_count=spec.gpu_count,
        whole_servers=spec.whole_servers,
        starts_at=window.starts_at,
        ends_at=window.ends_at,
        image=container.image.strip(),
        command=list(container.command),
        env=dict(container.env),
        volumes=mounts,
        network=container.network,
        secrets=[secret.stored() for secret in container.secrets],
        ports=[port.stored() for port in container.ports],
        template=template,
        state=ReservationState.SCHEDULED,
        preemptible=preemptible,
        notice_seconds=notice_seconds,
        credit_multiplier=Decimal(credit_multiplier).quantize(costs.MULTIPLIER),
        created_at=now,
        updated_at=now,
    )
    rows.insert([reservation])
    gpus, allocations = _place_and_allocate(reservation, spec=spec, window=window, now=now, actor=actor)
    hours = _hours(window.seconds)
    # By allocation, so a slice is charged its share of its GPU (costs.weight).
    costs.load_weights(allocations)
    needed = credits(sum((costs.rate(costs.weight(a), reservation) for a in allocations), Decimal(0)) * hours)
    warnings = check_quota(
        project_id=project.pk,
        need=QuotaNeed(
            credits=needed,
            hours=hours,
            peak_concurrent_gpus=lambda: _peak_concurrent(
                project_id=project.pk, window=window, extra=len(gpus), exclude_reservation_id=reservation.pk
            ),
            # The budget and the member's GPU-hour cap (ledger/budgets.py).
            member_id=getattr(_user(actor), "pk", None),
            window=(window.starts_at, window.ends_at),
            gpus=len(gpus),
            booking_id=reservation.pk,
        ),
    )
    ledger_hold(
        project_id=project.pk,
        reservation_id=reservation.pk,
        amount=needed,
        actor=actor,
        checked=True,
        reason=f"hold for reservation {reservation.public_id}",
        data={"hours": str(hours), "gpus": len(gpus)},
    )
    label = actor_label_for(actor)
    events = [
        ReservationEvent(
            reservation=reservation,
            from_state="",
            to_state=ReservationState.PENDING,
            actor=_user(actor),
            actor_label=label,
            reason="requested",
            at=now,
        ),
        ReservationEvent(
            reservation=reservation,
            from_state=ReservationState.PENDING,
            to_state=ReservationState.SCHEDULED,
            actor=_user(actor),
            actor_label=label,
            reason="placed",
            at=now,
            data={
                "gpus": [a.device_uuid for a in allocations],
                "servers": sorted({gpu.server.hostname for gpu in gpus}),
                "credits_held": str(needed),
            },
        ),
    ]
    rows.insert(events)
    domain_events.publish("reservation", events)
    reservation.project = project
    if spec.gpu_model_id is not None:
        reservation.gpu_model = gpus[0].model  # placement only chose GPUs of this model
    # What a response shows, read back by the ORM's own prefetch: two reads rather than caches filled by hand.
    prefetch_related_objects(
        [reservation],
        Prefetch("allocations", queryset=Allocation.objects.select_related("gpu__server", "gpu__model", "mig_device")),
        "events",
    )
    costs.load_weights(list(reservation.allocations.all()))
    reservation.warnings = warnings  # type: ignore[attr-defined]  # a budget that warns: shown in the response
    _dispatch_booked(reservation, now=now)
    return reservation


def _dispatch_booked(reservation: Reservation, *, now: datetime) -> None:
    # Dispatch sits above this app and fills the hook in its AppConfig.ready() (docs/design-notes.md, Layers).
    hooks.booked(reservation, now)


def _dispatch_changed(reservation: Reservation) -> None:
    hooks.changed(reservation)


def _locked(reservation: Reservation) -> Reservation:
    lock_project(project_id=reservation.project_id)
    return Reservation.objects.select_for_update().get(pk=reservation.pk)


def _transition(reservation: Reservation, *, from_states: Iterable[str], to: str, at: datetime, **fields: Any) -> bool:
    changed = Reservation.objects.filter(pk=reservation.pk, state__in=list(from_states)).update(
        state=to, updated_at=at, **fields
    )
    return changed == 1


@transaction.atomic
def reservation_cancel(
    *, reservation: Reservation, actor: Any, reason: str = "", now: datetime | None = None
) -> Reservation:
    """Before the window: release every GPU and every credit held. During it: the same as a release."""
    now = now or timezone.now()
    current = _locked(reservation)
    if now > current.starts_at:
        return _end_early(current, actor=actor, reason=reason or "cancelled during the window", now=now)
    return _cancel_before_start(current, actor=actor, reason=reason, now=now)


def _cancel_before_start(
    current: Reservation, *, actor: Any, reason: str, now: datetime, data: dict[str, Any] | None = None, **fields: Any
) -> Reservation:
    """Cancel a locked reservation whose window has not opened: no GPU, no credit held any more."""
    if current.state not in CHANGEABLE_STATES:
        raise Conflict(_not_in_state(current, "cancelled"), code="invalid_state")
    previous = current.state
    if not _transition(current, from_states=[previous], to=ReservationState.CANCELLED, at=now, **fields):
        raise Conflict("The reservation changed while it was being cancelled; try again.", code="invalid_state")
    current.allocations.filter(active=True).update(active=False, released_at=now)
    ledger_settle(
        project_id=current.project_id,
        reservation_id=current.pk,
        used=Decimal(0),
        actor=actor,
        reason=f"cancelled reservation {current.public_id}",
    )
    _event(
        current,
        from_state=previous,
        to_state=ReservationState.CANCELLED,
        actor=actor,
        actor_label=None,
        reason=reason or "cancelled",
        at=now,
        data=data,
    )
    _dispatch_changed(current)
    hooks.finished(current)
    current.refresh_from_db()
    return current


@transaction.atomic
def reservation_release(
    *, reservation: Reservation, actor: Any, reason: str = "", now: datetime | None = None
) -> Reservation:
    """End the window now. Before it starts this is a cancel."""
    now = now or timezone.now()
    current = _locked(reservation)
    if now <= current.starts_at:
        if current.state not in CHANGEABLE_STATES:
            raise Conflict(_not_in_state(current, "released"), code="invalid_state")
        return reservation_cancel(
            reservation=current, actor=actor, reason=reason or "released before the window", now=now
        )
    return _end_early(current, actor=actor, reason=reason or "released", now=now)


# What each state a command may refuse means to the person who sent the command.
_STATE_MEANS = {
    ReservationState.ENDING: "its window has closed or was cut short and its container is being stopped",
    ReservationState.COMPLETED: "its window is over",
    ReservationState.CANCELLED: "it was cancelled",
    ReservationState.FAILED: "it failed",
    ReservationState.INTERRUPTED: "its server or a GPU was lost during the window",
}


def _not_in_state(reservation: Reservation, verb: str) -> str:
    state = str(reservation.state)
    article = "An" if state[:1] in "aeiou" else "A"
    means = _STATE_MEANS.get(ReservationState(state), "it cannot change now")
    return f"{article} {state} reservation cannot be {verb}: it is in state {state} ({means})."


def _end_early(current: Reservation, *, actor: Any, reason: str, now: datetime) -> Reservation:
    """Cut the window at ``now``: the GPUs are free for others from now on; dispatch stops the container
    and settles the ledger with reservation_finish()."""
    if current.state not in CHANGEABLE_STATES:
        raise Conflict(_not_in_state(current, "ended"), code="invalid_state")
    if now >= current.ends_at:
        raise Conflict("The window has already closed.", code="invalid_state")
    previous, booked_end = current.state, current.ends_at
    if not _transition(current, from_states=[previous], to=ReservationState.ENDING, at=now, ends_at=now):
        raise Conflict("The reservation changed while it was being released; try again.", code="invalid_state")
    current.allocations.filter(active=True, ends_at__gt=now).update(ends_at=now)
    _event(
        current,
        from_state=previous,
        to_state=ReservationState.ENDING,
        actor=actor,
        actor_label=None,
        reason=reason,
        at=now,
        data={"booked_ends_at": booked_end.isoformat(), "ends_at": now.isoformat()},
    )
    _dispatch_changed(current)
    hooks.finished(current)
    current.refresh_from_db()
    return current


@transaction.atomic
def reservation_yield(
    *,
    reservation: Reservation,
    end_at: datetime,
    notice_seconds: int,
    reason: str,
    by: Reservation | None,
    actor: Any,
    now: datetime | None = None,
) -> Reservation:
    """Cut a scheduled or running reservation's window short, to end at ``end_at``, with notice: the one
    primitive behind preemption (and any other reclaiming of GPUs before a window's end).

    Its window and its allocations' periods end at ``end_at``, so the GPUs are free for others from then;
    the event names what took them (``by``, the winner, or None with ``reason`` saying why). Dispatch gives
    the container the warning (the file and SIGUSR1) ``notice_seconds`` before the new end instead of the
    end-of-window notice, then stops it at ``end_at`` as at any window's end; the finish charges what ran and
    releases the rest of the hold. A reservation that would not have started by ``end_at`` is cancelled
    instead (it never runs, nothing is charged).

    Refuses (Conflict ``invalid_state``) a reservation that is not scheduled/starting/running or whose
    window ends by ``end_at`` already, and (Conflict ``notice_too_short``) a cut inside the window sooner
    than ``now + notice_seconds``: nothing runs beyond its allocation, and nothing is cut without its notice.
    """
    now = now or timezone.now()
    current = _locked(reservation)
    if current.state not in CHANGEABLE_STATES:
        raise Conflict(_not_in_state(current, "cut short"), code="invalid_state")
    if end_at >= current.ends_at:
        raise Conflict("The window already ends by then; there is nothing to cut.", code="invalid_state")
    by_id = str(by.public_id) if by is not None else None
    if end_at <= current.starts_at and now < current.starts_at:
        cancelled = _cancel_before_start(
            current,
            actor=actor,
            reason=reason,
            now=now,
            data={"preempted_by": by_id, "booked_ends_at": current.ends_at.isoformat()},
            preempted_by=by,
            yield_reason=reason[:200],
        )
        hooks.yielded(cancelled, by, now)
        return cancelled
    if end_at < now + timedelta(seconds=notice_seconds):
        raise Conflict(
            f"The reservation gets {notice_seconds} s of notice: it cannot be cut to end before "
            f"{(now + timedelta(seconds=notice_seconds)).isoformat()}.",
            code="notice_too_short",
        )
    previous, booked_end = current.state, current.ends_at
    if not _transition(
        current,
        from_states=[previous],
        to=previous,
        at=now,
        ends_at=end_at,
        yield_notice_seconds=notice_seconds,
        yield_reason=reason[:200],
        preempted_by=by,
    ):
        raise Conflict("The reservation changed while it was being cut short; try again.", code="invalid_state")
    current.allocations.filter(active=True, ends_at__gt=end_at).update(ends_at=end_at)
    _event(
        current,
        from_state=previous,
        to_state=previous,
        actor=actor,
        actor_label=None,
        reason=reason,
        at=now,
        data={
            "booked_ends_at": booked_end.isoformat(),
            "ends_at": end_at.isoformat(),
            "notice_seconds": notice_seconds,
            "preempted_by": by_id,
        },
    )
    _dispatch_changed(current)
    hooks.yielded(current, by, now)
    current.refresh_from_db()
    return current


def _extension_plan(
    current: Reservation, *, ends_at: datetime, now: datetime, lock: bool = True
) -> tuple[list[Allocation], dict[int, Gpu], Decimal, Decimal, list[dict[str, Any]]]:
    """The extension's rule, for reservation_extend and extend_quote alike: refuses (ValidationFailed,
    Conflict, QuotaExceeded) when ``current`` cannot be extended to ``ends_at``; else its active
    allocations, their GPUs, the extra hours, the extra credits and the quota's warnings (a budget past its
    cap whose action is ``warn``, as a booking gets them). ``lock``: take the GPUs' row locks."""
    if current.state not in CHANGEABLE_STATES:
        raise Conflict(_not_in_state(current, "extended"), code="invalid_state")
    if ends_at <= current.ends_at:
        raise ValidationFailed(
            "ends_at: must be later than the current end.",
            fields={"ends_at": [f"Must be later than the current end, {current.ends_at.isoformat()}."]},
        )
    if current.ends_at <= now:
        raise Conflict("The window has already closed.", code="invalid_state")
    old_end = current.ends_at
    extra = Window(old_end, ends_at)
    if current.volumes:
        # The added part of the window must find its volumes free too (a non-shared one booked from old_end).
        hooks.recheck_volumes_free(
            project=current.project, volumes=list(current.volumes), window=extra, reservation_id=current.pk
        )
    allocations = list(current.allocations.filter(active=True).select_related("mig_device"))
    if lock:
        gpus = _lock_gpus(a.gpu_id for a in allocations)
    else:
        found = Gpu.objects.select_related("server", "model").filter(pk__in=[a.gpu_id for a in allocations])
        gpus = {gpu.pk: gpu for gpu in found}
    clash = (
        # Sharing a GPU and a memory slice: a slice's extension is not stopped by another slice of its GPU.
        overlapping(Allocation.objects.filter(mig.span_q(allocations)), extra.starts_at, extra.ends_at)
        .exclude(reservation=current)
        .select_related("gpu")
        .order_by("starts_at")
        .first()
    )
    if clash is not None:
        raise Conflict(
            f"GPU {clash.gpu.uuid} is booked from {clash.starts_at.isoformat()}; the reservation cannot "
            f"be extended past it.",
            code="gpu_taken",
            extra={"free_until": clash.starts_at.isoformat()},
        )
    unplaceable = [gpu.uuid for gpu in gpus.values() if not _still_placeable(gpu)]
    # A slice whose MIG device its agent no longer reports (a restart without the MIG manager) has nothing to
    # extend onto: the device is kept only for the history (docs/fractional.md).
    unplaceable += [a.mig_device.uuid for a in allocations if a.mig_device is not None and not a.mig_device.present]
    if unplaceable:
        raise Conflict(f"GPU {unplaceable[0]} is no longer available for booking.", code="gpu_unavailable")
    extra_hours = _hours(extra.seconds)
    for a in allocations:
        a.gpu = gpus[a.gpu_id]  # loaded above with its model: what costs.weight reads
    costs.load_weights(allocations)
    needed = credits(sum((costs.rate(costs.weight(a), current) for a in allocations), Decimal(0)) * extra_hours)
    warnings = check_quota(
        project_id=current.project_id,
        need=QuotaNeed(
            credits=needed,
            hours=_hours((ends_at - current.starts_at).total_seconds()),
            peak_concurrent_gpus=lambda: _peak_concurrent(
                project_id=current.project_id, window=extra, extra=len(gpus), exclude_reservation_id=current.pk
            ),
            # The budget and the booker's GPU-hour cap (ledger/budgets.py); a quote records no alert.
            member_id=current.created_by_id,
            window=(extra.starts_at, extra.ends_at),
            gpus=len(gpus),
            probe=not lock,
        ),
    )
    return allocations, gpus, extra_hours, needed, warnings


def extend_quote(*, reservation: Reservation, ends_at: datetime, now: datetime | None = None) -> dict[str, Any]:
    """What extending to ``ends_at`` would cost and whether it would be allowed now, by the rule
    reservation_extend applies (``_extension_plan``); writes nothing and takes no lock."""
    now = now or timezone.now()
    active = [a for a in reservation.allocations.select_related("gpu__model", "mig_device") if a.active]
    costs.load_weights(active)
    weights = [costs.rate(costs.weight(a), reservation) for a in active]
    rate = sum(weights, Decimal(0))
    extra_hours = _hours(max(0.0, (ends_at - reservation.ends_at).total_seconds()))
    quote: dict[str, Any] = {
        "ends_at": ends_at,
        "current_ends_at": reservation.ends_at,
        "extra_hours": str(extra_hours),
        "credits_per_hour": str(rate),
        "extra_credits": str(credits(rate * extra_hours)),
        "allowed": True,
        "gpus_free": True,
        "refusal": None,
        "warnings": [],
    }
    try:
        _, _, extra_hours, needed, warnings = _extension_plan(reservation, ends_at=ends_at, now=now, lock=False)
        quote["extra_hours"], quote["extra_credits"], quote["warnings"] = str(extra_hours), str(needed), warnings
    except (Conflict, QuotaExceeded, ValidationFailed) as exc:
        quote["allowed"] = False
        quote["gpus_free"] = exc.code not in ("gpu_taken", "gpu_unavailable")
        quote["refusal"] = {"code": exc.code, "message": exc.message, **exc.extra}
    return quote


@retry_on_transient
def reservation_extend(
    *, reservation: Reservation, ends_at: datetime, actor: Any, reason: str = "", now: datetime | None = None
) -> Reservation:
    """Move the end later, on the same GPUs, if they are free and the quota allows; holds the extra credits.

    The reservation handed back carries ``warnings`` as a booking's does: a budget past its cap whose action
    is ``warn`` lets the extension through and says so."""
    now = now or timezone.now()
    current = _locked(reservation)
    old_end = current.ends_at
    allocations, _gpus, extra_hours, needed, warnings = _extension_plan(current, ends_at=ends_at, now=now)
    try:
        with transaction.atomic():
            Allocation.objects.filter(pk__in=[a.pk for a in allocations]).update(ends_at=ends_at)
    except IntegrityError as exc:
        raise Conflict(
            "Another reservation took one of these GPUs for the extension; try again.", code="gpu_taken"
        ) from exc
    Reservation.objects.filter(pk=current.pk).update(ends_at=ends_at, updated_at=now)
    ledger_hold(
        project_id=current.project_id,
        reservation_id=current.pk,
        amount=needed,
        actor=actor,
        reason=f"extension of reservation {current.public_id}",
        data={"hours": str(extra_hours)},
    )
    _event(
        current,
        from_state=current.state,
        to_state=current.state,
        actor=actor,
        actor_label=None,
        reason=reason or "extended",
        at=now,
        data={"old_ends_at": old_end.isoformat(), "ends_at": ends_at.isoformat(), "credits_held": str(needed)},
    )
    _dispatch_changed(current)
    current.refresh_from_db()
    current.warnings = warnings  # type: ignore[attr-defined]  # a budget that warns: shown in the response
    return current


@transaction.atomic
def reservation_mark(
    *,
    reservation: Reservation,
    from_states: Iterable[str],
    to: str,
    actor_label: str,
    reason: str,
    data: dict[str, Any] | None = None,
    actor: Any = None,
    at: datetime | None = None,
) -> bool:
    """Dispatch's state change: a conditional update plus its event. False when the state was not one of
    ``from_states`` (another process moved it first); nothing is written then."""
    at = at or timezone.now()
    states = [str(s) for s in from_states]
    previous = Reservation.objects.filter(pk=reservation.pk).values_list("state", flat=True).first()
    if previous not in states:
        return False
    if not _transition(reservation, from_states=[previous], to=to, at=at):
        return False
    _event(
        reservation,
        from_state=previous,
        to_state=to,
        actor=actor,
        actor_label=actor_label,
        reason=reason,
        data=data,
        at=at,
    )
    reservation.state = to
    return True


def _used_credits(
    reservation: Reservation,
    *,
    ended_at: datetime,
    used_gpu_seconds_by_gpu: Mapping[int, float] | Mapping[str, float] | None,
) -> tuple[Decimal, dict[str, Any]]:
    allocations = list(reservation.allocations.select_related("gpu__model", "mig_device"))
    costs.load_weights(allocations)
    if used_gpu_seconds_by_gpu is None:
        # Nothing measured: charge the booked time up to the end, which is what the project held.
        total, detail = Decimal(0), {}
        for a in allocations:
            total += costs.held_credits(a, until=ended_at, reservation=reservation)
            detail[a.gpu.uuid] = costs.held_seconds(a, until=ended_at)
        return total, {"gpu_seconds": detail, "measured": False}
    weights: dict[int | str, Decimal] = {}
    for a in allocations:
        # A slice is measured under its MIG uuid (what its launch names); a GPU by its id or uuid.
        weights[a.device_uuid] = costs.rate(costs.weight(a), reservation)
        if a.mig_device_id is None:
            weights[a.gpu_id] = weights[a.device_uuid]
    total = Decimal(0)
    for key, seconds in used_gpu_seconds_by_gpu.items():
        if key not in weights:
            raise ValidationFailed(
                f"GPU {key} is not allocated to this reservation.",
                fields={"used_gpu_seconds_by_gpu": [f"GPU {key} is not allocated to it."]},
            )
        total += weights[key] * _hours(max(0.0, float(seconds)))
    return total, {"gpu_seconds": {str(k): v for k, v in used_gpu_seconds_by_gpu.items()}, "measured": True}


@transaction.atomic
def reservation_finish(
    *,
    reservation: Reservation,
    to: str,
    ended_at: datetime,
    actor_label: str,
    reason: str,
    used_gpu_seconds_by_gpu: Mapping[int, float] | Mapping[str, float] | None = None,
    used_credits: Decimal | None = None,
    actor: Any = None,
) -> bool:
    """End a reservation in a final state, free its GPUs and settle the ledger (release the hold, charge use).

    ``used_credits`` wins over ``used_gpu_seconds_by_gpu`` (keys: GPU id or UUID); with neither, the booked
    time up to ``ended_at`` is charged. Idempotent: False, and nothing written, when it was already final.
    """
    if to not in FINAL_STATES:
        raise ValueError(f"{to} is not a final state")
    current = _locked(reservation)
    if current.state not in HOLDING_STATES:
        return False
    data: dict[str, Any]
    if used_credits is not None:
        used, data = Decimal(used_credits), {"measured": True}
    else:
        used, data = _used_credits(current, ended_at=ended_at, used_gpu_seconds_by_gpu=used_gpu_seconds_by_gpu)
    previous = current.state
    now = timezone.now()
    if not _transition(current, from_states=[previous], to=to, at=now):
        return False
    current.allocations.filter(active=True).update(active=False, released_at=ended_at)
    _, charge = ledger_settle(
        project_id=current.project_id,
        reservation_id=current.pk,
        used=used,
        actor=actor,
        actor_label=actor_label,
        reason=reason,
    )
    data["credits_charged"] = str(-charge.amount) if charge else "0"
    _event(
        current,
        from_state=previous,
        to_state=to,
        actor=actor,
        actor_label=actor_label,
        reason=reason,
        data=data,
        at=now,
    )
    hooks.finished(current)
    reservation.state = to
    return True


@retry_on_transient
def reservation_withdraw_yield(
    *, reservation: Reservation, ends_at: datetime, actor: Any, reason: str, now: datetime | None = None
) -> Reservation:
    """Undo a cut made by reservation_yield with no winner (an idle reclamation kept by its people): the end
    goes back to ``ends_at`` through reservation_extend (so it is refused, Conflict ``gpu_taken``, when
    someone booked the freed GPUs meanwhile, and the quota is asked again), and the yield's notice and
    reason are cleared so the container gets the ordinary end-of-window notice again."""
    now = now or timezone.now()
    current = _locked(reservation)
    if current.yield_notice_seconds is None or current.preempted_by_id is not None:
        # A preemption's cut belongs to its winner, who booked the GPUs from then: never withdrawn.
        raise Conflict("The reservation has no cut that can be withdrawn.", code="nothing_to_keep")
    extended = reservation_extend(reservation=current, ends_at=ends_at, actor=actor, reason=reason, now=now)
    # In the extension's transaction: dispatch reads the reservation when it pushes, after the commit.
    Reservation.objects.filter(pk=current.pk).update(yield_notice_seconds=None, yield_reason="", updated_at=now)
    extended.refresh_from_db()
    return extended
