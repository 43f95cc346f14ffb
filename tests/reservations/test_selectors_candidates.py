"""The candidate read (``candidate_servers``): which servers and free GPUs a booking looks at, on both databases
(on PostgreSQL a count of one model's GPUs reads the capacity summary, migration 0004)."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db.models import Count, Q
from django.utils import timezone

from controlplane.inventory.choices import GpuHealth, ServerState
from controlplane.inventory.models import Gpu
from controlplane.reservations.models import Allocation
from controlplane.reservations.selectors import (
    SHORTLIST,
    _ServerCount,
    _shortlist,
    candidate_servers,
    overlapping,
    placeable_gpus,
)
from controlplane.reservations.specs import GpuSpec, Window
from tests.reservations.fleet import gpu_model, hold, project, server

pytestmark = pytest.mark.django_db
H = timedelta(hours=1)


def _free(servers):  # type: ignore[no-untyped-def]
    """Per hostname, the indexes of the free GPUs as read."""
    out = {}
    for s in servers:
        indexes = dict(Gpu.objects.filter(pk__in=[g.id for g in s.free]).values_list("pk", "index"))
        out[s.hostname] = [indexes[g.id] for g in s.free]
    return out


def small_fleet(now):  # type: ignore[no-untyped-def]
    """a: 4 GPUs, 0 busy in [now+1h, now+3h) and 1 ending exactly at now+1h; b: 4 GPUs, 2 busy; c: 2 GPUs, one
    unhealthy; d: 8 GPUs, draining; e: 2 GPUs of another model; f: 4 GPUs, one released hold (holds nothing)."""
    model, other = gpu_model(), gpu_model("A100-40GB", memory_mib=40960)
    a = server(model, gpus=4, hostname="a")
    b = server(model, gpus=4, hostname="b")
    c = server(model, gpus=2, hostname="c")
    server(model, gpus=8, hostname="d", state=ServerState.DRAINING)
    server(other, gpus=2, hostname="e")
    f = server(model, gpus=4, hostname="f")
    ga = list(Gpu.objects.filter(server=a).order_by("index"))
    hold(ga[0], now - H, now + H)  # ends as the window starts: half-open, so free
    hold(ga[1], now + 3 * H, now + 5 * H)  # starts as the window ends: free
    gb = list(Gpu.objects.filter(server=b).order_by("index"))
    hold(gb[1], now, now + 2 * H)
    hold(gb[3], now + 2 * H, now + 4 * H)
    Gpu.objects.filter(server=c, index=1).update(health=GpuHealth.UNHEALTHY)
    hold(Gpu.objects.get(server=f, index=2), now, now + 9 * H, active=False)
    return model, other


def test_free_gpus_per_server_over_a_window_by_hand() -> None:
    now = timezone.now()
    model, other = small_fleet(now)
    window = Window(now + H, now + 3 * H)

    every = candidate_servers(GpuSpec(gpu_model_id=model.pk, gpu_count=1), window, shortlist=None)
    # d is draining, e another model, c's unhealthy GPU is no candidate, b's busy ones are not free.
    assert _free(every) == {"a": [0, 1, 2, 3], "b": [0, 2], "c": [0], "f": [0, 1, 2, 3]}
    by_memory = candidate_servers(GpuSpec(min_memory_mib=40000, gpu_count=1), window, shortlist=None)
    assert set(_free(by_memory)) == {"a", "b", "c", "e", "f"}
    assert _free(candidate_servers(GpuSpec(gpu_model_id=other.pk, gpu_count=1), window, shortlist=None)) == {
        "e": [0, 1]
    }


def test_the_shortlist_is_the_best_fitting_servers_by_free_gpus_then_hostname() -> None:
    now = timezone.now()
    model, _ = small_fleet(now)
    window = Window(now + H, now + 3 * H)
    # Two GPUs: b has exactly two free (fit 0), then a and f with four (fit 2, by hostname); c has too few.
    two = candidate_servers(GpuSpec(gpu_model_id=model.pk, gpu_count=2), window, shortlist=SHORTLIST)
    assert [s.hostname for s in two] == ["b", "a", "f"]
    assert [
        s.hostname for s in candidate_servers(GpuSpec(gpu_model_id=model.pk, gpu_count=2), window, shortlist=2)
    ] == [
        "b",
        "a",
    ]
    one = candidate_servers(GpuSpec(gpu_model_id=model.pk, gpu_count=1), window, shortlist=SHORTLIST)
    assert [s.hostname for s in one] == ["c", "b", "a", "f"]
    # More than one server holds: every server with a free GPU is seen.
    six = candidate_servers(GpuSpec(gpu_model_id=model.pk, gpu_count=6), window, shortlist=SHORTLIST)
    assert {s.hostname for s in six} == {"a", "b", "c", "f"}


def test_whole_servers_are_those_whose_every_present_gpu_matches_and_is_free() -> None:
    now = timezone.now()
    model, _ = small_fleet(now)
    window = Window(now + H, now + 3 * H)
    whole = candidate_servers(GpuSpec(gpu_model_id=model.pk, whole_servers=1), window, shortlist=SHORTLIST)
    # b has busy GPUs, c an unhealthy one; a and f are whole for this window.
    assert sorted(s.hostname for s in whole if s.whole) == ["a", "f"]
    later = Window(now, now + 2 * H)  # a's first GPU is busy until now + 1 h
    assert sorted(
        s.hostname for s in candidate_servers(GpuSpec(gpu_model_id=model.pk, whole_servers=1), later) if s.whole
    ) == ["f"]


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


@pytest.mark.parametrize("seed", range(8))
def test_the_candidates_are_the_placeable_gpus_with_no_allocation_in_the_window(seed: int) -> None:
    """Property: on random fleets the read's free GPUs are exactly what the definitions say (placeable_gpus,
    overlapping), and the shortlist is _shortlist's pick from them."""
    rng = random.Random(seed)
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    model = random_fleet(rng, now)
    specs = [GpuSpec(gpu_model_id=model.pk, gpu_count=n) for n in (1, 2, 3, 4, 8, 12)]
    specs += [GpuSpec(min_memory_mib=40000, gpu_count=2), GpuSpec(gpu_model_id=model.pk, whole_servers=1)]
    checked = 0
    for spec in specs:
        for offset, hours in ((0, 1), (1, 2), (-3, 12), (5, 1)):
            window = Window(now + timedelta(hours=offset), now + timedelta(hours=offset + hours))
            busy = overlapping(Allocation.objects.all(), window.starts_at, window.ends_at).values("gpu_id")
            free = placeable_gpus(spec).exclude(pk__in=busy)
            if spec.whole_servers is None:
                expected = set(free.values_list("pk", flat=True))
            else:  # every present GPU of a ready server, matching or not, as placement judges wholeness
                expected = set(free.filter(server__state=ServerState.READY).values_list("pk", flat=True))
            every = candidate_servers(spec, window, shortlist=None)
            got = {g.id for s in every for g in s.free}
            if spec.whole_servers is None:
                assert got == expected, (spec, window)
            else:
                assert got <= expected, (spec, window)
            for s in every:  # each server's GPUs in index order
                indexes = list(
                    Gpu.objects.filter(pk__in=[g.id for g in s.free]).order_by("index").values_list("pk", flat=True)
                )
                assert [g.id for g in s.free] == indexes
            if spec.whole_servers is None:
                # The shortlist is _shortlist's pick from every ready server's matching and free counts.
                counts = [
                    _ServerCount(row["server_id"], row["server__hostname"], 0, row["matching"], row["free"])
                    for row in placeable_gpus(spec)
                    .values("server_id", "server__hostname")
                    .annotate(matching=Count("id"), free=Count("id", filter=~Q(pk__in=busy)))
                ]
                picked = [c.id for c in _shortlist(spec, counts, SHORTLIST)]
                assert [s.id for s in candidate_servers(spec, window)] == picked, (spec, window)
            checked += len(got)
    assert checked > 0
