"""A slice booking's launch: its container is given exactly its MIG devices, and what ran is charged by the
slices' weight (docs/fractional.md, "Booking slices")."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.accounting.services import usage_record_reservation
from controlplane.dispatch import recovery, reports, services
from controlplane.dispatch.models import Launch
from controlplane.inventory.choices import ServerState
from controlplane.inventory.models import Server
from controlplane.ledger.selectors import project_balance
from controlplane.reservations import services as reservations
from controlplane.reservations.choices import ReservationState
from controlplane.reservations.specs import GpuSpec, Window
from tests.dispatch.support import CONTAINER, report
from tests.factories import UserFactory
from tests.reservations.fleet import gpu_model, project
from tests.reservations.test_mig_booking import SEVEN_ONES, mig_server

pytestmark = pytest.mark.django_db


def test_the_desired_state_names_exactly_the_booked_mig_uuids_and_charges_by_slice():
    h100 = gpu_model(weight="4")
    srv = mig_server(h100, [SEVEN_ONES, SEVEN_ONES])
    proj = project(grant="100")
    now = timezone.now()
    r = reservations.reservation_create(
        project=proj,
        name="job",
        spec=GpuSpec(mig_profile="1g.10gb", gpu_count=2),
        window=Window(now, now + timedelta(hours=1)),
        container=CONTAINER,
        actor=UserFactory(),
        now=now,
    )
    booked = [a.mig_device.uuid for a in r.allocations.select_related("mig_device").order_by("slice_start")]
    desired, _ = services.desired_state_for(server=srv)
    [item] = desired
    assert item.gpu_uuids == booked
    assert not any(uuid.startswith("GPU-") for uuid in item.gpu_uuids)  # never the parent GPU

    launch = Launch.objects.get(reservation=r)
    start = timezone.now()
    reports.containers_reported(server=srv, now=start, reports=[report(launch, "running", started_at=start)])
    end = start + timedelta(seconds=900)
    reports.containers_reported(
        server=srv,
        now=end,
        reports=[report(launch, "exited", started_at=start, finished_at=end, exit_code=0)],
    )
    r.refresh_from_db()
    assert r.state == ReservationState.COMPLETED
    assert set(r.events.last().data["gpu_seconds"]) == set(booked)
    # 2 slices x 1/8 x weight 4 x 0.25 h = 0.25 credits charged, the rest of the hold released.
    assert project_balance(project_id=proj.pk) == pytest.approx(Decimal("99.75"), abs=Decimal("0.01"))

    # The usage record is measured by the MIG uuids too, and costs the slices' share of the GPU's price.
    [record] = usage_record_reservation(reservation=r)  # both slices are on one GPU: one record for it
    assert record.measured is True
    assert record.gpu_seconds == pytest.approx(1800.0, abs=5)  # two slices x 900 s
    assert record.credits == pytest.approx(Decimal("0.25"), abs=Decimal("0.01"))
    # Price 2 an hour x 1/8 x 0.5 slice-hours.
    assert record.cost == pytest.approx(Decimal("0.125"), abs=Decimal("0.01"))


def test_an_interrupted_slice_booking_is_requeued_as_slices_of_its_profile():
    h100 = gpu_model()
    first = mig_server(h100, [SEVEN_ONES])
    second = mig_server(h100, [SEVEN_ONES])
    now = timezone.now()
    r = reservations.reservation_create(
        project=project(),
        name="job",
        spec=GpuSpec(mig_profile="1g.10gb", gpu_count=1),
        window=Window(now, now + timedelta(hours=1)),
        container=CONTAINER,
        actor=UserFactory(),
        now=now,
    )
    lost = r.allocations.get().gpu.server
    assert lost in (first, second)
    Server.objects.filter(pk=lost.pk).update(state=ServerState.MAINTENANCE)
    follow_up = recovery.requeue(reservation=r, now=timezone.now())
    assert follow_up is not None and follow_up.mig_profile == "1g.10gb"
    [allocation] = follow_up.allocations.select_related("mig_device", "gpu")
    assert allocation.mig_device is not None and allocation.gpu.server_id != lost.pk
