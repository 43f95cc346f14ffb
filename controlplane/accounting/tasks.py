"""Accounting reconcilers (scheduled in settings.CELERY_BEAT_SCHEDULE). Each is idempotent."""

from __future__ import annotations

from celery import shared_task

from controlplane.accounting import rollup, services, statements
from controlplane.reservations.models import Reservation


@shared_task(name="controlplane.accounting.tasks.record_usage", ignore_result=True)
def record_usage(reservation_id: int) -> bool:
    """Record one final reservation's usage; dispatch may enqueue it on commit, the reconciler catches the rest."""
    reservation = Reservation.objects.filter(pk=reservation_id).first()
    return bool(reservation and services.usage_record_reservation(reservation=reservation))


@shared_task(name="controlplane.accounting.tasks.record_pending_usage", ignore_result=True)
def record_pending_usage() -> int:
    return services.usage_record_pending()


@shared_task(name="controlplane.accounting.tasks.rollup_usage_hours", ignore_result=True)
def rollup_usage_hours() -> int:
    return rollup.rollup_pending()


@shared_task(name="controlplane.accounting.tasks.generate_monthly_statements", ignore_result=True)
def generate_monthly_statements() -> int:
    return statements.statements_generate_due()


@shared_task(name="controlplane.accounting.tasks.reclaim_idle", ignore_result=True)
def reclaim_idle() -> int:
    from controlplane.accounting import reclaim

    return reclaim.idle_reclaim_pass()
