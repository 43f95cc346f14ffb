"""Fair share (docs/scheduling.md): Slurm's classic F = 2^(-U/S), decayed usage of what ran."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.accounting.models import UsageRecord, UsageSlice
from controlplane.inventory.models import Gpu
from controlplane.reservations.models import Reservation
from controlplane.scheduling import services
from controlplane.scheduling.choices import RequestState
from controlplane.scheduling.fairshare import fair_shares
from controlplane.scheduling.models import ProjectShare
from tests.reservations.fleet import gpu_model, project, server, spec
from tests.scheduling.support import submit

pytestmark = pytest.mark.django_db


def ran(proj, *, gpu_hours: float, ago: timedelta):  # type: ignore[no-untyped-def]
    """A finished reservation's usage, as accounting records it: ``gpu_hours`` run on one GPU, ``ago``."""
    model = gpu_model()
    gpu = Gpu.objects.filter(model=model).first() or Gpu.objects.get(pk=server(model, gpus=1).gpus.first().pk)
    at = (timezone.now() - ago).replace(minute=0, second=0, microsecond=0)
    res = Reservation.objects.create(
        project=proj, name="ran", gpu_model=model, gpu_count=1, starts_at=at, ends_at=at + timedelta(hours=1)
    )
    record = UsageRecord.objects.create(
        reservation=res, gpu=gpu, project=proj, gpu_model=model, booked_start=at, booked_end=at + timedelta(hours=1)
    )
    UsageSlice.objects.create(
        record=record, hour=at, project=proj, reservation=res, gpu_model=model, used_s=gpu_hours * 3600
    )


def test_without_usage_every_factor_is_one():
    a, b = project(), project()
    got = fair_shares({a.pk, b.pk}, now=timezone.now())
    assert got[a.pk].factor == got[b.pk].factor == 1.0
    assert got[a.pk].normalized_shares == 0.5


def test_the_factor_is_slurms_classic_formula():
    heavy, light = project(), project()
    ran(heavy, gpu_hours=30, ago=timedelta(hours=1))
    ran(light, gpu_hours=10, ago=timedelta(hours=1))
    got = fair_shares({heavy.pk, light.pk}, now=timezone.now())
    assert got[heavy.pk].normalized_usage == pytest.approx(0.75)
    assert got[heavy.pk].factor == pytest.approx(2 ** (-0.75 / 0.5))
    assert got[light.pk].factor == pytest.approx(2 ** (-0.25 / 0.5))


def test_shares_weigh_the_factor():
    a, b = project(), project()
    ProjectShare.objects.create(project=a, shares=3)
    ran(a, gpu_hours=10, ago=timedelta(hours=1))
    ran(b, gpu_hours=10, ago=timedelta(hours=1))
    got = fair_shares({a.pk, b.pk}, now=timezone.now())
    assert got[a.pk].normalized_shares == pytest.approx(0.75)
    assert got[a.pk].factor == pytest.approx(2 ** (-0.5 / 0.75))
    assert got[a.pk].factor > got[b.pk].factor


def test_usage_decays_by_the_half_life(settings):
    settings.SCHEDULING_FAIRSHARE_HALF_LIFE = 7.0
    old, recent = project(), project()
    ran(old, gpu_hours=10, ago=timedelta(days=7))
    ran(recent, gpu_hours=10, ago=timedelta(hours=1))
    got = fair_shares({old.pk, recent.pk}, now=timezone.now())
    # A day's usage weighs as of the middle of its UTC day: within a day of the exact age.
    assert got[old.pk].usage_gpu_hours / got[recent.pk].usage_gpu_hours == pytest.approx(0.5, rel=0.12)
    assert got[old.pk].factor > got[recent.pk].factor


def test_within_a_class_the_lighter_project_starts_first_then_fifo():
    model = gpu_model()
    server(model, gpus=1)
    heavy, light = project(), project()
    ran(heavy, gpu_hours=50, ago=timedelta(hours=2))
    first = submit(heavy, spec(model), name="heavy-first")
    second = submit(light, spec(model), name="light-second")
    assert services.schedule_pass() == 1
    first.refresh_from_db()
    second.refresh_from_db()
    assert second.state == RequestState.STARTED and first.state == RequestState.QUEUED


def test_the_usage_is_one_aggregate_whatever_the_number_of_projects():
    projects = [project() for _ in range(6)]
    for i, p in enumerate(projects):
        ran(p, gpu_hours=i + 1, ago=timedelta(days=i))
    with CaptureQueriesContext(connection) as few:
        fair_shares({projects[0].pk}, now=timezone.now())
    with CaptureQueriesContext(connection) as many:
        fair_shares({p.pk for p in projects}, now=timezone.now())
    assert len(few) == len(many) == 2
