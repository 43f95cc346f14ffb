"""DCGM's profiling fields through the heartbeat: folded into the minute rows (their own counts, so a GPU
without them is null, not zero), rolled into the hour, and refused out of range naming the reading."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from controlplane.accounting.models import GpuUsageHour
from controlplane.accounting.rollup import rollup_hour
from controlplane.fleet.models import GpuTelemetryMinute
from nodeagent import schema
from tests.fleet.helpers import T0, gpu_uuid, heartbeat, ingest

pytestmark = pytest.mark.django_db

HOPPER = {schema.PROF_SM_ACTIVE: 0.6, schema.PROF_PIPE_TENSOR_ACTIVE: 0.3, schema.PROF_DRAM_ACTIVE: 0.45}


def test_profiling_fields_fold_into_minutes_and_hours_and_stay_null_without_them(node: Any) -> None:
    server = node[0]
    with_gpm, without = gpu_uuid("node-a", 0), gpu_uuid("node-a", 1)
    ingest(server, heartbeat("node-a", samples_per_gpu=4, fields={with_gpm: HOPPER}))
    # A second heartbeat in the same minute adds to the same row.
    later = {with_gpm: {**HOPPER, schema.PROF_SM_ACTIVE: 1.0}}
    ingest(server, heartbeat("node-a", seq=2, samples_per_gpu=2, start=T0 + timedelta(seconds=10), fields=later))
    rows = {row.gpu.uuid: row for row in GpuTelemetryMinute.objects.select_related("gpu")}
    hot, cold = rows[with_gpm], rows[without]
    assert hot.sm_active_samples == 6 and hot.sm_active_avg == pytest.approx((0.6 * 4 + 1.0 * 2) / 6)
    assert hot.tensor_active_avg == pytest.approx(0.3) and hot.dram_active_avg == pytest.approx(0.45)
    assert cold.samples == 6 and cold.sm_active_samples == 0 and cold.sm_active_avg is None
    hour = T0.replace(minute=0, second=0, microsecond=0)
    rollup_hour(hour=hour, upto=hour + timedelta(hours=1))
    hours = {h.gpu.uuid: h for h in GpuUsageHour.objects.select_related("gpu")}
    assert hours[with_gpm].sm_active_mean == pytest.approx(hot.sm_active_avg)
    assert hours[without].sm_active_mean is None and hours[without].tensor_active_mean is None


def test_a_profiling_ratio_out_of_range_is_a_400_naming_it_and_stores_nothing(agent: APIClient, node: Any) -> None:
    body = heartbeat("node-a", samples_per_gpu=2, fields={gpu_uuid("node-a", 0): {schema.PROF_SM_ACTIVE: 0.5}})
    # Built valid (the agent's own code validates too), then spoilt as a faulty agent would send it.
    sample = body["samples"][0]
    column = sample["fields"][schema.PROF_SM_ACTIVE]
    if isinstance(column, list):
        column[1] = 1.5
    else:
        sample["fields"][schema.PROF_SM_ACTIVE] = 1.5
    response = agent.post("/api/v1/agent/heartbeat", body, format="json")
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert any(schema.PROF_SM_ACTIVE in path for path in fields), fields
    assert not GpuTelemetryMinute.objects.exists()
