"""Booking MIG slices (docs/fractional.md, "Booking slices"): a slice and its parent GPU exclude each other,
slices pack onto GPUs that are cut already, a slice is charged its share of its GPU."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, connections, transaction

from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.inventory.models import Gpu, GpuModel, MigDevice, Server
from controlplane.ledger.selectors import project_balance
from controlplane.reservations import services
from controlplane.reservations.mig import SliceSlot, pick_slices
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.specs import GpuSpec, Window
from tests.factories import UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window

_seq = itertools.count(1)
# Memory slices, memory and compute slices of the H100-80GB profiles used here (nodeagent/mig.py).
_SIZES = {
    "1g.10gb": (1, 10240, 1),
    "1g.10gb+me": (1, 10240, 1),
    "1g.20gb": (2, 20480, 1),
    "2g.20gb": (2, 20480, 2),
    "3g.40gb": (4, 40960, 3),
    "7g.80gb": (8, 81920, 7),
}


def mig_server(model: GpuModel, layouts: list[list[tuple[str, int]]], *, hostname: str | None = None) -> Server:
    """A server with one GPU per layout, each in MIG mode with the (profile, start) devices given
    (an empty layout: a GPU with MIG off)."""
    srv = server(model, gpus=len(layouts), hostname=hostname)
    for gpu, layout in zip(srv.gpus.order_by("index"), layouts, strict=True):
        if not layout:
            continue
        gpu.mig = {"current": True, "pending": True, "profiles": [], "devices": []}
        gpu.save(update_fields=["mig"])
        for profile, start in layout:
            slices, memory, compute = _SIZES[profile]
            MigDevice.objects.create(
                gpu=gpu,
                uuid=f"MIG-{gpu.uuid}-{start}-{next(_seq)}",
                profile=profile,
                memory_mib=memory,
                memory_slices=slices,
                compute_slices=compute,
                placement_start=start,
            )
    return srv


SEVEN_ONES = [("1g.10gb", i) for i in range(7)]


def mig_spec(profile: str = "1g.10gb", count: int = 1) -> GpuSpec:
    return GpuSpec(mig_profile=profile, gpu_count=count)


def book(proj: Any, s: GpuSpec, w: Window) -> Reservation:
    return services.reservation_create(
        project=proj, name="job", spec=s, window=w, container=CONTAINER, actor=UserFactory()
    )


# -- packing, a pure function -----------------------------------------------------------------------------


def slot(i: int, gpu: int, *, free: int = 8, server: int = 1, start: int = 0, index: int | None = None) -> SliceSlot:
    return SliceSlot(i, gpu, gpu if index is None else index, server, f"h{server}", start, free)


def test_pick_prefers_the_gpu_with_fewest_free_slices_then_lowest_index():
    free = [slot(1, 10, free=8, index=0), slot(2, 11, free=3, index=1, start=5), slot(3, 12, free=3, index=2)]
    assert pick_slices(free, 1) == [2]
    assert pick_slices(free, 2) == [2, 3]


def test_pick_keeps_a_count_on_one_server_when_one_can_hold_it():
    # Server 1 has the most-cut GPU but one slice only; server 2 holds both.
    free = [slot(1, 10, free=1, server=1), slot(2, 20, free=8, server=2), slot(3, 20, free=8, server=2, start=1)]
    assert pick_slices(free, 2) == [2, 3]
    assert pick_slices(free, 3) == [1, 2, 3]  # none holds three: spread by the packing order
    assert pick_slices(free, 4) is None


def test_first_fit_takes_the_first_free_devices_in_fleet_order_whatever_is_cut():
    # bench/fractional.py's baseline: host h1's untouched GPU before h2's cut one, then index, then start.
    free = [slot(1, 20, free=3, server=2), slot(2, 10, free=8, server=1, start=4), slot(3, 10, free=8, server=1)]
    assert pick_slices(free, 1) == [1]
    assert pick_slices(free, 1, strategy="first_fit") == [3]
    assert pick_slices(free, 3, strategy="first_fit") == [3, 2, 1]
    assert pick_slices(free, 4, strategy="first_fit") is None


# -- booking ----------------------------------------------------------------------------------------------

pytestmark = pytest.mark.django_db


def test_slices_are_booked_under_their_gpu_with_their_spans_and_charged_their_share():
    h100 = gpu_model(weight="2")
    mig_server(h100, [SEVEN_ONES])
    proj = project(grant="100")
    r = book(proj, mig_spec(count=2), window(hours=4))
    allocs = list(r.allocations.select_related("mig_device").order_by("slice_start"))
    assert [(a.slice_start, a.slice_end) for a in allocs] == [(0, 1), (1, 2)]
    assert all(a.mig_device is not None and a.mig_device.profile == "1g.10gb" for a in allocs)
    assert r.mig_profile == "1g.10gb" and r.gpu_model_id is None
    # 2 slices x 1/8 of weight 2 x 4 h = 2 credits held.
    assert project_balance(project_id=proj.pk) == Decimal("98")
    placed = r.events.get(reason="placed")
    assert placed.data["gpus"] == [a.mig_device.uuid for a in allocs]


def test_slices_pack_onto_the_gpu_already_cut_in_the_window():
    h100 = gpu_model()
    mig_server(h100, [SEVEN_ONES, SEVEN_ONES])
    w = window(hours=2)
    proj = project()
    first = book(proj, mig_spec(), w)
    second = book(proj, mig_spec(), w)
    gpus = {first.allocations.get().gpu_id, second.allocations.get().gpu_id}
    assert len(gpus) == 1  # the second slice went beside the first, GPU 1 stays untouched


def test_a_whole_gpu_booking_never_lands_on_a_gpu_in_mig_mode():
    # CUDA uses a GPU in MIG mode only through its MIG devices: whole, by model, memory or whole server, it is
    # not bookable (selectors.gpu_matches); its slices are.
    h100 = gpu_model()
    srv = mig_server(h100, [SEVEN_ONES, []])
    whole_gpu = Gpu.objects.get(server=srv, index=1)
    proj = project()
    w = window(hours=2)
    first = book(proj, spec(h100), w)
    assert first.allocations.get().gpu_id == whole_gpu.pk
    for asked in (spec(h100), GpuSpec(min_memory_mib=1, gpu_count=1)):
        with pytest.raises(Conflict) as exc:
            book(proj, asked, w)
        assert exc.value.code == "no_capacity"
        assert "1 of them is in MIG mode" in exc.value.message, exc.value.message
    with pytest.raises(Conflict):
        book(proj, spec(h100, whole=1), Window(w.ends_at, w.ends_at + timedelta(hours=1)))
    book(proj, mig_spec(), w)  # the slices are
    # MIG mode only pending (after the next reset): CUDA still sees the GPU whole.
    Gpu.objects.filter(server=srv, index=0).update(mig={"current": False, "pending": True})
    assert book(proj, spec(h100), Window(w.ends_at, w.ends_at + timedelta(hours=1))).allocations.count() == 1


def test_a_gpu_put_in_mig_mode_between_placement_and_its_lock_is_not_booked_whole(monkeypatch):
    # The competing writer at the critical step: a heartbeat reports MIG mode on for the chosen GPU after
    # placement read it and before the booking locked it; the re-read under the lock sees it, and places again.
    h100 = gpu_model()
    server(h100, gpus=2)
    original = services._share_lock_gpus
    flipped: list[int] = []

    def report_mig_then_lock(gpu_ids: list[int]) -> None:
        if not flipped:
            Gpu.objects.filter(pk__in=gpu_ids).update(mig={"current": True, "pending": True})
            flipped.extend(gpu_ids)
        original(gpu_ids)

    monkeypatch.setattr(services, "_share_lock_gpus", report_mig_then_lock)
    r = book(project(), spec(h100), window())
    assert flipped and r.allocations.get().gpu_id not in flipped


def test_a_slice_is_refused_where_a_whole_gpu_booking_holds_its_gpu():
    # A whole-GPU booking made before MIG mode came on (a GPU reset out of band) still excludes the slices.
    h100 = gpu_model()
    srv = mig_server(h100, [[]])
    proj = project()
    w = window(hours=2)
    book(proj, spec(h100), w)
    gpu = Gpu.objects.get(server=srv)
    Gpu.objects.filter(pk=gpu.pk).update(mig={"current": True, "pending": True})
    for start in range(7):
        MigDevice.objects.create(
            gpu=gpu,
            uuid=f"MIG-late-{start}",
            profile="1g.10gb",
            memory_mib=10240,
            memory_slices=1,
            compute_slices=1,
            placement_start=start,
        )
    with pytest.raises(Conflict) as exc:
        book(proj, mig_spec(), w)
    assert exc.value.code == "no_capacity" and "spec.mig_profile" in exc.value.fields
    book(proj, mig_spec(), Window(w.ends_at, w.ends_at + timedelta(hours=1)))  # back to back is fine


def test_a_gpu_with_mig_off_or_a_server_not_ready_offers_no_slices():
    h100 = gpu_model()
    srv = mig_server(h100, [[], SEVEN_ONES])
    srv.state = "maintenance"
    srv.save(update_fields=["state"])
    with pytest.raises(Conflict):
        book(project(), mig_spec(), window())
    Gpu.objects.filter(server=srv).update(mig={"current": False})
    Server.objects.filter(pk=srv.pk).update(state="ready")
    with pytest.raises(Conflict):
        book(project(), mig_spec(), window())


def test_a_count_takes_that_many_distinct_slices_or_none():
    h100 = gpu_model()
    mig_server(h100, [[("3g.40gb", 0), ("3g.40gb", 4)]])
    proj = project()
    r = book(proj, mig_spec("3g.40gb", count=2), window())
    assert sorted(r.allocations.values_list("slice_start", "slice_end")) == [(0, 4), (4, 8)]
    with pytest.raises(Conflict):
        book(proj, mig_spec("3g.40gb"), window())
    assert Reservation.objects.count() == 1


def test_a_slice_extends_past_its_neighbour_slices_bookings():
    h100 = gpu_model()
    mig_server(h100, [[("1g.10gb", 0), ("1g.10gb", 1)]])
    proj = project()
    w = window(hours=1)
    a = book(proj, mig_spec(), w)
    book(proj, mig_spec(), Window(w.starts_at, w.ends_at + timedelta(hours=3)))
    extended = services.reservation_extend(reservation=a, ends_at=w.ends_at + timedelta(hours=1), actor=None)
    assert extended.ends_at == w.ends_at + timedelta(hours=1)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"mig_profile": "big", "gpu_count": 1}, "spec.mig_profile"),
        ({"mig_profile": "1g.10gb", "whole_servers": 1}, "spec.whole_servers"),
        ({"mig_profile": "1g.10gb", "gpu_count": 1, "min_memory_mib": 10}, "spec.mig_profile"),
        ({"mig_profile": "1g.10gb", "gpu_count": 0}, "spec.gpu_count"),
    ],
)
def test_bad_slice_specs_are_refused_naming_the_field(fields: dict[str, Any], field: str):
    with pytest.raises(ValidationFailed) as exc:
        GpuSpec(**fields).validate()
    assert field in exc.value.fields


# -- the database keeps the invariant (PostgreSQL) ----------------------------------------------------------


def _alloc(r: Reservation, gpu: Gpu, span: tuple[int, int], w: Window) -> None:
    with transaction.atomic():
        Allocation.objects.create(
            reservation=r,
            gpu=gpu,
            server_id=gpu.server_id,
            slice_start=span[0],
            slice_end=span[1],
            starts_at=w.starts_at,
            ends_at=w.ends_at,
        )


@pytest.mark.postgres
def test_the_exclusion_constraint_covers_slice_spans():
    h100 = gpu_model()
    mig_server(h100, [SEVEN_ONES])
    gpu = Gpu.objects.get()
    proj = project()
    w = window(hours=2)
    holders = [
        Reservation.objects.create(
            project=proj,
            name=f"r{i}",
            gpu_model=h100,
            gpu_count=1,
            starts_at=w.starts_at,
            ends_at=w.ends_at,
            image="x",
        )
        for i in range(5)
    ]
    _alloc(holders[0], gpu, (0, 2), w)
    _alloc(holders[1], gpu, (2, 4), w)  # disjoint spans share the GPU
    with pytest.raises(IntegrityError):
        _alloc(holders[2], gpu, (1, 3), w)  # overlaps both
    with pytest.raises(IntegrityError):
        _alloc(holders[3], gpu, (0, 8), w)  # the whole GPU
    _alloc(holders[4], gpu, (0, 8), Window(w.ends_at, w.ends_at + timedelta(hours=1)))  # after them: fine


def _race(proj: Reservation | Any, specs: list[GpuSpec], w: Window) -> list[Any]:
    """Book each spec in its own thread and connection, released together; a refusal is its result."""
    barrier = threading.Barrier(len(specs))
    results: list[Any] = [None] * len(specs)

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = book(proj, specs[i], w)
        except Exception as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_whole_gpu_and_a_slice_racing_for_one_gpu_never_both_win():
    h100 = gpu_model()
    mig_server(h100, [SEVEN_ONES])
    proj = project()
    w = window(hours=2)
    for _round in range(5):
        results = _race(proj, [spec(h100), mig_spec()], w)
        won = [r for r in results if isinstance(r, Reservation)]
        assert len(won) == 1, results
        assert won[0].mig_profile == "1g.10gb", results  # the GPU is in MIG mode: never booked whole
        assert all(isinstance(r, Conflict) for r in results if not isinstance(r, Reservation)), results
        services.reservation_cancel(reservation=won[0], actor=None, reason="next round")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_slices_racing_for_the_last_free_span_never_both_win():
    h100 = gpu_model()
    # Two 3g.40gb devices would share no slice; a 2g.20gb at 0 and a 3g.40gb at 0 do (a layout NVIDIA refuses,
    # but the database must still keep them apart if the inventory ever said so).
    mig_server(h100, [[("2g.20gb", 0), ("3g.40gb", 0)]])
    proj = project()
    w = window(hours=2)
    for _round in range(5):
        results = _race(proj, [mig_spec("2g.20gb"), mig_spec("3g.40gb")], w)
        won = [r for r in results if isinstance(r, Reservation)]
        assert len(won) == 1, results
        services.reservation_cancel(reservation=won[0], actor=None, reason="next round")
