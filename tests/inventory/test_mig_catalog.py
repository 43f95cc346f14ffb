"""The catalog's MIG profiles (docs/fractional.md, "Price"): memory, weight and price per profile, an operator's
weight override priced by the one rate rule, slices beside whole GPUs in the usage report and in telemetry."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.accounting.models import GpuUsageHour
from controlplane.accounting.rollup import rollup_pending
from controlplane.accounting.selectors import fleet_report
from controlplane.dispatch.choices import LaunchState
from controlplane.dispatch.models import Launch
from controlplane.inventory.models import GpuModel, GpuModelMigProfile
from controlplane.inventory.services import mig_profile_set_weight, mig_profiles_add
from controlplane.ledger.selectors import project_balance
from controlplane.reservations import costs, services
from controlplane.reservations.models import Allocation, Reservation
from controlplane.reservations.specs import Window
from controlplane.system.management.demo import seed_catalog
from nodeagent.mig import PROFILES
from tests.accounting.helpers import at, book, finish, telemetry
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import CONTAINER, gpu_model, project, server, spec, window
from tests.reservations.test_mig_booking import SEVEN_ONES, mig_server, mig_spec
from tests.reservations.test_mig_booking import book as book_slices

pytestmark = pytest.mark.django_db

URL = "/api/v1/gpu-models/"


def with_profiles(model: GpuModel) -> GpuModel:
    table = PROFILES["H100-80GB"].values()
    mig_profiles_add(model=model, profiles=[(p.name, p.memory_mib, p.compute_slices, p.memory_slices) for p in table])
    return model


def profile(model: GpuModel, name: str) -> GpuModelMigProfile:
    return GpuModelMigProfile.objects.get(gpu_model=model, name=name)


def test_an_override_prices_the_hold_and_null_returns_to_the_memory_share():
    h100 = with_profiles(gpu_model(weight="2"))
    mig_server(h100, [SEVEN_ONES])
    proj = project(grant="100")
    book_slices(proj, mig_spec(count=2), window(hours=4))
    # The default: 2 slices x 1/8 of weight 2 x 4 h.
    assert project_balance(project_id=proj.pk) == Decimal("98")
    mig_profile_set_weight(profile=profile(h100, "1g.10gb"), billing_weight=Decimal("0.5"))
    r = book_slices(proj, mig_spec(count=2), window(timedelta(hours=6), hours=4))
    assert project_balance(project_id=proj.pk) == Decimal("94")  # 2 x 0.5 x 4 h
    assert costs.cost_for(Reservation.objects.get(pk=r.pk))["credits_per_hour"] == "1.0000"
    mig_profile_set_weight(profile=profile(h100, "1g.10gb"), billing_weight=None)
    assert costs.cost_for(Reservation.objects.get(pk=r.pk))["credits_per_hour"] == "0.5000"


def test_pricing_slices_reads_the_overrides_once_and_whole_gpus_read_nothing():
    h100 = with_profiles(gpu_model(weight="2"))
    mig_server(h100, [SEVEN_ONES, SEVEN_ONES])
    server(h100, gpus=2)
    mig_profile_set_weight(profile=profile(h100, "1g.10gb"), billing_weight=Decimal("0.3"))
    proj = project()
    sliced = book_slices(proj, mig_spec(count=6), window(hours=2))
    whole = services.reservation_create(
        project=proj,
        name="whole",
        spec=spec(h100, count=2),
        window=window(hours=2),
        container=CONTAINER,
        actor=UserFactory(),
    )
    for r, reads in ((sliced, 2), (whole, 0)):
        allocations = list(Allocation.objects.filter(reservation=r).select_related("gpu__model"))
        with CaptureQueriesContext(connection) as ctx:
            costs.load_weights(allocations)
            weights = [costs.weight(a) for a in allocations]
        # The MIG devices and the overrides: one read each for all the slices.
        assert len(ctx.captured_queries) == reads
        assert weights == ([Decimal("0.3")] * 6 if r is sliced else [Decimal(2)] * 2)


def test_the_catalog_shows_profiles_and_operators_set_an_override(api_client: Any):
    h100 = with_profiles(gpu_model(weight="2"))
    h100.price_per_gpu_hour = Decimal("4")
    h100.save()
    api_client.force_authenticate(UserFactory())
    body = api_client.get(f"{URL}{h100.pk}/").json()
    by_name = {p["name"]: p for p in body["mig_profiles"]}
    assert set(by_name) == set(PROFILES["H100-80GB"])
    assert by_name["3g.40gb"] == {
        "name": "3g.40gb",
        "memory_mib": 40448,
        "compute_slices": 3,
        "memory_slices": 4,
        "billing_weight": None,
        "effective_billing_weight": "1.0000",
        "weight_overridden": False,
        "price_per_hour": "2.0000",
    }
    patch = f"{URL}{h100.pk}/mig-profiles/1g.10gb/"
    assert api_client.patch(patch, {"billing_weight": "0.4"}, format="json").status_code == 403
    api_client.force_authenticate(OperatorFactory())
    res = api_client.patch(patch, {"billing_weight": "0.4"}, format="json")
    assert res.status_code == 200, res.content
    assert res.json()["effective_billing_weight"] == "0.4000" and res.json()["weight_overridden"] is True
    assert res.json()["price_per_hour"] == "0.8000"
    for bad in ({"billing_weight": "-1"}, {"billing_weight": "much"}, {}):
        res = api_client.patch(patch, bad, format="json")
        assert res.status_code == 400 and "billing_weight" in str(res.json()), res.content
    assert api_client.patch(f"{URL}{h100.pk}/mig-profiles/9g.99gb/", {"billing_weight": "1"}).status_code == 404
    res = api_client.patch(patch, {"billing_weight": None}, format="json")
    assert res.json()["weight_overridden"] is False and res.json()["effective_billing_weight"] == "0.2500"


def test_the_catalog_list_reads_profiles_in_one_query(api_client: Any):
    for name in ("H100-80GB", "A100-80GB", "A100-40GB"):
        with_profiles(gpu_model(name))
    api_client.force_authenticate(UserFactory())
    with CaptureQueriesContext(connection) as ctx:
        res = api_client.get(URL)
    assert res.status_code == 200 and all(len(m["mig_profiles"]) == 7 for m in res.json()["results"])
    assert len(ctx.captured_queries) <= 4


def test_the_demo_catalog_takes_its_profiles_from_the_nvidia_tables_and_keeps_overrides():
    seed_catalog()
    for name, table in PROFILES.items():
        rows = {p.name: p for p in GpuModelMigProfile.objects.filter(gpu_model__name=name)}
        assert set(rows) == set(table)
        assert all(
            rows[n].memory_mib == p.memory_mib and rows[n].memory_slices == p.memory_slices for n, p in table.items()
        )
    h100 = GpuModel.objects.get(name="H100-80GB")
    mig_profile_set_weight(profile=profile(h100, "7g.80gb"), billing_weight=Decimal("0.9"))
    seed_catalog()
    assert profile(h100, "7g.80gb").billing_weight == Decimal("0.9")
    assert not GpuModelMigProfile.objects.filter(gpu_model__name="MI300X").exists()


@pytest.fixture
def slice_and_whole() -> tuple[Reservation, Reservation]:
    h100 = with_profiles(gpu_model(weight="2"))
    mig_server(h100, [SEVEN_ONES])
    server(h100, gpus=1)
    proj = project()
    start, end = at("2025-03-10 10:00"), at("2025-03-10 12:00")
    sliced = services.reservation_create(
        project=proj,
        name="slice",
        spec=mig_spec(),
        window=Window(start, end),
        container=CONTAINER,
        actor=UserFactory(),
        now=start - timedelta(hours=1),
    )
    whole = book(proj, h100, start, end, actor=UserFactory())
    for r in (sliced, whole):
        allocation = r.allocations.select_related("gpu", "mig_device").get()
        Launch.objects.create(
            reservation=r,
            server_id=allocation.gpu.server_id,
            gpu_uuids=[allocation.device_uuid],
            state=LaunchState.EXITED,
            started_at=start,
            finished_at=start + timedelta(hours=1),
        )
        telemetry(allocation.gpu_id, start, 60, util=80.0)
    return sliced, whole


def test_the_report_by_gpu_model_shows_slices_beside_whole_gpus(api_client: Any, slice_and_whole: Any):
    sliced, whole = slice_and_whole
    for r in (sliced, whole):
        finish(r, ended_at=at("2025-03-10 12:00"))
    rollup_pending(now=at("2025-03-10 13:00"))
    report = fleet_report(start=at("2025-03-01 00:00"), end=at("2025-04-01 00:00"), group_by="gpu_model")
    rows = {row.key: row for row in report.rows}
    assert set(rows) == {"H100-80GB", "H100-80GB 1g.10gb"}
    assert (rows["H100-80GB"].unit, rows["H100-80GB 1g.10gb"].unit) == ("gpu", "1g.10gb")
    # An hour run: the whole GPU at weight 2, the slice at 1/8 of it; each its own held time and telemetry.
    assert rows["H100-80GB"].credits == Decimal("2.0000")
    assert rows["H100-80GB 1g.10gb"].credits == Decimal("0.2500")
    assert rows["H100-80GB 1g.10gb"].held_s == pytest.approx(7200) and rows["H100-80GB"].held_s == pytest.approx(7200)
    # An hour at 300 W on each GPU: the slice takes its 1/8 of its parent's energy, the rest of that GPU is unheld
    # (in the model's whole row, as unheld GPUs are), and the utilization it shows is its parent's.
    assert rows["H100-80GB 1g.10gb"].energy_wh == pytest.approx(37.5)
    assert rows["H100-80GB"].energy_wh == pytest.approx(300 + 262.5)
    assert rows["H100-80GB 1g.10gb"].util_mean == pytest.approx(80.0)
    by_gpu = GpuUsageHour.objects.filter(gpu=sliced.allocations.get().gpu, hour=at("2025-03-10 10:00"))
    assert sorted((h.reservation_id is None, h.energy_wh, h.power_mean_w) for h in by_gpu) == [
        (False, pytest.approx(37.5), pytest.approx(37.5)),
        (True, pytest.approx(262.5), pytest.approx(262.5)),
    ]
    api_client.force_authenticate(OperatorFactory())
    csv = api_client.get(
        "/api/v1/usage/fleet", {"group_by": "gpu_model", "start": "2025-03-01", "end": "2025-04-01", "format": "csv"}
    ).content.decode()
    lines = csv.splitlines()
    assert lines[0].endswith(",unit")
    assert any(line.startswith("H100-80GB 1g.10gb,") and line.endswith(",1g.10gb") for line in lines)
    by_project = fleet_report(start=at("2025-03-01 00:00"), end=at("2025-04-01 00:00"), group_by="project")
    assert {row.unit for row in by_project.rows} == {""}


def test_unsettled_slices_are_their_own_row_too(slice_and_whole: Any):
    report = fleet_report(
        start=at("2025-03-01 00:00"), end=at("2025-04-01 00:00"), group_by="gpu_model", now=at("2025-03-10 11:00")
    )
    rows = {row.key: row for row in report.rows}
    assert rows["H100-80GB 1g.10gb"].provisional and rows["H100-80GB 1g.10gb"].credits == Decimal("0.2500")
    assert rows["H100-80GB"].credits == Decimal("2.0000")


def test_a_slices_telemetry_says_it_is_its_parents_readings(api_client: Any, slice_and_whole: Any):
    sliced, whole = slice_and_whole
    api_client.force_authenticate(OperatorFactory())
    for r, readings, share in ((sliced, "parent", "0.1250"), (whole, "gpu", "1.0000")):
        body = api_client.get(f"/api/v1/reservations/{r.public_id}/telemetry/").json()
        (gpu,) = body["gpus"]
        assert (gpu["readings"], gpu["share"]) == (readings, share)
        assert (gpu["mig_device"] is None) == (r is whole)
        assert gpu["mig_profile"] == ("1g.10gb" if r is sliced else None)
