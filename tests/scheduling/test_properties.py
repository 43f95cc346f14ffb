"""Properties of the pass (docs/scheduling.md, "Guarantees"), on random small fleets, advance bookings and queues.

After every pass: no GPU is in two overlapping allocations; every advance reservation keeps its window and its
GPUs; nothing that started delays a blocked request ahead of it (its shadow time, searched again after the
pass, is the one the pass found); a request starts ahead of a queued one of its order only by backfill, and
then ends by the earliest shadow time of the blocked ones ahead; a started request holds exactly
``[started_at, started_at + duration)``. On PostgreSQL, bookings racing the pass from other threads.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.core.errors import Conflict, QuotaExceeded
from controlplane.reservations import services as booking
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.specs import Window
from controlplane.scheduling import services
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.models import QueuedRequest
from controlplane.scheduling.order import ordered_queue, shadow
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec
from tests.scheduling.support import submit

pytestmark = pytest.mark.django_db

advance_bookings = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 300), st.sampled_from([30, 60, 90, 180])), max_size=5
)
queue = st.lists(
    st.tuples(
        st.integers(1, 4),  # GPUs
        st.sampled_from([30, 60, 120, 240]),  # minutes
        st.sampled_from(["high", "normal"]),
        st.integers(0, 1),  # which project
    ),
    min_size=1,
    max_size=7,
)
fleets = st.lists(st.sampled_from([2, 4]), min_size=1, max_size=3)
PASSES = (timedelta(0), timedelta(minutes=40), timedelta(minutes=100))


def _calendar(ids: list[int]) -> dict[int, tuple[Any, ...]]:
    out: dict[int, tuple[Any, ...]] = {}
    for res in Reservation.objects.filter(pk__in=ids).prefetch_related("allocations"):
        periods = sorted((a.gpu_id, a.starts_at, a.ends_at, a.active) for a in res.allocations.all())
        out[res.pk] = (res.starts_at, res.ends_at, res.state, tuple(periods))
    return out


def _no_gpu_twice() -> None:
    by_gpu: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for a in Allocation.objects.filter(active=True):
        by_gpu[a.gpu_id].append((a.starts_at, a.ends_at))
    for periods in by_gpu.values():
        periods.sort()
        for (_, end), (start, _) in itertools.pairwise(periods):
            assert end <= start, "a GPU is in two overlapping allocations"


def _check_pass(order: list[int], now: datetime, started_before: set[int]) -> None:
    requests = {r.pk: r for r in QueuedRequest.objects.select_related("reservation").filter(pk__in=order)}
    blocked_ahead: list[datetime] = []
    queued_ahead = False
    for rid in order:
        r = requests[rid]
        if r.state == RequestState.STARTED and rid not in started_before:
            res = r.reservation
            assert r.started_at == now and (res.starts_at, res.ends_at) == (
                now,
                now + timedelta(seconds=r.duration_seconds),
            )
            assert all(
                (a.starts_at, a.ends_at) == (res.starts_at, res.ends_at) for a in res.allocations.filter(active=True)
            ), "a started request holds more than its allocation"
            if queued_ahead:
                # Started ahead of a queued request of its order: by backfill only, ending by every shadow ahead.
                assert blocked_ahead, "a request jumped the queue with nothing blocked ahead of it"
                assert res.ends_at <= min(blocked_ahead), "a backfill could delay a blocked request ahead"
        elif r.state == RequestState.QUEUED:
            queued_ahead = True
            if r.blocked_until is not None:
                blocked_ahead.append(r.blocked_until)
                # What started in this pass has not pushed back the start the pass found for it.
                again = shadow(services.spec_of(r), duration=timedelta(seconds=r.duration_seconds), now=now)
                assert again.at == r.blocked_until, "a blocked request's shadow time moved during the pass"


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(fleet=fleets, bookings=advance_bookings, requests=queue)
def test_after_every_pass_the_guarantees_hold(fleet, bookings, requests):  # type: ignore[no-untyped-def]
    with transaction.atomic():
        model = gpu_model()
        for gpus in fleet:
            server(model, gpus=gpus)
        projects = [project(grant="1000000"), project(grant="1000000")]
        t0 = timezone.now()
        advance = []
        for count, start_min, minutes in bookings:
            start = t0 + timedelta(minutes=start_min)
            try:
                res = booking.reservation_create(
                    project=projects[0],
                    name="advance",
                    spec=spec(model, count=count),
                    window=Window(start, start + timedelta(minutes=minutes)),
                    container=CONTAINER,
                    actor=UserFactory(),
                    now=t0,
                )
            except (Conflict, QuotaExceeded):
                continue
            advance.append(res.pk)
        before = _calendar(advance)
        largest = max(fleet)
        for count, minutes, klass, which in requests:
            try:
                submit(
                    projects[which], spec(model, count=min(count, largest)), hours=minutes / 60, priority=klass, now=t0
                )
            except (Conflict, QuotaExceeded):
                continue
        for offset in PASSES:
            now = t0 + offset
            order = [e.id for e in ordered_queue(now=now)]
            started_before = set(QueuedRequest.objects.filter(state=RequestState.STARTED).values_list("pk", flat=True))
            services.run_pass(now=now)
            _no_gpu_twice()
            assert _calendar(advance) == before, "an advance reservation's window or GPUs changed"
            _check_pass(order, now, started_before)
        transaction.set_rollback(True)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_bookings_racing_the_pass_keep_the_constraint_and_delay_no_advance_booking():
    """Threads book advance windows while others run passes over a saturated queue: the exclusion constraint
    holds (no GPU twice), and each advance booking that was accepted keeps its window."""
    assert connection.vendor == "postgresql"
    model = gpu_model()
    server(model, gpus=4)
    server(model, gpus=4)
    proj = project(grant="10000000")
    t0 = timezone.now()
    for i in range(12):
        submit(proj, spec(model, count=1 + i % 4), hours=1 + i % 3, priority="high" if i % 3 == 0 else "normal")
    accepted: list[tuple[int, datetime, datetime]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def book(i: int) -> None:
        try:
            start = t0 + timedelta(minutes=5 + 20 * i)
            try:
                res = booking.reservation_create(
                    project=proj,
                    name=f"advance-{i}",
                    spec=spec(model, count=2),
                    window=Window(start, start + timedelta(hours=1)),
                    container=CONTAINER,
                    actor=None,
                    now=t0,
                )
            except Conflict:
                return
            with lock:
                accepted.append((res.pk, res.starts_at, res.ends_at))
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()

    def run(offset: int) -> None:
        try:
            services.run_pass(now=t0 + timedelta(minutes=offset))
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=book, args=(i,)) for i in range(6)]
    threads += [threading.Thread(target=run, args=(o,)) for o in (0, 0, 1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    _no_gpu_twice()
    for pk, starts_at, ends_at in accepted:
        res = Reservation.objects.get(pk=pk)
        assert (res.starts_at, res.ends_at, res.state) == (starts_at, ends_at, ReservationState.SCHEDULED)
        assert all((a.starts_at, a.ends_at) == (starts_at, ends_at) for a in res.allocations.filter(active=True))
    assert QueuedRequest.objects.filter(state=RequestState.STARTED).exists()
