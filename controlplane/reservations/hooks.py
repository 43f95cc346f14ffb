"""What the reservation API asks of apps above it, filled in by those apps' ``AppConfig.ready()``.

The detail of a reservation shows how to reach it (``access``: the SSH command and host key of each server it
runs on). That depends on launches and on the agents' gateways, which live above this app; the access app
registers the reader here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane.core.hooks import RequiredHook

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


# -- Mounts and networks (docs/volumes.md) ---------------------------------------------------------------------
# Volumes, datasets and egress networks belong to the access app, above this one. A booking or an extension
# asks it, under the project's lock, to resolve what the container asks for; the access app registers
# ``MountsResolver`` here. It raises the domain error (400 naming the field, 409 volume_over_limit or
# volume_in_use) or returns the mounts as the reservation stores them.
MountsResolver = Callable[..., list[dict[str, Any]]]
_mounts: MountsResolver | None = None


def register_mounts(resolver: MountsResolver) -> None:
    global _mounts
    _mounts = resolver


def resolve_mounts(
    *, project: Any, volumes: list[Any], network: str, window: Any, exclude_reservation_id: int | None = None
) -> list[dict[str, Any]]:
    """The mounts ``volumes`` (``specs.MountRequest``) resolve to for ``project`` over ``window``, checked
    against the project's volumes, the datasets it may mount and its egress network. Caller holds
    ``lock_project``. Nothing asked, nothing read."""
    from controlplane.core.errors import ValidationFailed

    if not volumes and network == "none":
        return []
    if _mounts is None:
        field = "container.volumes" if volumes else "container.network"
        message = "Volumes and networks are not part of this installation."
        raise ValidationFailed(message, fields={field: [message]})
    return _mounts(
        project=project,
        volumes=volumes,
        network=network,
        window=window,
        exclude_reservation_id=exclude_reservation_id,
        overlap_only=False,
    )


def recheck_volumes_free(*, project: Any, volumes: list[dict[str, Any]], window: Any, reservation_id: int) -> None:
    """An extension's check: the reservation's stored mounts (``Reservation.volumes``) are free of other live
    reservations over ``window`` (its added part). Only the overlap: a volume over its limit, or an egress
    network withdrawn since, does not stop a booked window from growing. Caller holds ``lock_project``."""
    from controlplane.reservations.specs import mounts_from_stored

    if _mounts is None or not any(m.get("kind") == "volume" for m in volumes):
        return
    requests = [m for m in mounts_from_stored(volumes) if m.kind == "volume"]
    _mounts(
        project=project,
        volumes=requests,
        network="none",
        window=window,
        exclude_reservation_id=reservation_id,
        overlap_only=True,
    )


# -- Capacity freed (docs/scheduling.md) -----------------------------------------------------------------------
# When a reservation stops holding GPUs (finished, cancelled, released early), apps above this one may want to
# act at once: the scheduling app runs its queue pass. Called after the transaction commits, never inside it.
FinishedListener = Callable[[Any], None]
_on_finished: list[FinishedListener] = []


def register_on_finished(listener: FinishedListener) -> None:
    if listener not in _on_finished:
        _on_finished.append(listener)


def finished(reservation: Any) -> None:
    """Tell the listeners, once the current transaction commits, that ``reservation`` freed its GPUs."""
    from django.db import transaction

    def notify() -> None:
        for listener in list(_on_finished):
            listener(reservation)

    transaction.on_commit(notify)


# -- Dispatch (docs/dispatch.md) -------------------------------------------------------------------------------
# Launching is dispatch's, above this app, and no booking may go without it: these are required hooks, so an
# installation without dispatch fails the booking loudly rather than booking windows nothing ever opens. Both
# run inside the booking's (or the change's) transaction; dispatch acts once it commits.
# (reservation, now): a booking committed; dispatch opens its window on time.
booked: RequiredHook[[Any, Any], None] = RequiredHook("reservations.booked", provider="controlplane.dispatch")
# (reservation): a cancel, release or extension; dispatch re-sends the desired state of its servers.
changed: RequiredHook[[Any], None] = RequiredHook("reservations.changed", provider="controlplane.dispatch")

# -- Yielded (docs/reservations.md, "Yielding") ------------------------------------------------------------------
# When a reservation is cut short by reservation_yield (a preemption: ``by`` is the winner), apps above this one
# may act in the same transaction: the scheduling app puts a ``requeue: true`` request's job back in the queue.
YieldedListener = Callable[[Any, Any, Any], None]
_on_yielded: list[YieldedListener] = []


def register_on_yielded(listener: YieldedListener) -> None:
    if listener not in _on_yielded:
        _on_yielded.append(listener)


def yielded(reservation: Any, by: Any, at: Any) -> None:
    """Tell the listeners, inside the yielding transaction, that ``reservation`` was cut short by ``by``
    (a reservation, or None) at ``at``."""
    for listener in list(_on_yielded):
        listener(reservation, by, at)


# -- Launch templates (docs/templates.md) -----------------------------------------------------------------------
# A booking may name a template (``"template": "<name>"``); the templates app, above this one, writes it out
# into the request before the one reading of a booking judges it. Registered by the templates app; without it a
# booking naming a template is a 400 naming the field.
TemplateExpander = Callable[..., tuple[dict[str, Any], str]]
_templates: TemplateExpander | None = None


def register_templates(expander: TemplateExpander) -> None:
    global _templates
    _templates = expander


def expand_template(data: dict[str, Any], *, project: Any, queue: bool = False) -> tuple[dict[str, Any], str]:
    """``data`` (a booking request naming a template) written out with the template's values, and the
    template's name; ``project`` is the booking's, when the view has read it (its own templates shadow the
    operator-wide ones), else None. ``queue``: a queued request's body (its length is ``duration``, not a
    window)."""
    from controlplane.core.errors import ValidationFailed

    if _templates is None:
        message = "Launch templates are not part of this installation."
        raise ValidationFailed(message, fields={"template": [message]})
    return _templates(data, project=project, queue=queue)
