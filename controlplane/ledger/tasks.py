from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from controlplane.accounts.models import Project
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.ledger.services import ledger_grant_period, period_key_for


@shared_task
def grant_period_credits() -> bool:
    """Grant this period's credits to one project that has a policy and no grant for the period yet.

    Returns whether it found one, so beat's next run picks up the next project; the unique grant per
    (project, period) makes a duplicate run a no-op.
    """
    now = timezone.now()
    granted = LedgerEntry.objects.filter(kind=EntryKind.GRANT, period_key=period_key_for(now)).values("project_id")
    project = (
        Project.objects.filter(quota_policy__credits_per_period__gt=0).exclude(pk__in=granted).order_by("pk").first()
    )
    if project is None:
        return False
    ledger_grant_period(project=project, when=now)
    return True
