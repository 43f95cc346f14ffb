"""Preemption on the real Docker engine: a preemptible job is warned (SIGUSR1 and the warning file, with the
reason) its class's notice before the preempting reservation starts, stopped, charged for what it ran, and,
asked to requeue, queued again and started once the GPUs are free.

The agent is the real one (tests/dispatch/test_end_to_end.py's fixture: Agent + DockerRuntime + simulated
GPUs + command listener) talking HTTP to pytest-django's live server; Celery runs eagerly.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.dispatch import services as dispatch
from controlplane.dispatch.models import Launch
from controlplane.ledger.choices import EntryKind
from controlplane.ledger.models import LedgerEntry
from controlplane.reservations import services as reservations
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Reservation
from controlplane.reservations.specs import ContainerSpec, GpuSpec, Window
from controlplane.scheduling import services as scheduling
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import PriorityClass, QueuedRequest
from nodeagent.runtime.containers import iso
from nodeagent.runtime.localimage import DEFAULT_TAG
from tests.dispatch.test_end_to_end import JOB, agent_node, eager_celery, wait_for  # noqa: F401 - fixtures
from tests.reservations.fleet import project

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

NOTICE = 3
SPEC = GpuSpec(min_memory_mib=1024, gpu_count=4)


def beat() -> None:
    """What the 1 s beat does: close windows that ended, run the queue pass."""
    dispatch.dispatch_close_due()
    scheduling.schedule_pass()


def state_of(r: Reservation) -> str:
    beat()
    return str(Reservation.objects.get(pk=r.pk).state)


@override_settings(DISPATCH_WARN_BEFORE_S=0, DISPATCH_STOP_GRACE_S=2)
def test_a_preempted_job_is_warned_stopped_charged_for_what_ran_and_requeued(agent_node, docker_client):  # noqa: F811
    PriorityClass.objects.filter(name="preemptible").update(notice_seconds=NOTICE)
    proj = project()
    low = scheduling.request_submit(
        project=proj,
        name="ckpt",
        spec=SPEC,
        container=ContainerSpec(image=DEFAULT_TAG, command=JOB),
        duration=timedelta(minutes=10),
        start_by=None,
        priority_class=PriorityClass.objects.get(name="preemptible"),
        actor=None,
        requeue=True,
    )
    wait_for(lambda: QueuedRequest.objects.get(pk=low.pk).state == RequestState.STARTED, what="the pass")
    victim = QueuedRequest.objects.get(pk=low.pk).reservation
    assert victim is not None and victim.preemptible
    wait_for(lambda: state_of(victim) == ReservationState.RUNNING, what="the preemptible job running")

    # An advance reservation of the same GPUs, starting a little after the notice.
    now = timezone.now()
    start = now + timedelta(seconds=NOTICE + 2)
    winner = reservations.reservation_create(
        project=project(),
        name="advance",
        spec=SPEC,
        window=Window(start, start + timedelta(seconds=8)),
        container=ContainerSpec(image=DEFAULT_TAG, command=JOB),
        actor=None,
        now=now,
    )
    victim.refresh_from_db()
    assert victim.ends_at == start and victim.preempted_by_id == winner.pk

    # The notice comes NOTICE seconds before the cut, with the reason; then the stop.
    launch = Launch.objects.get(reservation=victim)
    wait_for(lambda: state_of(victim) == ReservationState.COMPLETED, timeout=30, what="the victim stopped")
    launch.refresh_from_db()
    assert "warned" in launch.log_tail and f"preempted by reservation {winner.public_id}" in launch.log_tail
    # The warning file names the new end as the stop; SIGUSR1 came before the SIGTERM.
    assert f'"stop_at": "{iso(start)}"' in launch.log_tail
    assert launch.log_tail.index("warned") < launch.log_tail.index("stopping")
    assert "stopping" in launch.log_tail and launch.exit_code == 0
    assert launch.finished_at is not None and launch.finished_at <= start + timedelta(seconds=3)
    # Charged only for what it ran: at most its cut window, at half the rate.
    charged = -LedgerEntry.objects.get(reservation=victim, kind=EntryKind.CHARGE).amount
    ran_hours = Decimal((start - victim.starts_at).total_seconds() + 3) / 3600
    assert Decimal(0) < charged <= (4 * Decimal("0.5") * ran_hours).quantize(Decimal("0.0001")) + Decimal("0.0001")

    # The winner runs, then the requeued request starts again on the freed GPUs.
    again = QueuedRequest.objects.get(requeued_from=low)
    wait_for(lambda: state_of(winner) == ReservationState.RUNNING, timeout=20, what="the winner running")
    assert QueuedRequest.objects.get(pk=again.pk).state == RequestState.QUEUED
    wait_for(lambda: state_of(winner) == ReservationState.COMPLETED, timeout=30, what="the winner done")
    wait_for(lambda: QueuedRequest.objects.get(pk=again.pk).state == RequestState.STARTED, what="the requeued job")
    resumed = QueuedRequest.objects.get(pk=again.pk).reservation
    assert resumed is not None
    wait_for(lambda: state_of(resumed) == ReservationState.RUNNING, timeout=20, what="the requeued job running")
    reservations.reservation_release(reservation=resumed, actor=None, reason="test over")
