"""The hand-written candidate query reads the same servers and free GPUs as the ORM version it replaced."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu
from controlplane.reservations.placement import place
from controlplane.reservations.selectors import SHORTLIST, _server_counts, candidate_servers
from controlplane.reservations.specs import GpuSpec, Window
from tests.reservations import candidates_reference as reference
from tests.reservations.fleet import gpu_model, hold, project, server

pytestmark = pytest.mark.django_db


def random_fleet(rng: random.Random, now):  # type: ignore[no-untyped-def]
    """Servers of mixed sizes and models, some not ready, some GPUs unhealthy or gone, and allocations
    around ``now`` (some released, some ending or starting exactly at a window's bound)."""
    model, other = gpu_model(), gpu_model("A100-40GB", memory_mib=40960)
    proj = project()
    for _ in range(rng.randint(3, 9)):
        srv = server(model if rng.random() < 0.8 else other, gpus=rng.choice([1, 2, 4, 8]))
        if rng.random() < 0.15:
            srv.state = rng.choice([ServerState.DRAINING, ServerState.MAINTENANCE])
            srv.save(update_fields=["state"])
    for gpu in Gpu.objects.all():
        if rng.random() < 0.1:
            Gpu.objects.filter(pk=gpu.pk).update(health=GpuHealth.UNHEALTHY)
        if rng.random() < 0.05:
            Gpu.objects.filter(pk=gpu.pk).update(present=False)
        if rng.random() < 0.05:  # a GPU of another model on the server: not a whole server for the spec
            Gpu.objects.filter(pk=gpu.pk).update(model=other, memory_mib=other.memory_mib)
        cursor = now - timedelta(hours=rng.randint(0, 6))
        for _ in range(rng.randint(0, 4)):
            start = cursor + timedelta(hours=rng.choice([0, 1, 2]))
            end = start + timedelta(hours=rng.choice([1, 2, 3]))
            hold(gpu, start, end, proj=proj, active=rng.random() > 0.15)
            cursor = end
    return model


def _by_id(servers):  # type: ignore[no-untyped-def]
    return sorted(servers, key=lambda s: s.id)


@pytest.mark.parametrize("seed", range(10))
def test_candidate_servers_match_the_orm_reference_on_random_fleets(seed: int) -> None:
    rng = random.Random(seed)
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    model = random_fleet(rng, now)
    specs = [GpuSpec(gpu_model_id=model.pk, gpu_count=n) for n in (1, 2, 3, 4, 8, 12)]
    specs += [GpuSpec(min_memory_mib=40000, gpu_count=2), GpuSpec(min_memory_mib=80000, gpu_count=5)]
    specs += [GpuSpec(gpu_model_id=model.pk, whole_servers=n) for n in (1, 2)]
    specs.append(GpuSpec(min_memory_mib=1, whole_servers=1))
    checked = 0
    for spec in specs:
        for offset, hours in ((0, 1), (1, 2), (2, 1), (-3, 12), (5, 1)):
            window = Window(now + timedelta(hours=offset), now + timedelta(hours=offset + hours))
            assert _by_id(_server_counts(spec, window)) == _by_id(reference.server_counts(spec, window))
            for shortlist in (SHORTLIST, 2, None):
                expected = reference.candidate_servers(spec, window, shortlist=shortlist)
                got = candidate_servers(spec, window, shortlist=shortlist)
                assert _by_id(got) == _by_id(expected), (spec, window, shortlist)
                # The order within a server is the GPU index, as the ORM version read it.
                assert [s.free for s in _by_id(got)] == [s.free for s in _by_id(expected)]
                args = {"gpu_count": spec.gpu_count, "whole_servers": spec.whole_servers}
                assert place(got, **args) == place(expected, **args)
                checked += sum(len(s.free) for s in got)
    assert checked > 0
