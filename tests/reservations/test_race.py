"""Concurrent bookings on PostgreSQL: real threads, each with its own connection, released together."""

from __future__ import annotations

import threading
import time
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


def test_32_keyed_api_clients_of_32_projects_on_one_4_gpu_server_get_201_or_409_never_500():
    """The issue's load: every client its own project (no project lock keeps them apart), overlapping windows
    on one 4-GPU server, an Idempotency-Key each. Deadlocks on the exclusion constraint are retried."""
    from rest_framework.test import APIClient

    from tests.factories import ApiTokenFactory

    model = gpu_model()
    server(model, gpus=4)
    owners = [UserFactory() for _ in range(THREADS)]
    projects = [project(owner=u) for u in owners]
    tokens = [ApiTokenFactory(user=u) for u in owners]
    base = timezone.now() + timedelta(hours=1)

    def post(i: int) -> int:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {tokens[i].plaintext}")  # type: ignore[attr-defined]
        start = base + timedelta(minutes=10 * (i % 8))
        body = {
            "project": projects[i].slug,
            "name": f"api-{i}",
            "spec": {"gpu_model": model.name, "gpu_count": 1 + i % 2},
            "window": {"start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat()},
            "container": {"image": "img"},
        }
        return client.post("/api/v1/reservations/", body, format="json", HTTP_IDEMPOTENCY_KEY=f"k-{i}").status_code

    codes = run_together(post)
    assert all(code in (201, 409) for code in codes), codes  # an exception or a 500 is a failure
    assert codes.count(201) >= 1
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
            server_id=gpu.server_id,
            starts_at=r.starts_at + timedelta(hours=1),
            ends_at=r.ends_at + timedelta(hours=1),
        )
    # Back to back is fine, and so is an overlap with an inactive allocation.
    Allocation.objects.create(
        reservation=other, gpu=gpu, server_id=gpu.server_id, starts_at=r.ends_at, ends_at=r.ends_at + timedelta(hours=1)
    )
    Allocation.objects.filter(reservation=r).update(active=False)
    Allocation.objects.filter(reservation=other).update(starts_at=r.starts_at)


# -- deadlocks: the exclusion constraint's own ----------------------------------------------------------------
#
# PostgreSQL inserts an allocation's index entry first and checks the exclusion constraint after, waiting for any
# uncommitted overlapping entry's transaction to end (src/backend/executor/execIndexing.c). Two transactions that
# each insert an entry the other then checks wait on each other: the deadlock detector aborts one. With 32
# clients on one server that is a matter of timing; here the competing writer makes it happen every time.


def _backend_waits_on_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


def _deadlocked_booking(book: Callable[[], Any], *, gpus: list[Any], window_: Window, proj: Any) -> tuple[Any, Any]:
    """Run ``book`` (which places on ``gpus``, in id order) against a writer that takes ``gpus`` in the other
    order: the writer holds the last one, ``book`` inserts the first and waits for the last, the writer then
    inserts the first and waits for ``book``. Returns (what ``book`` returned or raised, the writer's outcome)."""
    writer_holds = threading.Event()
    booker_pid: list[int] = []
    booker_waits = threading.Event()
    outcome: dict[str, Any] = {}

    def writer() -> None:
        try:
            with transaction.atomic():
                other = Reservation.objects.create(
                    project=proj, name="writer", gpu_model=gpus[0].model, gpu_count=len(gpus), image="x",
                    starts_at=window_.starts_at, ends_at=window_.ends_at,
                )  # fmt: skip
                for gpu in reversed(gpus):
                    Allocation.objects.create(
                        reservation=other,
                        gpu=gpu,
                        server_id=gpu.server_id,
                        starts_at=window_.starts_at,
                        ends_at=window_.ends_at,
                    )
                    if not writer_holds.is_set():
                        writer_holds.set()
                        assert booker_waits.wait(timeout=30)
            outcome["writer"] = "committed"
        except Exception as exc:
            outcome["writer"] = exc
        finally:
            connections.close_all()

    def booker() -> None:
        try:
            assert writer_holds.wait(timeout=30)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                booker_pid.append(cursor.fetchone()[0])
            outcome["booker"] = book()
        except Exception as exc:
            outcome["booker"] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer), threading.Thread(target=booker)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not (booker_pid and _backend_waits_on_lock(booker_pid[0])):
        assert time.monotonic() < deadline and not outcome, f"the booking never waited for the writer: {outcome}"
        time.sleep(0.01)
    booker_waits.set()
    for t in threads:
        t.join(timeout=60)
    return outcome.get("booker"), outcome.get("writer")


def _deadlock_fixture() -> tuple[Any, Any, Any, list[Any], Window]:
    from controlplane.reservations.placement import place
    from controlplane.reservations.selectors import candidate_servers

    model = gpu_model()
    srv = server(model, gpus=4)
    owner = UserFactory()
    proj = project(owner=owner)
    window_ = Window(timezone.now() + timedelta(hours=1), timezone.now() + timedelta(hours=3))
    chosen = place(candidate_servers(spec(model, count=2), window_), gpu_count=2, whole_servers=None)
    assert chosen is not None
    return model, owner, proj, list(srv.gpus.filter(pk__in=chosen).order_by("pk")), window_


def test_a_booking_deadlocked_on_the_exclusion_constraint_is_retried_not_failed():
    model, owner, proj, gpus, window_ = _deadlock_fixture()

    def book() -> Reservation:
        return services.reservation_create(
            project=proj, name="deadlocked", spec=spec(model, count=2), window=window_, container=CONTAINER,
            actor=owner,
        )  # fmt: skip

    booked, writer = _deadlocked_booking(book, gpus=gpus, window_=window_, proj=project())
    assert writer == "committed"
    assert isinstance(booked, Reservation), booked
    assert set(booked.allocations.values_list("gpu_id", flat=True)).isdisjoint(g.pk for g in gpus)
    assert_no_overlaps()


def test_a_keyed_api_booking_deadlocked_on_the_exclusion_constraint_gets_201():
    from rest_framework.test import APIClient

    from tests.factories import ApiTokenFactory

    model, owner, proj, gpus, window_ = _deadlock_fixture()
    token = ApiTokenFactory(user=owner)

    def book() -> Any:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.plaintext}")  # type: ignore[attr-defined]
        body = {
            "project": proj.slug,
            "name": "deadlocked",
            "spec": {"gpu_model": model.name, "gpu_count": 2},
            "window": {"start": window_.starts_at.isoformat(), "end": window_.ends_at.isoformat()},
            "container": {"image": "img"},
        }
        return client.post("/api/v1/reservations/", body, format="json", HTTP_IDEMPOTENCY_KEY="deadlock")

    response, writer = _deadlocked_booking(book, gpus=gpus, window_=window_, proj=project())
    assert writer == "committed"
    assert getattr(response, "status_code", response) == 201, getattr(response, "content", response)
    assert Reservation.objects.filter(name="deadlocked").count() == 1
    assert_no_overlaps()
