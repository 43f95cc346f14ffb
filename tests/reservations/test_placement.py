"""Property tests of the placement rule (pure function) and of placement against the database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.core.errors import Conflict
from controlplane.reservations.models import Allocation
from controlplane.reservations.placement import (
    LOCAL_NUMA,
    LOCAL_NVLINK,
    GpuSlot,
    ServerCandidate,
    coverage,
    pick_in_server,
    place,
)


@st.composite
def fleets(draw):  # type: ignore[no-untyped-def]
    servers = []
    next_id = 1
    for s in range(draw(st.integers(1, 6))):
        size = draw(st.sampled_from([1, 2, 4, 8]))
        ids = list(range(next_id, next_id + size))
        next_id += size
        half = max(1, size // 2)
        groups = [ids[:half], ids[half:]]
        busy = draw(st.sets(st.sampled_from(ids), max_size=size))
        free = tuple(
            GpuSlot(gid, i, 0 if i < half else 1, frozenset(p for g in groups if gid in g for p in g if p != gid))
            for i, gid in enumerate(ids)
            if gid not in busy
        )
        servers.append(ServerCandidate(s + 1, f"h{s:02d}", size, free, whole=not busy))
    return servers


@given(fleets(), st.integers(1, 20))
def test_placement_takes_only_free_gpus_once_and_exactly_the_count(servers, count):
    free = {g.id for s in servers for g in s.free}
    chosen = place(servers, gpu_count=count)
    if chosen is None:
        return
    assert len(chosen) == count and len(set(chosen)) == count
    assert set(chosen) <= free


@given(fleets(), st.integers(1, 8))
def test_a_count_that_fits_one_server_lands_on_one_server_best_fit(servers, count):
    largest = max(s.total for s in servers)
    chosen = place(servers, gpu_count=count)
    server_of = {g.id: s for s in servers for g in s.free}
    fitting = [s for s in servers if len(s.free) >= count]
    if count > largest:
        return
    if not fitting:
        assert chosen is None
        return
    assert chosen is not None
    used = {server_of[g].id for g in chosen}
    assert len(used) == 1
    # Best fit: no other server could have held it with fewer free GPUs left over.
    picked = server_of[chosen[0]]
    assert len(picked.free) == min(len(s.free) for s in fitting)


@given(fleets(), st.integers(1, 40))
def test_a_count_larger_than_any_server_spans_servers_only_when_needed(servers, count):
    largest = max(s.total for s in servers)
    total_free = sum(len(s.free) for s in servers)
    chosen = place(servers, gpu_count=count)
    if count > largest:
        assert (chosen is not None) == (total_free >= count)


@given(fleets(), st.integers(1, 3))
def test_whole_servers_are_wholly_free(servers, count):
    chosen = place(servers, whole_servers=count)
    whole = [s for s in servers if s.whole and s.free]
    if len(whole) < count:
        assert chosen is None
        return
    assert chosen is not None
    picked = {s.id for s in servers for g in s.free if g.id in chosen}
    assert len(picked) == count
    for s in servers:
        if s.id in picked:
            assert s.whole and {g.id for g in s.free} <= set(chosen)


def test_locality_prefers_an_nvlink_group_then_a_numa_node():
    linked = [GpuSlot(1, 0, 0, frozenset({2})), GpuSlot(2, 1, 1, frozenset({1})), GpuSlot(3, 2, 0), GpuSlot(4, 3, 0)]
    chosen, locality = pick_in_server(linked, 2)
    assert {g.id for g in chosen} == {1, 2} and locality == LOCAL_NVLINK
    numa = [GpuSlot(1, 0, 0), GpuSlot(2, 1, 1), GpuSlot(3, 2, 1), GpuSlot(4, 3, 0), GpuSlot(5, 4, 1)]
    chosen, locality = pick_in_server(numa, 2)
    assert {g.numa_node for g in chosen} == {0} and locality == LOCAL_NUMA


def test_best_fit_keeps_whole_servers_for_later():
    full = ServerCandidate(1, "a", 8, tuple(GpuSlot(i, i) for i in range(1, 9)), whole=True)
    partly = ServerCandidate(2, "b", 8, tuple(GpuSlot(i, i) for i in range(11, 14)))
    assert set(place([full, partly], gpu_count=2) or []) <= {11, 12, 13}


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), max_size=12), st.integers(1, 4))
def test_coverage_marks_exactly_the_points_covered_k_times(raw, k):
    intervals = [(float(a), float(a + d)) for a, d in raw]
    stretches = coverage(intervals, k)
    for point in [x / 2 for x in range(0, 150)]:
        depth = sum(1 for a, b in intervals if a <= point <= b)
        inside = any(a <= point <= b for a, b in stretches)
        assert inside == (depth >= k)


@pytest.mark.django_db
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(1, 6), st.integers(1, 4)), min_size=1, max_size=10))
def test_booking_random_requests_never_double_books(requests):
    from django.utils import timezone

    from controlplane.reservations import services
    from controlplane.reservations.specs import Window
    from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec

    Allocation.objects.all().delete()
    model = gpu_model()
    if not model.gpus.exists():
        server(model, gpus=4)
        server(model, gpus=2)
    proj = project()
    base = timezone.now() + timedelta(hours=1)
    for start, hours, count in requests:
        w = Window(base + timedelta(hours=start), base + timedelta(hours=start + hours))
        try:
            r = services.reservation_create(
                project=proj, name="p", spec=spec(model, count=count), window=w, container=CONTAINER, actor=None
            )
        except Conflict:
            continue
        servers = {a.gpu.server_id for a in r.allocations.select_related("gpu")}
        assert len(servers) == 1 and r.allocations.count() == count
    active = list(Allocation.objects.filter(active=True).values_list("gpu_id", "starts_at", "ends_at"))
    for i, (g1, a1, b1) in enumerate(active):
        for g2, a2, b2 in active[i + 1 :]:
            assert not (g1 == g2 and a1 < b2 and a2 < b1)
