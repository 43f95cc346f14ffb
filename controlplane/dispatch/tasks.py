"""Dispatch tasks. Each takes ids, calls one service and owns its retry policy; all are idempotent."""

from __future__ import annotations

from celery import shared_task

from controlplane.dispatch import services


@shared_task(
    name="controlplane.dispatch.tasks.push_launch",
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(services.PushFailed,),
    retry_backoff=1,
    retry_backoff_max=30,
    retry_jitter=True,
    max_retries=6,
)
def push_launch(launch_id: str) -> str:
    """acks_late: a worker killed mid-push leaves the message to be redelivered; the agent keys containers by
    launch id, so the second delivery cannot start a second container. Retries stop after about a minute;
    by then the heartbeat has delivered the same desired state."""
    return services.push_launch(launch_id=launch_id)


@shared_task(name="controlplane.dispatch.tasks.open_reservation", ignore_result=True, acks_late=True)
def open_reservation(reservation_id: int) -> int:
    return len(services.reservation_open(reservation_id=reservation_id))


@shared_task(name="controlplane.dispatch.tasks.open_due", ignore_result=True, expires=5)
def open_due() -> int:
    """Every second from beat; cheap (one indexed query) when nothing is due. ``expires``: a backlog of
    these after an outage is worth one run, not hundreds."""
    return services.dispatch_open_due()


@shared_task(name="controlplane.dispatch.tasks.close_due", ignore_result=True, expires=5)
def close_due() -> int:
    return services.dispatch_close_due()
