"""An allocation's server is its GPU's, whatever writes either row (migration 0007), on both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from controlplane.inventory.models import Gpu
from controlplane.reservations.models import Allocation
from controlplane.reservations.services import reservation_create
from controlplane.reservations.specs import GpuSpec, Window
from tests.reservations.fleet import CONTAINER, gpu_model, hold, project, server

pytestmark = pytest.mark.django_db


def _mismatched() -> list[tuple[int, int, int]]:
    return list(
        Allocation.objects.exclude(server_id=F("gpu__server_id")).values_list("pk", "server_id", "gpu__server_id")
    )


def test_a_booking_names_the_server_of_the_gpus_it_took() -> None:
    model = gpu_model()
    servers = [server(model, gpus=4) for _ in range(2)]
    now = timezone.now()
    r = reservation_create(
        project=project(),
        name="job",
        spec=GpuSpec(gpu_model_id=model.pk, gpu_count=3),
        window=Window(now + timedelta(hours=1), now + timedelta(hours=2)),
        container=CONTAINER,
        actor=None,
    )
    allocations = list(r.allocations.select_related("gpu"))
    assert len(allocations) == 3
    assert {a.server_id for a in allocations} <= {s.pk for s in servers}
    assert all(a.server_id == a.gpu.server_id for a in allocations)


def test_a_gpu_that_moves_servers_takes_its_allocations_along() -> None:
    model = gpu_model()
    old, new = server(model, gpus=2), server(model, gpus=2)
    gpu = old.gpus.order_by("index").first()
    assert gpu is not None
    now = timezone.now()
    booked = [hold(gpu, now + timedelta(hours=h), now + timedelta(hours=h + 1)) for h in (1, 3)]
    past = hold(gpu, now - timedelta(hours=3), now - timedelta(hours=2), active=False)
    # As fleet.ingest moves a card that another server now reports: a bulk update of the GPU row.
    Gpu.objects.filter(pk=gpu.pk).update(server=new, index=7)
    assert set(Allocation.objects.filter(gpu=gpu).values_list("server_id", flat=True)) == {new.pk}
    # And through save(), back again.
    gpu.refresh_from_db()
    gpu.server = old
    gpu.save(update_fields=["server"])
    assert {a.pk for a in Allocation.objects.filter(server_id=old.pk)} == {*(a.pk for a in booked), past.pk}
    assert _mismatched() == []


def test_an_allocation_naming_another_server_is_refused() -> None:
    model = gpu_model()
    mine, other = server(model, gpus=1), server(model, gpus=1)
    gpu = mine.gpus.get()
    now = timezone.now()
    alloc = hold(gpu, now + timedelta(hours=1), now + timedelta(hours=2))
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(
            reservation=alloc.reservation,
            gpu=gpu,
            server_id=other.pk,
            slice_start=1,
            starts_at=alloc.ends_at,
            ends_at=alloc.ends_at + timedelta(hours=1),
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.filter(pk=alloc.pk).update(server_id=other.pk)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.filter(pk=alloc.pk).update(gpu=other.gpus.get())
    assert _mismatched() == []
    assert Allocation.objects.get(pk=alloc.pk).server_id == mine.pk
    # The same row, naming the GPU's own server, is fine: the refusals above were the server's alone.
    Allocation.objects.create(
        reservation=alloc.reservation,
        gpu=gpu,
        server_id=mine.pk,
        slice_start=1,
        starts_at=alloc.ends_at,
        ends_at=alloc.ends_at + timedelta(hours=1),
    )
