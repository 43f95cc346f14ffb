from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.reservations import services
from controlplane.reservations.selectors import free_for, timeline
from controlplane.reservations.specs import Window
from controlplane.reservations.windows import earliest_window
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec

pytestmark = pytest.mark.django_db


def book(proj, s, starts_at, hours):  # type: ignore[no-untyped-def]
    return services.reservation_create(
        project=proj,
        name="b",
        spec=s,
        container=CONTAINER,
        actor=None,
        window=Window(starts_at, starts_at + timedelta(hours=hours)),
    )


def test_earliest_whole_server_waits_for_the_first_server_to_empty():
    model = gpu_model()
    a, b = server(model, gpus=2), server(model, gpus=2)
    proj = project()
    now = timezone.now()
    book(proj, spec(model, count=1), now + timedelta(minutes=1), 5)  # best fit: one GPU of one server
    book(proj, spec(model, count=2), now + timedelta(minutes=1), 3)  # the other whole server
    found = earliest_window(spec(model, whole=1), duration=timedelta(hours=2), within=timedelta(days=1), now=now)
    assert found is not None
    window, gpus = found
    assert window.starts_at == now + timedelta(minutes=1, hours=3)
    assert len(gpus) == 2 and len({g.server_id for g in model.gpus.filter(pk__in=gpus)}) == 1
    assert {a.pk, b.pk} >= {g.server_id for g in model.gpus.filter(pk__in=gpus)}


def test_earliest_window_spanning_servers_and_none_when_nothing_fits():
    model = gpu_model()
    server(model, gpus=2)
    server(model, gpus=2)
    proj = project()
    now = timezone.now()
    book(proj, spec(model, count=1), now, 4)
    found = earliest_window(spec(model, count=4), duration=timedelta(hours=1), within=timedelta(days=1), now=now)
    assert found is not None and found[0].starts_at == now + timedelta(hours=4)
    assert (
        earliest_window(spec(model, count=4), duration=timedelta(hours=1), within=timedelta(hours=3), now=now) is None
    )
    # A window longer than the horizon never fits.
    assert earliest_window(spec(model, count=1), duration=timedelta(days=2), within=timedelta(days=1), now=now) is None


def test_free_and_timeline_agree_with_bookings():
    model = gpu_model()
    server(model, gpus=4)
    proj = project()
    now = timezone.now() + timedelta(hours=1)
    r = book(proj, spec(model, count=3), now, 2)
    summary = free_for(spec(model, count=1), Window(now, now + timedelta(hours=1)))
    assert summary.free_gpus == 1 and summary.proposal is not None
    assert free_for(spec(model, count=2), Window(now, now + timedelta(hours=1))).proposal is None
    segments = timeline(gpus=model.gpus.all(), starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=5))
    assert sum(len(v) for v in segments.values()) == 3
    services.reservation_cancel(reservation=r, actor=None)
    segments = timeline(gpus=model.gpus.all(), starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=5))
    assert sum(len(v) for v in segments.values()) == 0  # cancelled before it started: never held
