"""The queue's workflows: submit, cancel, and the pass that starts what fits (docs/scheduling.md).

A queued request holds nothing: no GPUs, no credits. The pass books it through
``reservations.services.reservation_create``, the one definition of a valid booking and of placement, for
``[now, now + duration)``: it can only take GPUs no reservation holds, so an advance reservation is never
delayed by the queue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.core.db import retry_on_transient
from controlplane.core.errors import Conflict, QuotaExceeded, ValidationFailed
from controlplane.inventory.models import Gpu
from controlplane.ledger.services import QuotaNeed, actor_label_for, check_quota, credits, lock_project
from controlplane.reservations import capacity, costs
from controlplane.reservations.selectors import spec_q as _spec_q
from controlplane.reservations.services import reservation_create
from controlplane.reservations.specs import (
    ContainerSpec,
    GpuSpec,
    MountRequest,
    Window,
    ports_from_stored,
    secrets_from_stored,
)
from controlplane.scheduling import preemption
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import PriorityClass, QueuedRequest, QueuedRequestEvent
from controlplane.scheduling.order import Entry, Shadow, iso, ordered_queue, shadow
from controlplane.vault import services as vault

log = logging.getLogger(__name__)

NOT_STARTED_BY = "not started by start_by"
# Codes of a booking refused because the GPUs are not free now: the request waits, and blocks those behind it.
_BUSY_CODES = frozenset({"no_capacity", "gpu_taken"})
# The states of a request that has not started: it may be cancelled, or have its class changed.
_WAITING = (RequestState.QUEUED, RequestState.HELD)


def _user(actor: Any) -> Any:
    return actor if getattr(actor, "pk", None) else None


def _event(request: QueuedRequest, *, from_state: str, to_state: str, actor: Any, reason: str, at: datetime) -> None:
    QueuedRequestEvent.objects.create(
        request=request,
        from_state=from_state,
        to_state=to_state,
        actor=_user(actor),
        actor_label=actor_label_for(actor),
        reason=reason,
        at=at,
    )


def spec_to_json(spec: GpuSpec) -> dict[str, Any]:
    return {
        "gpu_model_id": spec.gpu_model_id,
        "min_memory_mib": spec.min_memory_mib,
        "gpu_count": spec.gpu_count,
        "whole_servers": spec.whole_servers,
    }


def spec_of(request: QueuedRequest) -> GpuSpec:
    return GpuSpec(**request.spec)


def container_to_json(container: ContainerSpec) -> dict[str, Any]:
    return {
        "image": container.image,
        "command": list(container.command),
        "env": dict(container.env),
        "volumes": [
            {"kind": m.kind, "name": m.name, "path": m.path, "read_only": m.read_only} for m in container.volumes
        ],
        "network": container.network,
        "secrets": [secret.stored() for secret in container.secrets],
        "ports": [port.stored() for port in container.ports],
    }


def container_of(request: QueuedRequest) -> ContainerSpec:
    data = dict(request.container)
    data["volumes"] = [MountRequest(**m) for m in data.get("volumes", [])]
    data["secrets"] = secrets_from_stored(list(data.get("secrets", [])))
    data["ports"] = ports_from_stored(list(data.get("ports", [])))
    return ContainerSpec(**data)


def _asked(spec: GpuSpec) -> int:
    return spec.whole_servers if spec.whole_servers is not None else spec.gpu_count or 1


def _refuse_if_it_can_never_fit(
    *, project: Project, spec: GpuSpec, duration: timedelta, now: datetime, multiplier: Decimal = Decimal(1)
) -> None:
    """The refusals of a request no amount of waiting would start: more GPUs than the fleet has (the words of
    capacity.no_capacity), a length beyond the quota policy's longest booking, a GPU count beyond its
    concurrency cap, or a cost beyond the credits the project has (check_quota, with the cheapest matching
    GPU model's weight times the class's multiplier: a lower bound of what the booking will cost)."""
    window = Window(now, now + duration)
    if capacity.fleet_count(spec).total < _asked(spec):
        raise capacity.no_capacity(spec, window, now=now)
    hours = costs.gpu_hours(duration.total_seconds())
    weight = Gpu.objects.filter(_spec_q(spec), present=True).aggregate(w=Min("model__billing_weight"))["w"]
    needed = credits((weight or Decimal(0)) * multiplier * _asked(spec) * hours)
    lock_project(project_id=project.pk)
    check_quota(
        project_id=project.pk,
        need=QuotaNeed(credits=needed, hours=hours, peak_concurrent_gpus=spec.gpu_count or 0, probe=True),
    )


def class_allowed(*, project: Project, priority_class: PriorityClass) -> bool:
    """An unrestricted class is anyone's; a restricted one only of the projects its quota policies name."""
    return not priority_class.restricted or priority_class.allowed_policies.filter(project=project).exists()


def _refuse_a_class_not_allowed(*, project: Project, priority_class: PriorityClass) -> None:
    if not class_allowed(project=project, priority_class=priority_class):
        message = (
            f'The class "{priority_class.name}" is restricted, and the quota policy of project {project.slug} '
            "does not allow it; an operator can grant it."
        )
        raise ValidationFailed(f"priority_class: {message}", fields={"priority_class": [message]})


@transaction.atomic
def request_submit(
    *,
    project: Project,
    name: str,
    spec: GpuSpec,
    container: ContainerSpec,
    duration: timedelta,
    start_by: datetime | None,
    priority_class: PriorityClass,
    actor: Any,
    now: datetime | None = None,
    requeue: bool = False,
) -> QueuedRequest:
    """Queue a request. Raises ValidationFailed for a bad one (or a class its quota policy does not allow),
    Conflict ``no_capacity`` when the fleet has too few matching GPUs for it ever to start, QuotaExceeded when
    the project's quota rules it out."""
    now = now or timezone.now()
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("name: This field is required.", fields={"name": ["This field is required."]})
    spec.validate()
    container.validate()
    missing = vault.missing_secrets(project=project, names=[s.name for s in container.secrets])
    if missing:
        raise ValidationFailed("; ".join(f"{k}: {v[0]}" for k, v in missing.items()), fields=missing)
    if duration <= timedelta(0):
        raise ValidationFailed(
            "duration: must be longer than zero.", fields={"duration": ["Must be longer than zero."]}
        )
    if start_by is not None:
        if timezone.is_naive(start_by):
            message = "Give a time zone (an offset or Z)."
            raise ValidationFailed(f"start_by: {message}", fields={"start_by": [message]})
        if start_by <= now:
            message = "Must be in the future."
            raise ValidationFailed(f"start_by: {message}", fields={"start_by": [message]})
    _refuse_a_class_not_allowed(project=project, priority_class=priority_class)
    _refuse_if_it_can_never_fit(
        project=project, spec=spec, duration=duration, now=now, multiplier=priority_class.credit_multiplier
    )
    request = QueuedRequest.objects.create(
        project=project,
        created_by=_user(actor),
        name=name,
        spec=spec_to_json(spec),
        container=container_to_json(container),
        duration_seconds=int(duration.total_seconds()),
        start_by=start_by,
        priority_class=priority_class,
        state=RequestState.QUEUED,
        requeue=requeue,
        created_at=now,
    )
    _event(request, from_state="", to_state=RequestState.QUEUED, actor=actor, reason="submitted", at=now)
    transaction.on_commit(trigger_pass)
    return request


def trigger_pass() -> None:
    """Ask a worker for a pass now; with the broker down, the beat's next one (within 5 s) does it."""
    from controlplane.dispatch.services import publish_once
    from controlplane.scheduling.tasks import schedule_pass as task

    try:
        publish_once(task)
    except Exception as exc:
        log.warning("could not enqueue a queue pass (%s); the beat runs one", exc)


@transaction.atomic
def request_cancel(
    *, request: QueuedRequest, actor: Any, reason: str = "", now: datetime | None = None
) -> QueuedRequest:
    """Take a request off the queue; only while it is queued or held (409 ``invalid_state`` after)."""
    now = now or timezone.now()
    current = QueuedRequest.objects.select_for_update().get(pk=request.pk)
    changed = QueuedRequest.objects.filter(pk=current.pk, state=current.state, state__in=_WAITING).update(
        state=RequestState.CANCELLED, reason=reason or "cancelled"
    )
    if not changed:
        raise Conflict(
            f"A {current.state} request cannot be cancelled: only a queued or held one can "
            "(cancel a started one's reservation instead).",
            code="invalid_state",
        )
    _event(
        current,
        from_state=current.state,
        to_state=RequestState.CANCELLED,
        actor=actor,
        reason=reason or "cancelled",
        at=now,
    )
    current.refresh_from_db()
    return current


@transaction.atomic
def _fail(request_id: int, *, reason: str, now: datetime) -> None:
    current = QueuedRequest.objects.filter(pk=request_id, state__in=_WAITING).first()
    if current is None:
        return
    changed = QueuedRequest.objects.filter(pk=request_id, state=current.state).update(
        state=RequestState.FAILED, reason=reason
    )
    if changed:
        _event(current, from_state=current.state, to_state=RequestState.FAILED, actor=None, reason=reason, at=now)


def _wait(request_id: int, reason: str, found: Shadow | None = None) -> None:
    QueuedRequest.objects.filter(pk=request_id, state=RequestState.QUEUED).update(
        reason=reason,
        blocked_until=None if found is None else found.at,
        blocked_by=None if found is None else found.blocker,
    )


class _Lost(Exception):
    """Another pass moved the request first: roll back the booking made for it."""


@retry_on_transient
def _book_and_mark(request: QueuedRequest, *, now: datetime, starts_at: datetime | None = None) -> None:
    """Book the request from ``starts_at`` (default ``now``) and mark it started, in one transaction: when
    another pass (or a cancel, or a hold) moved it first, the conditional update finds nothing and the booking
    rolls back (raises _Lost). The booking carries the class: preemptible, its notice, its credit multiplier."""
    actor = request.created_by
    start = starts_at or now
    priority_class = request.priority_class
    reservation = reservation_create(
        project=request.project,
        name=request.name,
        spec=spec_of(request),
        window=Window(start, start + timedelta(seconds=request.duration_seconds)),
        container=container_of(request),
        actor=actor,
        now=now,
        preemptible=priority_class.preemptible,
        notice_seconds=priority_class.notice_seconds,
        credit_multiplier=priority_class.credit_multiplier,
    )
    changed = QueuedRequest.objects.filter(pk=request.pk, state=RequestState.QUEUED).update(
        state=RequestState.STARTED,
        reservation=reservation,
        started_at=now,
        reason="",
        blocked_until=None,
        blocked_by=None,
    )
    if not changed:
        raise _Lost
    _event(
        request,
        from_state=RequestState.QUEUED,
        to_state=RequestState.STARTED,
        actor=actor,
        reason=f"booked as reservation {reservation.public_id}",
        at=now,
    )


def _try_start(request_id: int, *, now: datetime, must_end_by: datetime | None = None) -> tuple[str, str]:
    """Book one request now. The outcome: "started", "busy" (its GPUs are not free), "waiting" (quota),
    "failed" or "skipped"; and the refusal's words, if any."""
    request = (
        QueuedRequest.objects.select_related("project", "created_by", "priority_class")
        .filter(pk=request_id, state=RequestState.QUEUED)
        .first()
    )
    if request is None:
        return "skipped", ""
    try:
        _book_and_mark(request, now=now)
    except _Lost:
        return "skipped", ""
    except Conflict as exc:
        # Preemption (scheduling/preemption.py): a non-preemptible class takes GPUs from preemptible
        # reservations, booked from when their notice allows.
        if exc.code in _BUSY_CODES and preemption.start_by_preempting(
            request, now=now, book=_book_and_mark, must_end_by=must_end_by
        ):
            return "started", ""
        return ("busy" if exc.code in _BUSY_CODES else "waiting"), exc.message
    except QuotaExceeded as exc:
        return "waiting", exc.message
    except ValidationFailed as exc:
        # What was valid at submit is not any more (a volume deleted, an egress network withdrawn).
        _fail(request.pk, reason=exc.message, now=now)
        return "failed", exc.message
    return "started", ""


@dataclass
class PassReport:
    """What one pass did: how many it started (by backfill among them), tried, and found blocked."""

    started: int = 0
    backfilled: int = 0
    tried: int = 0
    blocked: int = 0
    skipped_by_backfill_rule: int = 0
    queued: int = 0


def _covers(entry: Entry, busy: Entry) -> bool:
    """Whether ``entry`` is known not to fit now because ``busy`` did not: the same GPUs, count and kind, for
    at least as long (a shorter one may fit in a gap before a booking). Nothing frees GPUs during a pass."""
    return entry.spec == busy.spec and entry.duration >= busy.duration


def schedule_pass(*, now: datetime | None = None) -> int:
    """Start what fits now, in queue order, with EASY backfill; returns how many started (see run_pass)."""
    return run_pass(now=now).started


def run_pass(*, now: datetime | None = None, max_tries: int | None = None) -> PassReport:
    """One pass of the queue (docs/scheduling.md, "The pass").

    Requests past their ``start_by`` fail. The others, in queue order (class, fair share, first come), are
    booked for ``[now, now + duration)`` through the booking service. One whose GPUs are busy gets its
    shadow time, the earliest start the booked calendar leaves it; a request behind it is then tried only if
    its booking would end by the earliest shadow time of every blocked request ahead of it, so starting it
    delays none of them (EASY backfill). One refused by the quota waits with the reason and blocks nothing.
    At most ``max_tries`` (SCHEDULING_PASS_MAX_TRIES) requests are tried; the rest wait for the next pass.
    """
    now = now or timezone.now()
    limit = max_tries if max_tries is not None else int(settings.SCHEDULING_PASS_MAX_TRIES)
    late = QueuedRequest.objects.filter(state__in=_WAITING, start_by__lte=now).values_list("pk", flat=True)
    for request_id in list(late):
        _fail(request_id, reason=NOT_STARTED_BY, now=now)
    report = PassReport()
    queue = ordered_queue(now=now)
    report.queued = len(queue)
    # The blocked requests ahead, by shadow time: the earliest is the bound every later start must end by.
    earliest: tuple[datetime, Entry] | None = None
    busy: list[Entry] = []
    for entry in queue:
        if earliest is not None and now + entry.duration > earliest[0]:
            report.skipped_by_backfill_rule += 1
            reason = (
                f"waiting behind request {earliest[1].public_id}, which is blocked until {iso(earliest[0])}: "
                "started now, this one would end after that"
            )
            # Nothing is searched for it, and nothing written unless its reason changed: a long queue behind a
            # blocked request costs the pass one read, not a write per request.
            if reason != entry.reason:
                _wait(entry.id, reason)
            continue
        if report.tried >= limit:
            break
        report.tried += 1
        known_busy = any(_covers(entry, other) for other in busy)
        bound = earliest[0] if earliest is not None else None
        outcome, message = ("busy", "") if known_busy else _try_start(entry.id, now=now, must_end_by=bound)
        if outcome == "started":
            report.started += 1
            report.backfilled += earliest is not None
        elif outcome == "busy":
            report.blocked += 1
            busy.append(entry)
            found = shadow(entry.spec, duration=entry.duration, now=now)
            reason = found.reason(entry.spec)
            if reason != entry.reason:
                _wait(entry.id, reason, found)
            if earliest is None or found.at < earliest[0]:
                earliest = (found.at, entry)
        elif outcome == "waiting":
            _wait(entry.id, message)
    return report


def _operator_change(
    *, request: QueuedRequest, from_states: tuple[str, ...], to: str, actor: Any, reason: str, now: datetime | None
) -> QueuedRequest:
    now = now or timezone.now()
    current = QueuedRequest.objects.select_for_update().get(pk=request.pk)
    changed = QueuedRequest.objects.filter(pk=current.pk, state=current.state, state__in=from_states).update(state=to)
    if not changed:
        allowed = " or ".join(from_states)
        raise Conflict(f"A {current.state} request cannot be {to}: only a {allowed} one can.", code="invalid_state")
    _event(current, from_state=current.state, to_state=to, actor=actor, reason=reason, at=now)
    current.refresh_from_db()
    return current


@transaction.atomic
def request_hold(*, request: QueuedRequest, actor: Any, reason: str = "", now: datetime | None = None) -> QueuedRequest:
    """An operator keeps a queued request from starting: the pass skips it until it is released."""
    held = _operator_change(
        request=request,
        from_states=(RequestState.QUEUED,),
        to=RequestState.HELD,
        actor=actor,
        reason=reason or "held by an operator",
        now=now,
    )
    return held


@transaction.atomic
def request_release(
    *, request: QueuedRequest, actor: Any, reason: str = "", now: datetime | None = None
) -> QueuedRequest:
    """Put a held request back in the queue, at the place its class, fair share and age give it."""
    released = _operator_change(
        request=request,
        from_states=(RequestState.HELD,),
        to=RequestState.QUEUED,
        actor=actor,
        reason=reason or "released by an operator",
        now=now,
    )
    transaction.on_commit(trigger_pass)
    return released


@transaction.atomic
def request_set_class(
    *, request: QueuedRequest, priority_class: PriorityClass, actor: Any, reason: str = "", now: datetime | None = None
) -> QueuedRequest:
    """An operator moves a waiting request to another class (an event; the state is unchanged). The quota
    policy's class rules bind tenants at submit; an operator's choice overrides them."""
    now = now or timezone.now()
    current = QueuedRequest.objects.select_for_update().select_related("priority_class").get(pk=request.pk)
    before = current.priority_class.name
    changed = QueuedRequest.objects.filter(pk=current.pk, state=current.state, state__in=_WAITING).update(
        priority_class=priority_class
    )
    if not changed:
        raise Conflict(
            f"A {current.state} request cannot change class: only a queued or held one can.", code="invalid_state"
        )
    words = f"class {before} -> {priority_class.name}"
    _event(
        current,
        from_state=current.state,
        to_state=current.state,
        actor=actor,
        reason=f"{words}: {reason}" if reason else words,
        at=now,
    )
    transaction.on_commit(trigger_pass)
    current.refresh_from_db()
    return current


def requests_asking_secret(project_id: int, name: str) -> list[str]:
    """The project's queued or held requests whose container asks for the secret ``name`` (their ids)."""
    waiting = QueuedRequest.objects.filter(
        project_id=project_id, state__in=[RequestState.QUEUED, RequestState.HELD]
    ).values_list("public_id", "container")
    return [
        f"queued request {public_id}"
        for public_id, container in waiting
        if any(s.get("name") == name for s in (container or {}).get("secrets", []))
    ]
