"""Hourly rollups: attribution to the holder, idle time, energy from the counter or from power."""

from __future__ import annotations

import pytest

from controlplane.accounting.models import GpuUsageHour, RollupWatermark
from controlplane.accounting.rollup import rollup_hour, rollup_pending
from controlplane.accounting.selectors import fleet_report, project_report, timeseries
from tests.accounting.helpers import at, book, finish, ran, telemetry

pytestmark = pytest.mark.django_db


def test_gpu_without_energy_counter_gets_integrated_mean_power(rack):  # type: ignore[no-untyped-def]
    gpu = rack.gpus.first()
    telemetry(gpu.pk, at("2025-03-10 10:00"), 60, power_w=300.0, energy_counter=False)
    rollup_hour(hour=at("2025-03-10 10:00"), upto=at("2025-03-10 12:00"))

    row = GpuUsageHour.objects.get(gpu=gpu)
    assert row.energy_wh == pytest.approx(300.0)  # 300 W for an hour
    assert row.energy_from_counter is False and row.power_mean_w == pytest.approx(300.0)


def test_energy_counter_is_preferred_where_the_gpu_has_one(rack):  # type: ignore[no-untyped-def]
    gpu = rack.gpus.first()
    # The counter says 300 W while the power samples say 100 W: the counter wins from the second minute.
    telemetry(gpu.pk, at("2025-03-10 09:59"), 61, power_w=300.0, energy_counter=True)
    GpuUsageHour.objects.all().delete()
    from controlplane.fleet.models import GpuTelemetryMinute

    GpuTelemetryMinute.objects.filter(gpu=gpu).update(power_sum_w=100.0 * 60)
    rollup_hour(hour=at("2025-03-10 10:00"), upto=at("2025-03-10 12:00"))

    row = GpuUsageHour.objects.get(gpu=gpu)
    assert row.energy_from_counter is True
    assert row.energy_wh == pytest.approx(300.0)


def test_minutes_are_attributed_to_the_reservation_holding_the_gpu(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:30"), at("2025-03-10 12:00"))
    gpu_id = r.allocations.get().gpu_id
    telemetry(gpu_id, at("2025-03-10 10:00"), 30, util=90.0)  # before the window: nobody's
    telemetry(gpu_id, at("2025-03-10 10:30"), 20, util=2.0)  # held, idle
    telemetry(gpu_id, at("2025-03-10 10:50"), 10, util=80.0)
    rollup_hour(hour=at("2025-03-10 10:00"), upto=at("2025-03-10 12:00"))

    held = GpuUsageHour.objects.get(gpu_id=gpu_id, reservation=r)
    unheld = GpuUsageHour.objects.get(gpu_id=gpu_id, reservation__isnull=True)
    assert held.project == proj and held.held_s == pytest.approx(1800)
    assert held.idle_s == pytest.approx(20 * 60)
    assert held.util_mean == pytest.approx((20 * 2 + 10 * 80) / 30)
    assert held.minutes == 30 and unheld.minutes == 30 and unheld.project is None
    assert unheld.util_mean == pytest.approx(90.0)


def test_held_gpu_with_no_telemetry_still_counts_its_held_time(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 11:00"))
    rollup_hour(hour=at("2025-03-10 10:00"), upto=at("2025-03-10 12:00"))
    row = GpuUsageHour.objects.get(reservation=r)
    assert row.held_s == pytest.approx(3600) and row.minutes == 0 and row.util_mean is None and row.idle_s == 0


def test_rollup_is_idempotent_and_keeps_a_watermark(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 12:00"))
    telemetry(r.allocations.get().gpu_id, at("2025-03-10 10:00"), 120, util=40.0)
    assert rollup_pending(now=at("2025-03-10 12:05")) == 3  # 10:00, 11:00 and the 12:00 hour so far
    first = list(GpuUsageHour.objects.order_by("hour").values())
    assert RollupWatermark.objects.get().position == at("2025-03-10 12:00")
    assert rollup_pending(now=at("2025-03-10 12:05")) == 1  # only the hour still filling is redone

    RollupWatermark.objects.update(position=at("2025-03-10 10:00"))
    rollup_pending(now=at("2025-03-10 12:05"))
    again = list(GpuUsageHour.objects.order_by("hour").values())
    assert [{k: v for k, v in row.items() if k != "id"} for row in again] == [
        {k: v for k, v in row.items() if k != "id"} for row in first
    ]


def test_an_hour_still_filling_is_redone_until_it_is_complete(proj, model, rack):  # type: ignore[no-untyped-def]
    gpu = rack.gpus.first()
    telemetry(gpu.pk, at("2025-03-10 10:00"), 20, util=10.0)
    rollup_pending(now=at("2025-03-10 10:25"))  # cut at 10:23
    assert RollupWatermark.objects.get().position == at("2025-03-10 10:00")
    assert GpuUsageHour.objects.get(gpu=gpu).minutes == 20
    telemetry(gpu.pk, at("2025-03-10 10:20"), 40, util=10.0)
    rollup_pending(now=at("2025-03-10 11:05"))
    assert GpuUsageHour.objects.get(gpu=gpu).minutes == 60
    assert RollupWatermark.objects.get().position == at("2025-03-10 11:00")


def test_report_shows_idle_hours_energy_and_flags_low_utilization(proj, model, rack):  # type: ignore[no-untyped-def]
    r = book(proj, model, at("2025-03-10 10:00"), at("2025-03-10 12:00"), count=2)
    ran(r, at("2025-03-10 10:00"), at("2025-03-10 12:00"))
    finish(r, ended_at=at("2025-03-10 12:00"))
    busy, lazy = r.allocations.order_by("gpu_id").values_list("gpu_id", flat=True)
    telemetry(busy, at("2025-03-10 10:00"), 120, util=95.0, power_w=600.0)
    telemetry(lazy, at("2025-03-10 10:00"), 120, util=1.0, power_w=60.0)
    rollup_pending(now=at("2025-03-10 13:00"))

    report = project_report(project=proj, start=at("2025-03-10"), end=at("2025-03-11"), group_by="gpu_model")
    row = report.as_dict()["totals"]
    assert row["booked_gpu_hours"] == pytest.approx(4) and row["used_gpu_hours"] == pytest.approx(4)
    assert row["idle_gpu_hours"] == pytest.approx(2)
    assert row["util_mean_percent"] == pytest.approx(48.0)
    assert row["low_utilization"] is True
    assert row["energy_kwh"] == pytest.approx((600 + 60) * 2 / 1000)
    assert [x["key"] for x in report.as_dict()["rows"]] == ["H100-80GB"]

    fleet = fleet_report(start=at("2025-03-10"), end=at("2025-03-11"), group_by="project").as_dict()
    assert {x["key"] for x in fleet["rows"]} == {proj.slug}
    series = timeseries(start=at("2025-03-10"), end=at("2025-03-11"), bucket="hour", project=proj)
    assert [p["at"] for p in series] == ["2025-03-10T10:00:00+00:00", "2025-03-10T11:00:00+00:00"]
    assert series[0]["held_gpu_hours"] == pytest.approx(2) and series[0]["idle_gpu_hours"] == pytest.approx(1)
