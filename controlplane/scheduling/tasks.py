from __future__ import annotations

from celery import shared_task

from controlplane.scheduling import services


@shared_task
def schedule_pass() -> int:
    """Start what fits of the queue now (services.schedule_pass); on beat and whenever GPUs free up."""
    return services.schedule_pass()
