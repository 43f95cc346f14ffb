from __future__ import annotations

from celery import shared_task

from controlplane.core.leader import leader_only
from controlplane.scheduling import services


@shared_task
@leader_only(skipped=0)
def schedule_pass() -> int:
    """Start what fits of the queue now (services.schedule_pass); on beat and whenever GPUs free up. Behind the
    leader lease: a pass orders the whole queue and backfills against the shadow times it computed, which a
    second pass booking at the same instant would invalidate. A pass skipped for that reason is not lost: the
    running one, or the beat's next (every 5 s), starts what it would have."""
    return services.schedule_pass()
