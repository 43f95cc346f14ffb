"""Project volumes, datasets and egress networks: their writes, and what a booking may mount (docs/volumes.md).

Every write to a project's volumes, and every booking that mounts one, runs under the project's lock
(``ledger.services.lock_project``), so "is this non-shared volume free over this window?" and "is it mounted
by a live reservation?" stay true until the transaction commits. Deleting a volume forgets it here; the data
on the agents' storage is left as it is.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from controlplane.access import storage
from controlplane.access.models import NAME_MAX, SIZE_LIMIT_MAX_GIB, Dataset, ProjectNetwork, Volume, name_validator
from controlplane.accounts.models import Project
from controlplane.core.errors import Conflict, NotFound, ValidationFailed
from controlplane.dispatch.models import Launch
from controlplane.inventory.models import Server
from controlplane.ledger.services import actor_label_for, lock_project
from controlplane.reservations.choices import HOLDING_STATES
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import MountRequest, Window
from nodeagent.schema import ProjectSlug, VolumeUsage

log = logging.getLogger(__name__)
_PROJECT_DIR: TypeAdapter[str] = TypeAdapter(ProjectSlug)


def _fields(**by_field: str) -> dict[str, list[str]]:
    return {name.replace("__", "."): [message] for name, message in by_field.items()}


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValidationFailed("name: This field is required.", fields=_fields(name="This field is required."))
    if len(name) > NAME_MAX:
        message = f"Ensure this field has no more than {NAME_MAX} characters."
        raise ValidationFailed(f"name: {message}", fields=_fields(name=message))
    try:
        name_validator(name)
    except Exception:  # django's ValidationError: reworded in the API's shape
        message = str(name_validator.message)
        raise ValidationFailed(f"name: {message}", code="invalid_name", fields=_fields(name=message)) from None
    return name


def _check_size(size: Any) -> int:
    if type(size) is not int or not 1 <= size <= SIZE_LIMIT_MAX_GIB:
        message = f"Must be a whole number of GiB from 1 to {SIZE_LIMIT_MAX_GIB}."
        raise ValidationFailed(f"size_limit_gib: {message}", fields=_fields(size_limit_gib=message))
    return size


def live_mounts(
    *, project_id: int, names: Iterable[str], window: Window | None = None, exclude_reservation_id: int | None = None
) -> list[tuple[str, Reservation]]:
    """(volume name, reservation) for each live reservation of the project (pending to ending) that mounts one
    of ``names``, within ``window`` when given. A volume belongs to one project, so only that project's
    reservations can mount it: this reads that project's live ones (indexed by project and state)."""
    wanted = set(names)
    qs = Reservation.objects.filter(project_id=project_id, state__in=sorted(HOLDING_STATES))
    if window is not None:
        qs = qs.filter(starts_at__lt=window.ends_at, ends_at__gt=window.starts_at)
    if exclude_reservation_id is not None:
        qs = qs.exclude(pk=exclude_reservation_id)
    out = []
    for reservation in qs.only("pk", "public_id", "starts_at", "ends_at", "state", "volumes").order_by("starts_at"):
        for mount in reservation.volumes or []:
            if mount.get("kind") == "volume" and mount.get("name") in wanted:
                out.append((str(mount["name"]), reservation))
    return out


def _in_use(name: str, reservation: Reservation) -> str:
    return (
        f"Volume {name!r} is mounted by reservation {reservation.public_id} ({reservation.state}, "
        f"{reservation.starts_at.isoformat()} to {reservation.ends_at.isoformat()})"
    )


# -- what a booking may mount -------------------------------------------------------------------------------


def resolve_mounts(
    *,
    project: Project,
    volumes: Sequence[MountRequest],
    network: str,
    window: Window,
    exclude_reservation_id: int | None = None,
    overlap_only: bool = False,
) -> list[dict[str, Any]]:
    """The reservations hook (``reservations.hooks.resolve_mounts``): check what a booking mounts, and give the
    mounts as the reservation stores them. Caller holds ``lock_project``.

    400 naming the field: an unknown volume (another project's reads the same), a dataset the project may not
    mount (or none of that name), egress for a project without an egress network. 409 ``volume_over_limit``:
    the volume's last measurement is over its size limit. 409 ``volume_in_use``: a non-shared volume is
    mounted by another live reservation whose window overlaps. ``overlap_only`` (an extension): the last only,
    naming ``ends_at``.
    """
    volume_names = sorted({m.name for m in volumes if m.kind == "volume"})
    dataset_names = sorted({m.name for m in volumes if m.kind == "dataset"})
    found = {v.name: v for v in Volume.objects.filter(project=project, name__in=volume_names)}
    fields: dict[str, list[str]] = {}
    if not overlap_only:
        allowed = set(
            Dataset.objects.filter(name__in=dataset_names, allowed_projects=project).values_list("name", flat=True)
        )
        for i, mount in enumerate(volumes):
            if mount.kind == "volume" and mount.name not in found:
                fields[f"container.volumes.{i}.volume"] = [f"Project {project.slug} has no volume {mount.name!r}."]
            elif mount.kind == "dataset" and mount.name not in allowed:
                fields[f"container.volumes.{i}.dataset"] = [
                    f"There is no dataset {mount.name!r} that project {project.slug} may mount."
                ]
        if network == "egress" and not ProjectNetwork.objects.filter(project=project).exists():
            fields["container.network"] = [
                f"Egress is not allowed for project {project.slug}; an operator must allow it first."
            ]
        if fields:
            raise ValidationFailed("; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items()), fields=fields)
        for i, mount in enumerate(volumes):
            volume = found.get(mount.name) if mount.kind == "volume" else None
            if volume is not None and volume.over_limit:
                message = (
                    f"Volume {volume.name!r} held {volume.used_bytes} bytes when last measured "
                    f"({volume.measured_at.isoformat() if volume.measured_at else 'never'}), over its limit of "
                    f"{volume.size_limit_gib} GiB; free space in it or raise its size_limit_gib first."
                )
                raise Conflict(
                    message,
                    code="volume_over_limit",
                    fields={f"container.volumes.{i}.volume": [message]},
                    extra={"volume": volume.name, "used_bytes": volume.used_bytes, "limit_bytes": volume.limit_bytes},
                )
    exclusive = [name for name, volume in found.items() if not volume.shared]
    if exclusive:
        clashes = live_mounts(
            project_id=project.pk, names=exclusive, window=window, exclude_reservation_id=exclude_reservation_id
        )
        if clashes:
            name, other = clashes[0]
            index = next(i for i, m in enumerate(volumes) if m.kind == "volume" and m.name == name)
            message = f"{_in_use(name, other)}, and it is not shared; choose another window or another volume."
            field = "ends_at" if overlap_only else f"container.volumes.{index}.volume"
            raise Conflict(
                message,
                code="volume_in_use",
                fields={field: [message]},
                extra={"volume": name, "reservation": str(other.public_id)},
            )
    return [{"kind": m.kind, "name": m.name, "path": m.mount_path, "read_only": m.mount_read_only} for m in volumes]


# -- volume writes ----------------------------------------------------------------------------------------


@transaction.atomic
def volume_create(*, project: Project, name: str, size_limit_gib: int, shared: bool = False, actor: Any) -> Volume:
    """A new volume of ``project``. 400 naming the field: a bad or taken name, a size out of range."""
    name = _check_name(name)
    size_limit_gib = _check_size(size_limit_gib)
    try:
        # The agent's rule for a project's directory: a volume it could never mount is refused now.
        _PROJECT_DIR.validate_python(project.slug)
    except PydanticValidationError:
        message = f"Project {project.slug}'s slug cannot name a directory on the agents' storage."
        raise ValidationFailed(message, code="invalid_project", fields={"project": [message]}) from None
    lock_project(project_id=project.pk)
    if Volume.objects.filter(project=project, name=name).exists():
        message = f"Project {project.slug} has a volume named {name!r} already."
        raise ValidationFailed(message, code="duplicate_name", fields=_fields(name=message))
    now = timezone.now()
    try:
        with transaction.atomic():
            volume = Volume.objects.create(
                project=project,
                name=name,
                size_limit_gib=size_limit_gib,
                shared=bool(shared),
                created_by=actor if getattr(actor, "pk", None) else None,
                created_at=now,
                # Charged from the hour it was created in (storage.py).
                charged_until=storage.hour_of(now),
            )
    except IntegrityError:
        # SQLite has no row lock: a concurrent create of the same name can still win here.
        message = f"Project {project.slug} has a volume named {name!r} already."
        raise ValidationFailed(message, code="duplicate_name", fields=_fields(name=message)) from None
    log.info(
        "volume created: project=%s volume=%s size_gib=%s shared=%s by=%s",
        project.slug, name, size_limit_gib, volume.shared, actor_label_for(actor),
    )  # fmt: skip
    return volume


@transaction.atomic
def volume_update(
    *, volume: Volume, actor: Any, size_limit_gib: int | None = None, shared: bool | None = None
) -> Volume:
    """Change a volume's size limit or whether it is shared (its name is its directory: it does not change).

    Making a volume non-shared is refused (409 ``volume_in_use``) while two live reservations that mount it
    overlap: the rule would be broken the moment it was set.
    """
    lock_project(project_id=volume.project_id)
    current = Volume.objects.select_for_update().get(pk=volume.pk)
    if size_limit_gib is not None:
        current.size_limit_gib = _check_size(size_limit_gib)
    if shared is not None:
        if current.shared and not shared:
            mounts = [r for _, r in live_mounts(project_id=current.project_id, names=[current.name])]
            # Sorted by start: if no neighbours overlap, the ends rise too, and no two overlap at all.
            for before, after in itertools.pairwise(mounts):
                if after.starts_at < before.ends_at:
                    message = (
                        f"Reservations {before.public_id} and {after.public_id} mount volume {current.name!r} in "
                        "overlapping windows; it can stop being shared when they no longer overlap."
                    )
                    raise Conflict(message, code="volume_in_use", fields=_fields(shared=message))
        current.shared = bool(shared)
    current.save(update_fields=["size_limit_gib", "shared"])
    log.info(
        "volume changed: project=%s volume=%s size_gib=%s shared=%s by=%s",
        current.project_id, current.name, current.size_limit_gib, current.shared, actor_label_for(actor),
    )  # fmt: skip
    return current


@transaction.atomic
def volume_delete(*, volume: Volume, actor: Any, now: datetime | None = None) -> None:
    """Forget a volume: 409 ``volume_in_use`` while a live reservation (pending to ending) mounts it.

    The hours it existed in and that were not charged yet are charged now (storage.py). The directory on the
    agents' storage is not touched: an operator removes it, and a new volume of the same name finds it again.
    """
    now = now or timezone.now()
    lock_project(project_id=volume.project_id)
    current = Volume.objects.select_for_update().filter(pk=volume.pk).first()
    if current is None:
        raise NotFound("No such volume.")
    mounted = live_mounts(project_id=current.project_id, names=[current.name])
    if mounted:
        message = f"{_in_use(*mounted[0])}; cancel it, or wait until it ends, before deleting the volume."
        raise Conflict(message, code="volume_in_use", extra={"reservation": str(mounted[0][1].public_id)})
    # Everything left, the hour it is deleted in included; a year is far past what the task ever leaves behind.
    storage.charge_volume(volume=current, through=now, including_current=True, max_hours=24 * 400)
    current.delete()
    log.info(
        "volume deleted (its data is left on disk): project=%s volume=%s by=%s",
        current.project_id, current.name, actor_label_for(actor),
    )  # fmt: skip


@transaction.atomic
def project_network_set(*, project: Project, network_name: str | None, actor: Any) -> ProjectNetwork | None:
    """An operator allows a project's egress on a Docker network, or (None) withdraws it. A withdrawal reaches
    booked reservations too: their next launch runs with no network."""
    from controlplane.access.models import RESERVED_NETWORKS, network_validator

    lock_project(project_id=project.pk)
    if network_name is None:
        ProjectNetwork.objects.filter(project=project).delete()
        log.info("egress withdrawn: project=%s by=%s", project.slug, actor_label_for(actor))
        return None
    try:
        network_validator(network_name)
    except Exception:
        message = str(network_validator.message)
        raise ValidationFailed(f"network_name: {message}", fields=_fields(network_name=message)) from None
    if network_name in RESERVED_NETWORKS or len(network_name) > 128:
        message = f"{network_name!r} cannot be an egress network: name the Docker network made for it."
        raise ValidationFailed(f"network_name: {message}", fields=_fields(network_name=message))
    network, _ = ProjectNetwork.objects.update_or_create(
        project=project,
        defaults={
            "network_name": network_name,
            "updated_by": actor if getattr(actor, "pk", None) else None,
            "updated_at": timezone.now(),
        },
    )
    log.info("egress allowed: project=%s network=%s by=%s", project.slug, network_name, actor_label_for(actor))
    return network


# -- usage the agents report ------------------------------------------------------------------------------


def volumes_reported(server: Server, usages: Sequence[VolumeUsage], now: datetime) -> None:
    """The fleet hook: record each volume's measurement unless a newer one is recorded already (two agents on
    shared storage may report one volume, and a report may arrive late). Only volumes of projects that have
    had a launch on ``server``: an agent speaks for what its node ran (invariant 6)."""
    if not usages:
        return
    slugs = {u.project for u in usages}
    ran_here = dict(
        Project.objects.filter(
            slug__in=slugs, pk__in=Launch.objects.filter(server=server).values("reservation__project_id")
        ).values_list("slug", "pk")
    )
    newest: dict[tuple[int, str], VolumeUsage] = {}
    for usage in usages:
        project_id = ran_here.get(usage.project)
        if project_id is None:
            continue
        # An agent's clock ahead of ours must not make its measurement "newer" than every later one.
        at = usage.measured_at if timezone.is_aware(usage.measured_at) else usage.measured_at.replace(tzinfo=UTC)
        usage = usage.model_copy(update={"measured_at": min(at, now)})
        key = (project_id, usage.name)
        if key not in newest or usage.measured_at > newest[key].measured_at:
            newest[key] = usage
    if not newest:
        return
    match = Q()
    for project_id, name in newest:
        match |= Q(project_id=project_id, name=name)
    for volume_id, project_id, name, measured_at in Volume.objects.filter(match).values_list(
        "pk", "project_id", "name", "measured_at"
    ):
        usage = newest[(project_id, name)]
        if measured_at is not None and measured_at >= usage.measured_at:
            continue
        # Conditional: a newer measurement written meanwhile by another heartbeat wins.
        Volume.objects.filter(pk=volume_id).filter(
            Q(measured_at__isnull=True) | Q(measured_at__lt=usage.measured_at)
        ).update(used_bytes=usage.used_bytes, measured_at=usage.measured_at)
