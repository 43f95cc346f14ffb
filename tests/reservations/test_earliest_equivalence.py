"""The one-query earliest-window search gives the same answers as the search it replaced, on random fleets."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.specs import GpuSpec
from controlplane.reservations.windows import earliest_window
from tests.reservations.earliest_reference import reference_earliest_window
from tests.reservations.fleet import gpu_model, project, server

pytestmark = pytest.mark.django_db


def random_fleet(rng: random.Random, now):  # type: ignore[no-untyped-def]
    """A few servers of mixed sizes, some GPUs unhealthy or on a draining server, and non-overlapping
    allocations per GPU (some starting before now, some back to back, some released)."""
    model, other = gpu_model(), gpu_model("A100-40GB", memory_mib=40960)
    proj = project()
    for _ in range(rng.randint(2, 6)):
        srv = server(model if rng.random() < 0.85 else other, gpus=rng.choice([2, 4, 8]))
        if rng.random() < 0.1:
            srv.state = ServerState.DRAINING
            srv.save(update_fields=["state"])
    for gpu in Gpu.objects.all():
        if rng.random() < 0.08:
            Gpu.objects.filter(pk=gpu.pk).update(health=GpuHealth.UNHEALTHY)
        cursor = now - timedelta(minutes=rng.randint(0, 300))
        for _ in range(rng.randint(0, 7)):
            start = cursor + timedelta(minutes=rng.choice([0, 0, rng.randint(1, 20 * 60)]))
            end = start + timedelta(minutes=rng.randint(30, 14 * 60))
            r = Reservation.objects.create(
                project=proj,
                name="r",
                gpu_model=gpu.model,
                gpu_count=1,
                starts_at=start,
                ends_at=end,
                image="x",
                state=ReservationState.SCHEDULED,
            )
            Allocation.objects.create(reservation=r, gpu=gpu, starts_at=start, ends_at=end, active=rng.random() > 0.1)
            cursor = end
    return model


@pytest.mark.parametrize("seed", range(12))
def test_earliest_window_matches_the_reference_search_on_random_fleets(seed: int) -> None:
    rng = random.Random(seed)
    now = timezone.now().replace(microsecond=rng.randint(0, 999_999))
    model = random_fleet(rng, now)
    specs = [GpuSpec(gpu_model_id=model.pk, gpu_count=n) for n in (1, 2, 3, 4, 8, 12)]
    specs += [GpuSpec(min_memory_mib=40000, gpu_count=2), GpuSpec(gpu_model_id=model.pk, whole_servers=1)]
    specs.append(GpuSpec(gpu_model_id=model.pk, whole_servers=2))
    for spec in specs:
        for hours in (1, 5, 24):
            for days in (1, 3):
                args = {"duration": timedelta(hours=hours), "within": timedelta(days=days), "now": now}
                expected = reference_earliest_window(spec, **args)
                got = earliest_window(spec, **args)
                if expected is None:
                    assert got is None, (spec, hours, days)
                    continue
                assert got is not None, (spec, hours, days, expected)
                assert got[0] == expected[0], (spec, hours, days)
                assert got[1] == expected[1], (spec, hours, days)
