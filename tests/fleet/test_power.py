"""Power drawn against rated power per server (inventory.selectors.server_power), as the fleet API shows it."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.inventory.models import Gpu, GpuModel, known_tdp_watts
from tests.factories import OperatorFactory, UserFactory
from tests.reservations.fleet import server

pytestmark = pytest.mark.django_db


def a100() -> GpuModel:
    return GpuModel.objects.create(
        name="A100-80GB", product_name="NVIDIA A100-SXM4-80GB", memory_mib=81920, billing_weight=Decimal(1)
    )


def test_known_tdps_tell_similar_names_apart():
    assert known_tdp_watts("NVIDIA A100-SXM4-80GB") == 400
    assert known_tdp_watts("NVIDIA A100-PCIE-40GB") == 250
    assert known_tdp_watts("NVIDIA A10") == 150
    assert known_tdp_watts("NVIDIA L4") == 72 and known_tdp_watts("NVIDIA L40S") == 350
    assert known_tdp_watts("NVIDIA H100 80GB HBM3") == 700
    assert known_tdp_watts("Imaginary GPU") is None


def test_an_8_gpu_a100_server_is_rated_3_2_kw_and_shows_its_fresh_draw(api_client):  # type: ignore[no-untyped-def]
    srv = server(a100(), gpus=8)
    now = timezone.now()
    gpus = list(srv.gpus.order_by("index"))
    for gpu in gpus[:7]:
        Gpu.objects.filter(pk=gpu.pk).update(telemetry={"DCGM_FI_DEV_POWER_USAGE": 250.0}, telemetry_at=now)
    # A stale reading is not "drawn now".
    Gpu.objects.filter(pk=gpus[7].pk).update(
        telemetry={"DCGM_FI_DEV_POWER_USAGE": 390.0}, telemetry_at=now - timedelta(minutes=10)
    )
    api_client.force_authenticate(OperatorFactory())
    power = api_client.get(f"/api/v1/servers/{srv.pk}/").json()["power"]
    assert power == {"drawn_w": 1750.0, "rated_w": 3200, "share": round(1750 / 3200, 4), "gpus_reporting": 7}
    listed = api_client.get("/api/v1/servers/").json()["results"][0]["power"]
    assert listed["rated_w"] == 3200


def test_an_operator_given_rating_wins_and_an_unknown_model_has_none(api_client):  # type: ignore[no-untyped-def]
    rated = server(a100(), gpus=2)
    rated.rated_power_w = 1000
    rated.save(update_fields=["rated_power_w"])
    unknown = server(GpuModel.objects.create(name="X1", product_name="Imaginary GPU", memory_mib=1024), gpus=2)
    api_client.force_authenticate(OperatorFactory())
    assert api_client.get(f"/api/v1/servers/{rated.pk}/").json()["power"]["rated_w"] == 1000
    power = api_client.get(f"/api/v1/servers/{unknown.pk}/").json()["power"]
    assert power == {"drawn_w": None, "rated_w": None, "share": None, "gpus_reporting": 0}


def test_tenants_do_not_see_power(api_client):  # type: ignore[no-untyped-def]
    srv = server(a100(), gpus=1)
    api_client.force_authenticate(UserFactory())
    assert "power" not in api_client.get(f"/api/v1/servers/{srv.pk}/").json()


def test_sites_take_a_pue_and_a_price_and_refuse_a_pue_under_one(api_client):  # type: ignore[no-untyped-def]
    api_client.force_authenticate(OperatorFactory())
    ok = api_client.post("/api/v1/sites/", {"name": "dc-1", "pue": "1.20", "electricity_price_per_kwh": "0.12"})
    assert ok.status_code == 201, ok.content
    assert ok.json()["pue"] == "1.20" and ok.json()["electricity_price_per_kwh"] == "0.1200"
    assert api_client.post("/api/v1/sites/", {"name": "dc-2"}).json()["pue"] == "1.50"
    bad = api_client.post("/api/v1/sites/", {"name": "dc-3", "pue": "0.9"})
    assert bad.status_code == 400 and "pue" in bad.json()["error"]["fields"]
