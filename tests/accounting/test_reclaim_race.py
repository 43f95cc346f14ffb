"""Idle reclamation under concurrency on PostgreSQL: real threads, each with its own connection."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.accounting import reclaim
from controlplane.accounting.choices import IdleState
from controlplane.accounting.models import IdleReclamation
from controlplane.core.errors import Conflict
from controlplane.reservations.models import Reservation
from tests.accounting.helpers import book, idle_warned
from tests.racing import together
from tests.reservations.fleet import gpu_model, project, server

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_eight_concurrent_beats_warn_once():
    model = gpu_model()
    server(model, gpus=4)
    proj = project()
    r = idle_warned(proj, model, count=2, warn=False)
    at = timezone.now()
    results = together(*[lambda: reclaim.idle_reclaim_pass(now=at)] * 8)
    assert not [x for x in results if isinstance(x, Exception)], results
    assert sorted(results) == [0] * 7 + [1]
    assert IdleReclamation.objects.filter(reservation=r).count() == 1
    assert r.events.filter(data__idle="warned").count() == 1
    assert r.events.filter(data__notice_seconds=15 * 60).count() == 1
    assert Reservation.objects.get(pk=r.pk).ends_at == at + timedelta(minutes=15)


def test_keep_racing_a_booking_of_the_freed_gpus_one_wins():
    model = gpu_model()
    server(model, gpus=2)
    proj, other = project(), project()
    r = idle_warned(proj, model, count=2)
    cut_end = r.ends_at
    booked_end = IdleReclamation.objects.get(reservation=r).booked_ends_at

    def keep() -> Any:
        return reclaim.idle_keep(reservation=r, actor=None)

    def take() -> Any:
        return book(other, model, cut_end, cut_end + timedelta(hours=1), count=2)

    kept, taken = together(keep, take)
    assert isinstance(kept, Conflict) != isinstance(taken, Conflict), (kept, taken)
    r.refresh_from_db()
    if isinstance(kept, Conflict):
        assert kept.code == "gpu_taken" and r.ends_at == cut_end
        assert IdleReclamation.objects.get(reservation=r).state == IdleState.WARNED
    else:
        assert r.ends_at == booked_end
        assert IdleReclamation.objects.get(reservation=r).state == IdleState.KEPT
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT count(*) FROM reservations_allocation a JOIN reservations_allocation b
              ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.active AND b.active
             AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at
        """)
        assert cursor.fetchone()[0] == 0
