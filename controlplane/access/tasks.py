"""Access reconcilers (scheduled in settings.CELERY_BEAT_SCHEDULE). Each is idempotent."""

from __future__ import annotations

from celery import shared_task

from controlplane.access import storage


@shared_task(name="controlplane.access.tasks.charge_volume_storage", ignore_result=True)
def charge_volume_storage() -> int:
    """Charge the storage hours that ended, per volume; how many volume-hours were charged (0: nothing due)."""
    return storage.storage_charge_due()
