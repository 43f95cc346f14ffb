"""On PostgreSQL the search past "now" for a count that fits one server costs the same three queries
whatever the fleet holds, and answers with the later of two back-to-back holds on a full server."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.inventory.models import Gpu
from controlplane.reservations.specs import GpuSpec
from controlplane.reservations.windows import earliest_window
from tests.reservations.fleet import gpu_model, hold, server

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


@pytest.mark.parametrize("servers", [1, 6])
def test_a_full_day_window_is_found_after_the_last_hold_in_three_queries(servers: int) -> None:
    model = gpu_model()
    now = timezone.now()
    for _ in range(servers):
        srv = server(model, gpus=4)
        for gpu in Gpu.objects.filter(server=srv):
            # Short gaps between the holds: a day-long window fits only after the second one.
            hold(gpu, now - timedelta(hours=1), now + timedelta(hours=5))
            hold(gpu, now + timedelta(hours=7), now + timedelta(hours=30 + gpu.index))
    spec = GpuSpec(gpu_model_id=model.pk, gpu_count=4)

    with CaptureQueriesContext(connection) as queries:
        found = earliest_window(spec, duration=timedelta(days=1), within=timedelta(days=3), now=now)

    assert found is not None
    window, gpus = found
    assert window.starts_at == now + timedelta(hours=33)  # the last GPU's hold ends then
    assert len(gpus) == 4
    assert len(queries) == 3  # "now", the search, the topology of the shortlisted servers


def test_a_window_longer_than_any_gap_is_none_when_the_holds_reach_past_the_horizon() -> None:
    model = gpu_model()
    now = timezone.now()
    srv = server(model, gpus=2)
    for gpu in Gpu.objects.filter(server=srv):
        hold(gpu, now, now + timedelta(hours=10))
        hold(gpu, now + timedelta(hours=12), now + timedelta(days=5))
    spec = GpuSpec(gpu_model_id=model.pk, gpu_count=1)

    assert earliest_window(spec, duration=timedelta(hours=4), within=timedelta(days=2), now=now) is None
    found = earliest_window(spec, duration=timedelta(hours=2), within=timedelta(days=2), now=now)
    assert found is not None and found[0].starts_at == now + timedelta(hours=10)
