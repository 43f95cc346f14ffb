"""Storage charges: each volume's size limit, per GiB-hour, through the ledger (docs/volumes.md, "Charges").

A volume is charged for its provisioned size, as cloud block storage is, not for what it holds: every UTC hour
it existed in, even in part, once. ``Volume.charged_until`` is the end of the last hour charged; a charge
moves it forward, under the project's lock and the volume's row lock, in the transaction that writes the
ledger entries, so an hour is charged once however often the task runs, and however many run at once.

Each hour is one ledger entry of kind ``charge`` with no reservation, ``period_key`` the hour
(``2026-11-03T14``) and ``data`` naming the volume. When the project's credits run out the charge is capped at
the balance and the rest recorded as ``data.uncharged``, as a reservation's overrun is: the ledger never goes
below zero. The volume is kept; the project cannot book GPUs without credits anyway.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.ledger.services import STORAGE_DATA_KIND, credits, hour_key_for, ledger_charge_capped, lock_project

if TYPE_CHECKING:
    from controlplane.access.models import Volume

HOUR = timedelta(hours=1)
ACTOR = "system:storage"
# Hours one volume is charged for in one transaction; a task that was down for long catches up over runs.
MAX_HOURS_PER_VOLUME = 24 * 7


def hour_of(when: datetime) -> datetime:
    return when.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def rate() -> Decimal:
    """Credits per GiB-hour of size limit: ``ACCESS_VOLUME_CREDITS_PER_GIB_HOUR``."""
    return Decimal(str(getattr(settings, "ACCESS_VOLUME_CREDITS_PER_GIB_HOUR", "0.001")))


def charge_volume(
    *, volume: Volume, through: datetime, including_current: bool = False, max_hours: int = MAX_HOURS_PER_VOLUME
) -> int:
    """Charge the hours from ``volume.charged_until`` that ended by ``through`` (and, ``including_current``,
    the hour holding ``through``: a volume deleted now), at most ``max_hours``. How many were charged.
    Caller holds ``lock_project`` and the volume's row lock (or deletes it in the same transaction)."""
    from controlplane.access.models import Volume

    end = hour_of(through) + (HOUR if including_current else timedelta(0))
    start = volume.charged_until
    hours: list[datetime] = []
    hour = start
    while hour < end and len(hours) < max_hours:
        hours.append(hour)
        hour += HOUR
    if not hours:
        return 0
    # The cursor first: a count of 0 means another transaction charged these hours already.
    if Volume.objects.filter(pk=volume.pk, charged_until=start).update(charged_until=hour) != 1:
        return 0
    volume.charged_until = hour
    per_gib = rate()
    amount = credits(Decimal(volume.size_limit_gib) * per_gib)
    for charged in hours:
        key = hour_key_for(charged)
        if amount <= 0:
            continue
        ledger_charge_capped(
            project_id=volume.project_id,
            used=amount,
            reason=f"storage of volume {volume.name} ({volume.size_limit_gib} GiB) for {key}:00 UTC",
            actor_label=ACTOR,
            period_key=key,
            data={
                "kind": STORAGE_DATA_KIND,
                "volume": volume.name,
                "volume_id": volume.pk,
                "hour": charged.isoformat(),
                "gib": volume.size_limit_gib,
                "rate": str(per_gib),
            },
        )
    return len(hours)


def storage_charge_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """The beat task's service: charge the ended hours of volumes behind, oldest first, up to ``limit``
    volume-hours; each volume in a transaction of its own. How many volume-hours were charged."""
    from controlplane.access.models import Volume

    now = now or timezone.now()
    due = list(
        Volume.objects.filter(charged_until__lte=hour_of(now) - HOUR)
        .order_by("charged_until", "pk")
        .values_list("pk", "project_id")[:limit]
    )
    charged = 0
    for volume_id, project_id in due:
        if charged >= limit:
            break
        with transaction.atomic():
            lock_project(project_id=project_id)
            volume = Volume.objects.select_for_update().filter(pk=volume_id).first()
            if volume is None:  # deleted meanwhile; its delete charged what was left
                continue
            charged += charge_volume(volume=volume, through=now, max_hours=min(MAX_HOURS_PER_VOLUME, limit - charged))
    return charged
