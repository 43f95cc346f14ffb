"""The queue's workflows: submit, cancel, and the pass that starts what fits (docs/scheduling.md).

A queued request holds nothing: no GPUs, no credits. The pass books it through
``reservations.services.reservation_create``, the one definition of a valid booking and of placement, for
``[now, now + duration)``: it can only take GPUs no reservation holds, so an advance reservation is never
delayed by the queue.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.core.db import retry_on_transient
from controlplane.core.errors import Conflict, QuotaExceeded, ValidationFailed
from controlplane.inventory.models import Gpu
from controlplane.ledger.services import QuotaNeed, actor_label_for, check_quota, credits, lock_project
from controlplane.reservations import capacity, costs
from controlplane.reservations.selectors import _spec_q
from controlplane.reservations.services import reservation_create
from controlplane.reservations.specs import ContainerSpec, GpuSpec, MountRequest, Window
from controlplane.scheduling import preemption
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import PriorityClass, QueuedRequest, QueuedRequestEvent

log = logging.getLogger(__name__)

NOT_STARTED_BY = "not started by start_by"
# Codes of a booking refused because the GPUs are not free now: the request waits, and blocks those behind it.
_BUSY_CODES = frozenset({"no_capacity", "gpu_taken"})


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
    }


def container_of(request: QueuedRequest) -> ContainerSpec:
    data = dict(request.container)
    data["volumes"] = [MountRequest(**m) for m in data.get("volumes", [])]
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
        need=QuotaNeed(credits=needed, hours=hours, peak_concurrent_gpus=spec.gpu_count or 0),
    )


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
    """Queue a request. Raises ValidationFailed for a bad one, Conflict ``no_capacity`` when the fleet has too
    few matching GPUs for it ever to start, QuotaExceeded when the project's quota rules it out."""
    now = now or timezone.now()
    name = (name or "").strip()
    if not name:
        raise ValidationFailed("name: This field is required.", fields={"name": ["This field is required."]})
    spec.validate()
    container.validate()
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
    """Take a request off the queue; only while it is queued (409 ``invalid_state`` after)."""
    now = now or timezone.now()
    current = QueuedRequest.objects.select_for_update().get(pk=request.pk)
    changed = QueuedRequest.objects.filter(pk=current.pk, state=RequestState.QUEUED).update(
        state=RequestState.CANCELLED, reason=reason or "cancelled"
    )
    if not changed:
        raise Conflict(
            f"A {current.state} request cannot be cancelled: only a queued one can "
            "(cancel a started one's reservation instead).",
            code="invalid_state",
        )
    _event(
        current,
        from_state=RequestState.QUEUED,
        to_state=RequestState.CANCELLED,
        actor=actor,
        reason=reason or "cancelled",
        at=now,
    )
    current.refresh_from_db()
    return current


def queue_order() -> list[str]:
    """How the pass orders the queue: class rank, highest first, then first come, first served."""
    return ["-priority_class__rank", "created_at", "id"]


@transaction.atomic
def _fail(request_id: int, *, reason: str, now: datetime) -> None:
    changed = QueuedRequest.objects.filter(pk=request_id, state=RequestState.QUEUED).update(
        state=RequestState.FAILED, reason=reason
    )
    if changed:
        request = QueuedRequest.objects.get(pk=request_id)
        _event(
            request,
            from_state=RequestState.QUEUED,
            to_state=RequestState.FAILED,
            actor=None,
            reason=reason,
            at=now,
        )


def _wait(request_id: int, reason: str) -> None:
    QueuedRequest.objects.filter(pk=request_id, state=RequestState.QUEUED).update(reason=reason)


class _Lost(Exception):
    """Another pass moved the request first: roll back the booking made for it."""


@retry_on_transient
def _book_and_mark(request: QueuedRequest, *, now: datetime, starts_at: datetime | None = None) -> None:
    """Book the request from ``starts_at`` (default ``now``) and mark it started, in one transaction: when
    another pass (or a cancel) moved it first, the conditional update finds nothing and the booking rolls
    back (raises _Lost). The booking carries the class: preemptible, its notice, its credit multiplier."""
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
        state=RequestState.STARTED, reservation=reservation, started_at=now, reason=""
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


def _try_start(request_id: int, *, now: datetime) -> str:
    """One decision: "started", "busy" (the GPUs are not free), "waiting" (quota), "failed" or "skipped"."""
    request = (
        QueuedRequest.objects.select_related("project", "created_by", "priority_class")
        .filter(pk=request_id, state=RequestState.QUEUED)
        .first()
    )
    if request is None:
        return "skipped"
    try:
        _book_and_mark(request, now=now)
    except _Lost:
        return "skipped"
    except Conflict as exc:
        # Preemption (scheduling/preemption.py): a non-preemptible class takes GPUs from preemptible
        # reservations, booked from when their notice allows.
        if exc.code in _BUSY_CODES and preemption.start_by_preempting(request, now=now, book=_book_and_mark):
            return "started"
        _wait(request.pk, exc.message)
        return "busy" if exc.code in _BUSY_CODES else "waiting"
    except QuotaExceeded as exc:
        _wait(request.pk, exc.message)
        return "waiting"
    except ValidationFailed as exc:
        # What was valid at submit is not any more (a volume deleted, an egress network withdrawn).
        _fail(request.pk, reason=exc.message, now=now)
        return "failed"
    return "started"


def schedule_pass(*, now: datetime | None = None) -> int:
    """Start what fits now, one decision at a time, in queue order; returns how many started.

    Requests past their ``start_by`` fail. The others are booked for ``[now, now + duration)``; the first
    whose GPUs are not free stops the pass, so nothing behind it (of its class or a lower one) starts before
    it. One refused by the quota waits with the reason and does not block the rest.
    """
    now = now or timezone.now()
    late = QueuedRequest.objects.filter(state=RequestState.QUEUED, start_by__lte=now).values_list("pk", flat=True)
    for request_id in list(late):
        _fail(request_id, reason=NOT_STARTED_BY, now=now)
    started = 0
    queued = QueuedRequest.objects.filter(state=RequestState.QUEUED).order_by(*queue_order())
    for request_id in list(queued.values_list("pk", flat=True)):
        outcome = _try_start(request_id, now=now)
        if outcome == "started":
            started += 1
        elif outcome == "busy":
            break
    return started
