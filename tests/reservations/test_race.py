"""Concurrent bookings on PostgreSQL: real threads, each with its own connection, released together."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.utils import timezone

from controlplane.core.errors import Conflict
from controlplane.reservations import services
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.specs import Window
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
THREADS = 32


def run_together(work: Callable[[int], Any]) -> list[Any]:
    barrier = threading.Barrier(THREADS)
    results: list[Any] = [None] * THREADS

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def assert_no_overlaps() -> None:
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT count(*) FROM reservations_allocation a JOIN reservations_allocation b
              ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.active AND b.active
             AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at
        """)
        assert cursor.fetchone()[0] == 0


def test_32_threads_booking_overlapping_windows_never_double_book():
    model = gpu_model()
    server(model, gpus=4)
    server(model, gpus=4)
    users = [UserFactory() for _ in range(4)]
    projects = [project(owner=u) for u in users]
    base = timezone.now() + timedelta(hours=1)

    def book(i: int) -> Reservation:
        # Windows shifted by 10 minutes each: every one overlaps many of the others.
        start = base + timedelta(minutes=10 * (i % 8))
        return services.reservation_create(
            project=projects[i % 4],
            name=f"race-{i}",
            spec=spec(model, count=3),
            window=Window(start, start + timedelta(hours=2)),
            container=CONTAINER,
            actor=users[i % 4],
        )

    results = run_together(book)
    winners = [r for r in results if isinstance(r, Reservation)]
    losers = [r for r in results if isinstance(r, Conflict)]
    assert len(winners) + len(losers) == THREADS, [r for r in results if not isinstance(r, Reservation | Conflict)]
    assert 2 <= len(winners) < THREADS
    assert_no_overlaps()
    assert Allocation.objects.filter(active=True).count() == 3 * len(winners)


def test_32_api_clients_racing_for_one_server_get_one_201_and_409s():
    from rest_framework.test import APIClient

    model = gpu_model()
    server(model, gpus=8)
    owner = UserFactory()
    proj = project(owner=owner)
    start = timezone.now() + timedelta(hours=1)

    def post(i: int) -> int:
        client = APIClient()
        client.force_authenticate(owner)
        response = client.post(
            "/api/v1/reservations/",
            {
                "project": proj.slug,
                "name": f"api-{i}",
                "spec": {"gpu_model": model.name, "whole_servers": 1},
                "window": {
                    "start": (start + timedelta(minutes=i)).isoformat(),
                    "end": (start + timedelta(hours=1, minutes=i)).isoformat(),
                },
                "container": {"image": "img"},
            },
            format="json",
        )
        return response.status_code

    codes = run_together(post)
    assert sorted(set(codes)) == [201, 409], codes
    assert codes.count(201) == 1
    assert_no_overlaps()


def test_the_exclusion_constraint_refuses_an_overlap_that_skips_the_service():
    model = gpu_model()
    srv = server(model, gpus=1)
    proj = project()
    r = services.reservation_create(
        project=proj,
        name="a",
        spec=spec(model),
        container=CONTAINER,
        actor=None,
        window=Window(timezone.now() + timedelta(hours=1), timezone.now() + timedelta(hours=3)),
    )
    gpu = srv.gpus.get()
    other = Reservation.objects.create(
        project=proj, name="b", gpu_model=model, gpu_count=1, image="x", starts_at=r.starts_at, ends_at=r.ends_at
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(
            reservation=other,
            gpu=gpu,
            starts_at=r.starts_at + timedelta(hours=1),
            ends_at=r.ends_at + timedelta(hours=1),
        )
    # Back to back is fine, and so is an overlap with an inactive allocation.
    Allocation.objects.create(reservation=other, gpu=gpu, starts_at=r.ends_at, ends_at=r.ends_at + timedelta(hours=1))
    Allocation.objects.filter(reservation=r).update(active=False)
    Allocation.objects.filter(reservation=other).update(starts_at=r.starts_at)
