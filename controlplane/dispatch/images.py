"""Images ahead of their windows (docs/images.md): what each node should pull now, and what its agent says of it.

Every heartbeat of an agent that pulls (``NodeFacts.pulls``) is answered with the images of the reservations
scheduled on that server whose windows open within ``IMAGES_PREPULL_LEAD_S``: one ``PrePull`` per image and
project (each project pulls with its own credentials), naming the reservations that need it. A booking whose
window is nearer than the lead is in the next heartbeat's answer.

The agent reports each image (``Heartbeat.images``) on every change: pulling (with progress), present (with the
digest), failed (with the registry's reason). Each report becomes the latest figures of an ``ImagePull`` row per
(server, reservation, image), and each change of state an event on the reservation: a failure also notifies the
project (``reservation.image_failed``), before the window, so a wrong tag or a revoked token is fixed in time.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from controlplane.dispatch.models import ImagePull
from controlplane.inventory.models import Server
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from controlplane.reservations.services import reservation_mark
from controlplane.vault.services import registry_auths_for
from nodeagent import schema

ACTOR = "system:images"


def prepull_lead() -> timedelta:
    return timedelta(seconds=int(getattr(settings, "IMAGES_PREPULL_LEAD_S", 1800)))


def prepull_for(*, server: Server, now: datetime) -> list[schema.PrePull]:
    """The images ``server`` should hold for the reservations scheduled on it whose windows open within the lead."""
    rows = (
        Reservation.objects.filter(
            state=ReservationState.SCHEDULED,
            starts_at__lte=now + prepull_lead(),
            ends_at__gt=now,
            allocations__active=True,
            allocations__gpu__server=server,
        )
        .values_list("public_id", "project_id", "image", "starts_at")
        .distinct()
        .order_by("starts_at", "public_id")
    )
    wanted: dict[tuple[str, int], tuple[list[str], datetime]] = {}
    for public_id, project_id, image, starts_at in rows:
        ids, _first = wanted.setdefault((image, project_id), ([], starts_at))
        if len(ids) < schema.MAX_PREPULLS:
            ids.append(str(public_id))
    auths = registry_auths_for({(project_id, image) for image, project_id in wanted})
    pulls = [
        schema.PrePull(image=image, registry_auth=auths.get((project_id, image)), reservations=ids, needed_at=needed_at)
        for (image, project_id), (ids, needed_at) in wanted.items()
    ]
    return pulls[: schema.MAX_PREPULLS]


def _megabytes(size: int | None) -> str:
    return f"{size / 1e6:.1f} MB" if size is not None else "size unknown"


def _sentence(report: schema.ImageReport, host: str) -> str:
    if report.state == "pulling":
        return f"pulling {report.image} on {host} ahead of the window"
    if report.state == "present":
        progress = report.progress
        took = f" in {progress.seconds:.1f} s ({progress.layers_total} layers)" if progress else ""
        digest = report.digest or "digest unknown"
        return f"{report.image} is on {host}{took}: {digest}, {_megabytes(report.size_bytes)}"
    return f"{report.image} could not be pulled on {host}: {report.error or 'no reason given'}"


def _figures(report: schema.ImageReport, host: str) -> dict[str, Any]:
    figures: dict[str, Any] = {"server": host, "image": report.image, "state": report.state}
    if report.digest:
        figures["digest"] = report.digest
    if report.size_bytes is not None:
        figures["size_bytes"] = report.size_bytes
    if report.progress is not None:
        figures["progress"] = report.progress.model_dump(mode="json")
    if report.error:
        figures["error"] = report.error
    return figures


def _public_ids(values: Sequence[str]) -> list[uuid.UUID]:
    ids = []
    for value in values:
        try:
            ids.append(uuid.UUID(value))
        except ValueError:
            continue  # not one of ours: nothing to record
    return ids


def images_reported(*, server: Server, reports: Sequence[schema.ImageReport], now: datetime) -> None:
    """Fold the agent's image reports into ``ImagePull`` rows and the reservations' events.

    Only reservations with GPUs on ``server`` are touched: an agent cannot speak for another node's work. Reports
    are repeated until a heartbeat is answered, so one older than the row's is ignored, and an unchanged state
    writes no second event."""
    for report in reports:
        ids = _public_ids(report.reservations)
        if not ids:
            continue
        reservations = Reservation.objects.filter(public_id__in=ids, allocations__gpu__server=server).distinct()
        for reservation in reservations:
            _record(server, reservation, report)


def _record(server: Server, reservation: Reservation, report: schema.ImageReport) -> None:
    values = {
        "state": report.state,
        "digest": report.digest or "",
        "size_bytes": report.size_bytes,
        "progress": report.progress.model_dump(mode="json") if report.progress is not None else None,
        "error": report.error or "",
        "reported_at": report.at,
    }
    pull, created = ImagePull.objects.get_or_create(
        server=server, reservation=reservation, image=report.image, defaults=values
    )
    previous = None if created else pull.state
    if not created:
        if report.at < pull.reported_at:
            return
        ImagePull.objects.filter(pk=pull.pk).update(**values)
    if previous == report.state:
        return
    reservation_mark(
        reservation=reservation,
        from_states=[reservation.state],
        to=reservation.state,
        actor_label=ACTOR,
        reason=_sentence(report, server.hostname),
        data={"image": _figures(report, server.hostname)},
    )
