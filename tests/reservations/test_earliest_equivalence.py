"""The one-query earliest-window search gives the same answers as the search it replaced, on random fleets."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu
from controlplane.reservations.models import Allocation
from controlplane.reservations.specs import GpuSpec
from controlplane.reservations.windows import earliest_window
from tests.reservations.earliest_reference import reference_earliest_window
from tests.reservations.fleet import gpu_model, hold, project, server

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
            hold(gpu, start, end, proj=proj, active=rng.random() > 0.1)
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


def edge_fleet(now):  # type: ignore[no-untyped-def]
    """The cases the search treats apart: a gap exactly as long as the window, holds back to back, a GPU with
    no allocation at all, an unhealthy GPU, a draining server, a released hold, another model with less
    memory, and servers that become free at the same instant."""
    model, small = gpu_model(), gpu_model("A100-40GB", memory_mib=40960)
    h = timedelta(hours=1)
    a = server(model, gpus=4)
    gpus = list(Gpu.objects.filter(server=a).order_by("index"))
    hold(gpus[0], now - h, now + 2 * h)
    hold(gpus[0], now + 7 * h, now + 20 * h)  # a gap of exactly 5 hours from now + 2 h
    hold(gpus[1], now - h, now + 3 * h)
    hold(gpus[1], now + 3 * h, now + 9 * h)  # back to back: free from now + 9 h
    Gpu.objects.filter(pk=gpus[2].pk).update(health=GpuHealth.UNHEALTHY)
    hold(gpus[3], now, now + 40 * h, active=False)  # released: it holds nothing
    hold(gpus[3], now + h, now + 6 * h)
    draining = server(model, gpus=2, state=ServerState.DRAINING)  # idle, but no booking may use it
    assert not Allocation.objects.filter(gpu__server=draining).exists()
    for _ in range(3):  # whole servers busy until the same instant
        for gpu in Gpu.objects.filter(server=server(model, gpus=2)):
            hold(gpu, now - h, now + 9 * h)
    for gpu in Gpu.objects.filter(server=server(small, gpus=2)):
        hold(gpu, now + 4 * h, now + 30 * h)
    return model


@pytest.mark.parametrize("second", [0, 1])
def test_earliest_window_matches_the_reference_on_edge_cases(second: int) -> None:
    # A whole second makes the epoch arithmetic exact; a stray microsecond checks the rounding agrees too.
    now = timezone.now().replace(microsecond=0) + timedelta(microseconds=second * 123_457)
    model = edge_fleet(now)
    specs = [GpuSpec(gpu_model_id=model.pk, gpu_count=n) for n in (1, 2, 3, 4, 5, 8)]
    specs += [GpuSpec(min_memory_mib=40000, gpu_count=n) for n in (1, 2, 3)]
    specs += [GpuSpec(min_memory_mib=80000, gpu_count=2)]
    specs += [GpuSpec(gpu_model_id=model.pk, whole_servers=n) for n in (1, 2, 4)]
    for spec in specs:
        for hours in (1, 4, 5, 6, 12, 24):
            for days in (1, 2):
                args = {"duration": timedelta(hours=hours), "within": timedelta(days=days), "now": now}
                expected = reference_earliest_window(spec, **args)
                got = earliest_window(spec, **args)
                assert got == expected, (spec, hours, days)


def test_a_window_as_long_as_a_gap_starts_at_the_end_of_the_hold_before_it() -> None:
    now = timezone.now().replace(microsecond=0)
    model = gpu_model()
    srv = server(model, gpus=2)
    first, second = Gpu.objects.filter(server=srv).order_by("index")
    h = timedelta(hours=1)
    hold(first, now - h, now + 2 * h)
    hold(first, now + 7 * h, now + 50 * h)
    hold(second, now - h, now + 50 * h)
    spec = GpuSpec(gpu_model_id=model.pk, gpu_count=1)

    found = earliest_window(spec, duration=5 * h, within=timedelta(days=3), now=now)
    assert found is not None and found[0].starts_at == now + 2 * h and found[1] == [first.pk]
    # A microsecond longer no longer fits the gap: the next chance is after the last hold.
    found = earliest_window(spec, duration=5 * h + timedelta(microseconds=1), within=timedelta(days=3), now=now)
    assert found is not None and found[0].starts_at == now + 50 * h


def test_of_servers_free_at_the_same_instant_the_best_fit_is_proposed() -> None:
    now = timezone.now()
    model = gpu_model()
    h = timedelta(hours=1)
    big, small = server(model, gpus=8, hostname="a-big"), server(model, gpus=2, hostname="b-small")
    for gpu in Gpu.objects.filter(server__in=[big, small]):
        hold(gpu, now - h, now + 3 * h)
    spec = GpuSpec(gpu_model_id=model.pk, gpu_count=2)

    found = earliest_window(spec, duration=2 * h, within=timedelta(days=1), now=now)
    assert found is not None and found[0].starts_at == now + 3 * h
    assert set(found[1]) == set(Gpu.objects.filter(server=small).values_list("pk", flat=True))
